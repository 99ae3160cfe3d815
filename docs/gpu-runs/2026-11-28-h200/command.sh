#!/usr/bin/env bash
# The first two calls of this run, from the repository root, with the GPU
# bundle of a1333c9 (`make gpu-bundle`; ztier-base built from 7e35a5b)
# carried; its run-gpu.sh was the working tree's, with ZT_BENCH_DEADLINE
# (382738a). The third call is third-call/ab.sh.
# Files at the top of this folder: the first call; second-call/: the second,
# after bench device's data was mended (its second moments were negative).

# First call (319 s): run-gpu.sh with its pieces bounded, then a 4Gi step.
export ZT_BENCH_DEADLINE=370 ZT_BENCH_TIMEOUT=60 ZT_TEST_TIMEOUT=150 ZT_SANITIZER_TIMEOUT=100 \
  ZT_BENCH_ADAM_ARGS="--params 100M --reps 3" \
  ZT_BENCH_OFFLOAD_ARGS="--params 200M --ram-budget 2Gi --disk-bytes 512Mi --steps 3"
bash build-gpu-bundle/run-gpu.sh $OUT
( /usr/bin/time -v timeout 150 build-gpu-bundle/ztier bench step --backend cuda --params 4Gi \
    --optimizer-tier host --steps 3 --json >$OUT/scale.json ) 2>$OUT/scale.err

# Second call (124 s): bench device with the mended data, and a 2Gi step.
B=build-gpu-bundle
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))')
timeout 120 $B/ztier bench device --params 268435456 --reps 7 --backend cuda --json \
  >$OUT/device.json 2>$OUT/device.err
( /usr/bin/time -v timeout 200 $B/ztier bench step --backend cuda --params 2Gi \
    --optimizer-tier host --steps 3 --json >$OUT/scale.json ) 2>>$OUT/scale.err

#!/usr/bin/env bash
# command.sh OUT: env, the suites on cuda in 4 parallel groups,
# compute-sanitizer beside them, then the step and stage3 benches;
# everything into OUT/all.tar.gz. (It ran from inside the GPU bundle;
# scripts/run-gpu.sh now does the same.)
set -u
B=$(cd "$(dirname "$0")" && pwd); O=$1; W=$O/w; mkdir -p $W
d=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
[ -n "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 60 bash $B/run-gpu.sh $W/env env > $W/env.out 2>&1
ldd $B/ztier > $W/ldd.txt 2>&1; ldd $B/tests/test_cuda >> $W/ldd.txt 2>&1
cd $B
i=0
for g in "test_cuda test_api test_badinput test_budget test_device_select test_in_place test_leftovers" \
         "test_zero" "test_ckpt test_charlm_resume test_cli test_comm test_cpu_kernels test_opt_nvme" \
         "test_plan test_pool test_prefetch test_rank_faults test_states test_step test_tier test_train_loop"; do
  i=$((i+1))
  (ZT_TEST_FILTER="$g" ZT_TEST_BACKEND=cuda ZT_TEST_TIMEOUT=120 timeout -k 5 210 bash run-tests.sh . > $W/suites-$i.txt 2>&1; echo "rc=$?" >> $W/suites-$i.txt) &
done
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for t in memcheck racecheck synccheck; do
  (ZT_TEST_BACKEND=cuda CMOCKA_MESSAGE_OUTPUT=TAP timeout -k 5 180 $cs --tool $t --error-exitcode 9 tests/test_cuda > $W/san-$t.log 2>&1; echo "rc=$?" >> $W/san-$t.log) &
done
(ZT_TEST_BACKEND=cuda CMOCKA_MESSAGE_OUTPUT=TAP timeout -k 5 180 $cs --tool memcheck --error-exitcode 9 tests/test_prefetch > $W/san-memcheck-prefetch.log 2>&1; echo "rc=$?" >> $W/san-memcheck-prefetch.log) &
wait
mkdir -p /tmp/zb
for b in "step --backend cuda --steps 7" "step --backend cuda --optimizer-tier device --steps 7" "step --backend cuda --stage 2 --optimizer-tier device --steps 7" "step --backend cuda --stage 3 --steps 7" "step --backend cuda --params 256Mi --steps 5" "stage3 --backend cuda --param-tier host"; do
  [ $SECONDS -gt 400 ] && { echo "skipped (time): $b" >> $W/bench-skipped.txt; continue; }
  n=$(echo $b | tr ' ' _ | tr -d -)
  timeout -k 5 40 ./ztier bench $b --json > $W/bench-$n.json 2> $W/bench-$n.err; echo "rc=$?" >> $W/bench-$n.err
done
./ztier plan --params 4Mi --backend cuda > $W/plan.txt 2>&1
cp -r tests/logs $W/suite-logs 2>/dev/null
tar -C $O -czf $O/all.tar.gz w && rm -rf $W
ls -la $O

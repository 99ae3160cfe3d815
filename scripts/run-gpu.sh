#!/usr/bin/env bash
# run-gpu.sh OUT [PART...] — the GPU bundle's runner (make gpu-bundle copies
# scripts/run-gpu.sh into the bundle): on a machine with a GPU, runs what the
# bundle holds and writes what it saw to the folder OUT, in six files:
#   summary.txt    one line per part and the verdict ("run-gpu.sh: ok" or FAILED)
#   env.txt        the machine: date, kernel, glibc, CPUs, memory, nvidia-smi, the
#                  PCIe link, CUDA runtime and driver, NCCL, ztier version, BUILD-INFO
#   suites.txt     every test suite on the cuda backend (the copy of tests/run.sh)
#                  and which cases skipped, and why
#   sanitizer.txt  compute-sanitizer's memcheck, racecheck and synccheck on test_cuda
#                  and on test_prefetch (the copy, prefetch and loop streams)
#   bench.json     every benchmark of `ztier bench --help`, run with --json; each
#                  `bench step` beside the baseline's (ztier-base, where the bundle
#                  has one: "step.base", "step.2.base", ...), in turns
#   logs.tar.gz    every log: one per suite, per sanitizer tool, per benchmark
# PARTs: env, suites, sanitizer, bench (default: all four, in that order); a
# run too long for one call can be split into calls of fewer parts.
#
# On a machine with a GPU a skipped case is a failure, except one that says
# "built without MPI" or "no mpirun" (the bundle has no MPI; the multi-rank
# suites run on the host backend with MPI, in make test), or "runs
# elsewhere" (a case of the host pass, or of a machine without a GPU).
# Without a GPU, skips are reported and not counted.
#
# Environment: ZT_NCCL_LIB (the folder of libnccl.so.2, if it is not found),
# ZT_GPU_JOBS (groups of suites run at once, default 4; the sanitizer runs
# beside them), ZT_TEST_TIMEOUT (s per suite, default 300), ZT_SANITIZER_TIMEOUT (s per tool,
# default 180), ZT_BENCH_TIMEOUT (s per benchmark, default 180), ZT_BENCH_DIR
# (scratch for the disk benchmarks, default /tmp/ztier-bench),
# ZT_BENCH_<NAME>_ARGS (a benchmark's flags instead of the defaults below),
# ZT_DEVICE_PARAMS (bench device's size and its PyTorch peer's, default 256Mi),
# ZT_BENCH_DEADLINE (s since the start after which no further benchmark
# starts; each one left out is named in summary.txt; default none).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run-gpu.sh OUT [env] [suites] [sanitizer] [bench]}
shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(env suites sanitizer bench)
for p in "${parts[@]}"; do
  case "$p" in env | suites | sanitizer | bench) ;; *)
    echo "run-gpu.sh: part \"$p\"; expected env, suites, sanitizer or bench" >&2
    exit 2
    ;;
  esac
done
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd)
logs="$out/logs"
summary="$out/summary.txt"
: >"$summary"
# The parts that failed, one a line (a file: the sanitizer part runs in a
# subshell beside the suites).
failed="$out/failed-parts"
: >"$failed"
note() { echo "$*" | tee -a "$summary"; }
# The benchmark runs ZT_BENCH_DEADLINE left out (past_deadline), for the
# verdict too.
late=()
fail_part() {
  echo "$1" >>"$failed"
  shift
  note "$*"
}

gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu=1

# ---- NCCL: the machine's libnccl.so.2 ----------------------------------------
# The binaries link it; it is not in the bundle (over 200 MB). First what the
# caller names, then the loader's cache, then PyTorch's (pip's nvidia-nccl),
# then any site-packages.
find_nccl() {
  local d
  if [ -n "${ZT_NCCL_LIB:-}" ]; then
    echo "$ZT_NCCL_LIB"
    return
  fi
  if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    echo system
    return
  fi
  d=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
    2>/dev/null)
  if [ -n "$d" ] && [ -f "$d/libnccl.so.2" ]; then
    echo "$d"
    return
  fi
  d=$(find / -xdev -path '*site-packages*' -name libnccl.so.2 2>/dev/null | head -1)
  [ -n "$d" ] && dirname "$d"
}
nccl_dir=$(find_nccl)
case "$nccl_dir" in
"") nccl_where="not found (set ZT_NCCL_LIB to its folder)" ;;
system) nccl_where="the loader's cache: $(ldconfig -p | awk '/libnccl\.so\.2 / { print $NF; exit }')" ;;
*)
  export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nccl_where="$nccl_dir/libnccl.so.2"
  ;;
esac
missing=$(ldd "$here/ztier" 2>&1 | grep 'not found')
if [ -n "$missing" ]; then
  fail_part env "libraries: ztier cannot load: $(echo "$missing" | tr -s ' \t\n' ' ')"
fi

# ---- env ------------------------------------------------------------------------
run_env() {
  local f="$out/env.txt"
  {
    echo "== date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "== kernel: $(uname -srm)"
    echo "== glibc: $(ldd --version 2>&1 | head -1)"
    echo "== cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
    echo "== memory: $(free -g | awk '/^Mem:/ { print $2 " GiB" }')"
    echo "== libnccl.so.2: $nccl_where"
    echo "== gpu-info (the bundle's CUDA runtime)"
    "$here/gpu-info" 2>&1
    echo "== ztier version"
    "$here/ztier" version 2>&1
    "$here/ztier" version --json 2>&1
    echo "== nvidia-smi"
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
      --format=csv 2>&1
    echo "== nvidia-smi -q: the PCIe link"
    nvidia-smi -q 2>&1 | sed -n '/GPU Link Info/,/Replays Since Reset\|Tx Throughput/p'
    echo "== compute-sanitizer: $(sanitizer_path || echo none)"
    echo "== BUILD-INFO"
    cat "$here/BUILD-INFO" 2>&1
  } >"$f" 2>&1
  nvidia-smi -q >"$logs/nvidia-smi-q.txt" 2>&1
  note "env: $(grep -m1 '^device 0:' "$f" || echo "no device (gpu-info: $(grep -m1 '^devices:' "$f"))");" \
    "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1);" \
    "$(grep -m1 '^cuda_runtime_version' "$f")"
}

# ---- suites -------------------------------------------------------------------
# Each skipped case with the last "skipped:" sentence printed before it,
# and its kind: "mpi" (a "built without MPI" or "no mpirun" anywhere in that
# stretch), "elsewhere" (T_SKIP_ELSEWHERE's "runs elsewhere") or "other".
skips_of() {
  awk -v suite="$1" '
    BEGIN { kind = "other" }
    /^(ok|not ok) [0-9]+/ && !/# SKIP/ { why = ""; kind = "other"; next }
    /skipped:/ { w = $0; sub(/^.*skipped: */, "", w); why = w }
    /skipped: runs elsewhere/ && kind == "other" { kind = "elsewhere" }
    /built without MPI|skipped: no mpirun/ { kind = "mpi" }
    /^not ok [0-9]+ .*# SKIP/ || /^not ok [0-9]+ # SKIP/ {
      printf "%s %s\t%s\t%s\n", suite, $0, kind,
        (why == "" ? "(no reason printed)" : why)
      why = ""; kind = "other"
    }' "$2"
}

# The suites in ZT_GPU_JOBS groups (default 4), one line each of
# run-tests.sh filter words (=name), dealt out by name.
suite_groups() {
  find "$here/tests" -maxdepth 1 -type f -name 'test_*' -printf '=%f\n' | sort |
    awk -v jobs="${ZT_GPU_JOBS:-4}" '{ g[(NR - 1) % jobs] = g[(NR - 1) % jobs] " " $0 }
      END { for (i = 0; i < jobs; i++) if (g[i] != "") print substr(g[i], 2) }'
}

# The groups at once (the GPU machine's time is short and its CPUs many),
# then one report: each group's lines, and the sum of their last lines.
run_suites() {
  local f="$out/suites.txt" rc=0 skips other mpi elsewhere whole g i=0 pids=()
  case "${ZT_GPU_JOBS:-4}" in
  '' | *[!0-9]* | 0)
    fail_part suites "suites: ZT_GPU_JOBS is \"$ZT_GPU_JOBS\"; expected a number of groups >= 1"
    return
    ;;
  esac
  rm -rf "$here/tests/logs"
  while read -r g; do
    i=$((i + 1))
    ZT_TEST_FILTER="$g" ZT_TEST_BACKEND=cuda ZT_TEST_TIMEOUT=${ZT_TEST_TIMEOUT:-300} \
      bash "$here/run-tests.sh" "$here" >"$out/suites-$i.part" 2>&1 &
    pids+=($!)
  done < <(suite_groups)
  for g in "${pids[@]}"; do wait "$g" || rc=1; done
  # A group whose last line is not its tally (it died) fails the part.
  for g in "$out"/suites-*.part; do
    tail -n 1 "$g" | grep -qE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' || rc=1
  done
  {
    for g in "$out"/suites-*.part; do sed '$d' "$g"; done
    tail -qn 1 "$out"/suites-*.part | awk '/passed, .* failed, .* skipped$/ {
        p += $1; f += $3; s += $5 }
      END { printf "%d passed, %d failed, %d skipped\n", p, f, s }'
  } >"$f"
  rm -f "$out"/suites-*.part
  mkdir -p "$logs/suites"
  [ -d "$here/tests/logs" ] && mv "$here/tests/logs"/* "$logs/suites/" 2>/dev/null
  rm -rf "$here/tests/logs"
  skips=$(for l in "$logs"/suites/*.log; do
    [ -f "$l" ] && skips_of "$(basename "$l" .log)" "$l"
  done)
  local total
  total=$(tail -1 "$f")
  mpi=$(printf '%s\n' "$skips" | grep -c $'\tmpi\t')
  elsewhere=$(printf '%s\n' "$skips" | grep -c $'\telsewhere\t')
  other=$(printf '%s\n' "$skips" | grep -c $'\tother\t')
  # Suites skipped as a whole (exit 77), as the copy of tests/run.sh reports them.
  whole=$(grep -cE '^test_[^ ]*( \[[a-z]+\])? +SKIP ' "$f")
  {
    echo
    echo "== skipped cases (suite, TAP line, kind, reason)"
    printf '%s\n' "$skips" | grep -v '^$' | sed 's/^/  /'
  } >>"$f"
  if [ "$gpu" -eq 1 ] && [ $((other + whole)) -gt 0 ]; then
    fail_part suites "suites: $total; FAILED: $other case(s) and $whole suite(s) skipped on a" \
      "machine with a GPU (suites.txt lists them); $mpi case(s) skipped for MPI, $elsewhere" \
      "as run elsewhere"
  elif [ "$rc" -ne 0 ]; then
    fail_part suites "suites: $total; FAILED (suites.txt)"
  else
    note "suites: $total; $mpi case(s) skipped for MPI, $elsewhere as run elsewhere, $other" \
      "for other reasons, $whole suite(s) as a whole$([ "$gpu" -eq 0 ] && echo " (no GPU here: skips not counted)")"
  fi
}

# ---- compute-sanitizer ----------------------------------------------------------
sanitizer_path() {
  local p
  p=$(command -v compute-sanitizer 2>/dev/null) ||
    p=$(ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
      /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$p" ] && [ -x "$p" ] && echo "$p"
}

# test_cuda provokes two CUDA errors on purpose (a cudaMalloc of 4 PiB, a
# second cudaHostRegister of one range) and checks the ztier errors they
# become; every other failed CUDA call becomes a ztier error that fails a
# case. So the tools do not report API errors (--report-api-errors no):
# they would count those two.
run_sanitizer() {
  local f="$out/sanitizer.txt" cs tool rc extra line suite log cases
  : >"$f"
  cs=$(sanitizer_path)
  if [ -z "$cs" ]; then
    echo "compute-sanitizer: not found on this machine" >>"$f"
    note "sanitizer: compute-sanitizer not found; not run"
    return
  fi
  local bad=()
  for suite in test_cuda test_prefetch; do
    for tool in memcheck racecheck synccheck; do
      extra=(--report-api-errors no)
      [ "$tool" = memcheck ] && extra+=(--leak-check full)
      log="$logs/sanitizer-$tool-$suite.log"
      ZT_TEST_BACKEND=cuda CMOCKA_MESSAGE_OUTPUT=TAP timeout --kill-after=10 \
        "${ZT_SANITIZER_TIMEOUT:-180}" "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 9 \
        "$here/tests/$suite" >"$log" 2>&1
      rc=$?
      line=$(grep -m1 'SUMMARY' "$log" || echo "no SUMMARY line")
      cases=$(grep -cE '^ok [0-9]+' "$log")
      echo "$tool: exit $rc; $line; $suite: $cases case(s) ok" >>"$f"
      # A run that tested nothing (skipped: no GPU) is not a clean bill.
      if [ "$rc" -ne 0 ] || { [ "$gpu" -eq 1 ] && [ "$cases" -eq 0 ]; }; then
        bad+=("$tool on $suite")
        grep -E 'ERROR|Invalid|Race|Barrier|not ok|skipped' "$log" |
          head -20 | sed 's/^/    /' >>"$f"
      fi
    done
  done
  if [ ${#bad[@]} -gt 0 ]; then
    fail_part sanitizer "sanitizer: FAILED: ${bad[*]} (sanitizer.txt)"
  else
    note "sanitizer: memcheck, racecheck and synccheck clean on test_cuda and test_prefetch"
  fi
}

# ---- benchmarks ----------------------------------------------------------------
# Flags for the ones known today, sized for a few minutes in all, one line
# a run (step runs each tier, and the device tier at every stage); a new one
# gets --json, --path when it takes one, and --backend cuda when it has it.
bench_args() {
  local name=$1 help=$2 var args
  var="ZT_BENCH_$(echo "$name" | tr 'a-z-' 'A-Z_')_ARGS"
  if [ -n "${!var:-}" ]; then
    args=${!var}
  else
    case "$name" in
    adam) args="--params 200M --reps 5" ;;
    device) args="--params $device_params --reps 7" ;;
    nvme) args="--size 1GiB" ;;
    offload) args="--params 500M --ram-budget 2Gi --disk-bytes 1Gi --steps 3" ;;
    step)
      args="--steps 7 --optimizer-tier host
--steps 7 --optimizer-tier device
--steps 7 --optimizer-tier device --stage 2
--steps 7 --optimizer-tier device --stage 2 --grads-once 1
--steps 7 --optimizer-tier device --stage 2 --grads-once 1 --grads-in-place 1
--steps 7 --optimizer-tier device --stage 3
--steps 7 --stage 3 --param-tier host
--steps 5 --optimizer-tier host --params 256Mi
--steps 5 --optimizer-tier device --params 256Mi"
      ;;
    *) args="" ;;
    esac
  fi
  while IFS= read -r line; do
    grep -q -- '--backend' <<<"$help" && [[ "$line" != *--backend* ]] && line+=" --backend cuda"
    grep -q -- '--path' <<<"$help" && [[ "$line" != *--path* ]] && line+=" --path $bench_dir/$name"
    echo "$line --json"
  done <<<"$args"
}

# True, and the run named among those left out, once ZT_BENCH_DEADLINE
# seconds have passed since run-gpu.sh started: a call's time on the GPU
# machine is bounded, and what ran must still reach bench.json.
past_deadline() {
  [ -n "${ZT_BENCH_DEADLINE:-}" ] && [ "$SECONDS" -ge "$ZT_BENCH_DEADLINE" ] || return 1
  late+=("$1")
}

# A peer's run beside ztier's, into bench.json as `name`: run_peer NAME
# COMMAND... (run_bench's ran and bad take it in).
run_peer() {
  local run=$1 rc
  shift
  past_deadline "$run" && return
  echo "${*#"$here/"}" >"$logs/bench/$run.args"
  timeout --kill-after=10 "${ZT_BENCH_TIMEOUT:-180}" "$@" >"$logs/bench/$run.json" \
    2>"$logs/bench/$run.log" </dev/null
  rc=$?
  echo "$rc" >"$logs/bench/$run.rc"
  ran+=("$run")
  [ "$rc" -eq 0 ] || bad+=("$run (exit $rc)")
}

# One run of a benchmark: run_one RUN BINARY NAME ARGS (the binary is
# ztier or ztier-base; run_bench's ran and bad take it in, a baseline's
# failure only as a note: an older tool may lack a flag).
run_one() {
  local run=$1 bin=$2 name=$3 args=$4 rc
  past_deadline "$run" && return
  rm -rf "${bench_dir:?}/$name" && mkdir -p "$bench_dir/$name"
  echo "$(basename "$bin") bench $name $args" >"$logs/bench/$run.args"
  # shellcheck disable=SC2086
  timeout --kill-after=10 "${ZT_BENCH_TIMEOUT:-180}" "$bin" bench "$name" $args \
    >"$logs/bench/$run.json" 2>"$logs/bench/$run.log" </dev/null
  rc=$?
  echo "$rc" >"$logs/bench/$run.rc"
  rm -rf "${bench_dir:?}/$name"
  ran+=("$run")
  if [ "$rc" -ne 0 ]; then
    case "$run" in
    *.base) base_bad+=("$run (exit $rc)") ;;
    *) bad+=("$run (exit $rc)") ;;
    esac
  fi
}

run_bench() {
  local names name help args rc bad=() ran=() base_bad=()
  case "${ZT_BENCH_DEADLINE:-0}" in *[!0-9]* | ??????????*)
    fail_part bench "bench: ZT_BENCH_DEADLINE is \"$ZT_BENCH_DEADLINE\"; expected seconds" \
      "(a whole number below 10^9)"
    return
    ;;
  esac
  bench_dir=${ZT_BENCH_DIR:-/tmp/ztier-bench}
  # bench device's size, and its peer's (torch-adamw.py) the same.
  device_params=${ZT_DEVICE_PARAMS:-268435456}
  names=$("$here/ztier" bench --help 2>&1 | awk '/^benchmarks:/ { on = 1; next } on && NF { print $1 }')
  mkdir -p "$logs/bench"
  local run k
  for name in $names; do
    help=$("$here/ztier" bench "$name" --help 2>&1)
    k=0
    while IFS= read -r args; do
      # Each run its own name: the benchmark's, then .2, .3, ... for more.
      k=$((k + 1))
      run=$name
      [ "$k" -gt 1 ] && run=$name.$k
      # `bench step` beside the baseline's (ztier-base, when the bundle has
      # one: <run>.base), the two in turns, which goes first alternating.
      if [ "$name" = step ] && [ -x "$here/ztier-base" ]; then
        # The pair whole or not at all: one of it alone compares nothing.
        if past_deadline "$run"; then
          late+=("$run.base")
        elif [ $((k % 2)) -eq 1 ]; then
          run_one "$run.base" "$here/ztier-base" "$name" "$args"
          run_one "$run" "$here/ztier" "$name" "$args"
        else
          run_one "$run" "$here/ztier" "$name" "$args"
          run_one "$run.base" "$here/ztier-base" "$name" "$args"
        fi
      else
        run_one "$run" "$here/ztier" "$name" "$args"
      fi
    done < <(bench_args "$name" "$help")
  done
  # The limit of bench device's link rows: the CUDA runtime's copies from
  # cudaMallocHost memory, as many bytes (bench device's --link-bytes).
  run_peer cuda_memcpy "$here/gpu-info" copy-limit 268435456 7
  # The peer of bench device's fp32 AdamW row: PyTorch's fused AdamW on the
  # same number of parameters, where the machine's python3 has torch.
  if python3 -c 'import torch' 2>/dev/null; then
    run_peer torch_adamw python3 "$here/torch-adamw.py" "$device_params" 7
  fi
  # One JSON object: each benchmark's command, exit status and result (its
  # --json object, or null with the end of its error output).
  python3 - "$logs/bench" ${ran[@]+"${ran[@]}"} >"$out/bench.json" <<'EOF'
import json, os, sys
d, names = sys.argv[1], sys.argv[2:]
res = {}
for n in names:
    rd = lambda ext: open(os.path.join(d, n + ext), errors="replace").read()
    e = {"command": rd(".args").strip(), "exit": int(rd(".rc").strip() or -1)}
    try:
        e["result"] = json.loads(rd(".json"))
    except ValueError:
        e["result"] = None
        e["output"] = rd(".json")[-2000:]
    e["stderr"] = rd(".log")[-2000:]
    res[n] = e
json.dump(res, sys.stdout, indent=1)
print()
EOF
  [ ${#late[@]} -gt 0 ] && note "bench: left out at ZT_BENCH_DEADLINE=${ZT_BENCH_DEADLINE}s: ${late[*]}"
  [ ${#base_bad[@]} -gt 0 ] && note "bench: the baseline (ztier-base) failed: ${base_bad[*]}"
  if [ ${#bad[@]} -gt 0 ]; then
    fail_part bench "bench: ran ${ran[*]:-none}; FAILED: ${bad[*]} (bench.json)"
  else
    note "bench: ran ${ran[*]:-none} (bench.json)"
  fi
}

# The sanitizer runs beside the suites when both are asked for: the GPU
# machine's time is short, and a GPU takes several processes at once.
beside=0
[[ " ${parts[*]} " == *" suites "* && " ${parts[*]} " == *" sanitizer "* ]] && beside=1
for p in "${parts[@]}"; do
  if [ "$p" = suites ] && [ "$beside" -eq 1 ]; then
    run_sanitizer &
    sanitizer_pid=$!
    run_suites
    wait "$sanitizer_pid"
  elif [ "$p" != sanitizer ] || [ "$beside" -eq 0 ]; then
    "run_$p"
  fi
done

tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
failed_parts=$(tr '\n' ' ' <"$failed" | sed 's/ $//')
rm -f "$failed"
if [ -n "$failed_parts" ]; then
  note "run-gpu.sh: FAILED ($failed_parts); logs in logs.tar.gz"
  exit 1
fi
note "run-gpu.sh: ok ($([ "$gpu" -eq 1 ] && echo "on a GPU" || echo "no GPU here")$(
  [ ${#late[@]} -gt 0 ] && echo "; ${#late[@]} benchmark run(s) left out at the deadline"))"

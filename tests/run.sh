#!/usr/bin/env bash
# tests/run.sh BUILD_DIR [BACKEND...] — runs every test executable in
# BUILD_DIR/tests, each under a timeout, once per backend named (host, sim or
# cuda; default: ZT_TEST_BACKEND, else host), tallies the cmocka test cases
# they report (TAP) over every pass, and ends with one line: "N passed, N
# failed, N skipped".
#
# A test executable exits 0 (all passed), 1 (a failure) or 77 (skipped as a
# whole, e.g. "skipped: no GPU"). One that crashes or times out counts as one
# failure. On the cuda backend, on a machine that has a GPU, an executable
# that skips as a whole counts as one failure too: there, a GPU suite that
# skips has tested nothing, and "0 failed" would say otherwise.
#
# Each pass sets ZT_TEST_BACKEND for its executables. A suite whose source
# (tests/<name>.c) never asks the harness for a backend (t_config, t_engine,
# t_backend) runs the same code on every backend: it runs in the first pass
# only. Logs are kept in BUILD_DIR/tests/logs/: <name>.log on host,
# <name>.<backend>.log on the others.
#
# Environment: ZT_TEST_TIMEOUT (seconds per executable, default 900),
# ZT_TEST_FILTER (substrings of the names to run, space-separated; a test runs
# when its name contains any of them, or is one written =name), ZT_TEST_BACKEND (the backend when none
# is named), ZT_TEST_GPU_PRESENT (1 or 0: whether this machine has a GPU;
# default: nvidia-smi -L lists one, or /dev/nvidia0 exists).
set -u
build=${1:?usage: tests/run.sh BUILD_DIR [BACKEND...]}
shift
backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=("${ZT_TEST_BACKEND:-host}")
timeout_s=${ZT_TEST_TIMEOUT:-900}
filter=${ZT_TEST_FILTER:-}
logs="$build/tests/logs"
src_dir=$(dirname "$0")
mkdir -p "$logs"

export CMOCKA_MESSAGE_OUTPUT=TAP
# The static CUDA runtime maps memory where ASan keeps its shadow gap.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

gpu_present() {
  case "${ZT_TEST_GPU_PRESENT:-}" in
  1) return 0 ;;
  0) return 1 ;;
  esac
  [ -e /dev/nvidia0 ] && return 0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' &&
    return 0
  return 1
}

# 1 when the suite's source asks the harness for the backend (or cannot be
# found: then it runs on every backend, to be safe).
uses_backend() {
  local src
  for src in "$src_dir/$1.c" "$src_dir/$1.cu"; do
    [ -f "$src" ] || continue
    grep -qE '\bt_(config|engine|backend)\(' "$src"
    return $?
  done
  return 0
}

passed=0 failed=0 skipped=0
failed_names=() skipped_names=()
pass=0
for backend in "${backends[@]}"; do
  pass=$((pass + 1))
  # On cuda with a GPU at hand, a suite skipped as a whole is a failure.
  skip_fails=0
  [ "$backend" = cuda ] && gpu_present && skip_fails=1
  for t in "$build"/tests/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case "$t" in *.o|*.d) continue ;; esac
    name=$(basename "$t")
    if [ -n "$filter" ]; then
      keep=0
      for word in $filter; do
        case "$word" in
        =*) [ "$name" = "${word#=}" ] && keep=1 ;;
        *) [[ "$name" == *"$word"* ]] && keep=1 ;;
        esac
      done
      [ "$keep" -eq 1 ] || continue
    fi
    [ "$pass" -gt 1 ] && ! uses_backend "$name" && continue
    label=$name log="$logs/$name.log"
    if [ "$backend" != host ]; then
      label="$name [$backend]" log="$logs/$name.$backend.log"
    fi
    start=$(date +%s.%N)
    ZT_TEST_BACKEND=$backend timeout --kill-after=10 "$timeout_s" "$t" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    p=$(grep -cE '^ok [0-9]+' "$log")
    s=$(grep -cE '^not ok [0-9]+ # SKIP' "$log")
    f=$(grep -E '^not ok [0-9]+' "$log" | grep -cv '# SKIP')
    if [ "$rc" -eq 77 ]; then
      reason=$(grep -m1 -i 'skipped:' "$log" || echo "skipped")
      # io_uring refused by the kernel, or a build without MPI (the GPU
      # bundle's), says nothing about the GPU.
      if [ "$skip_fails" -eq 1 ] && [[ "$reason" != *io_uring* ]] &&
        [[ "$reason" != *"built without MPI"* ]]; then
        printf '%-32s FAIL  %6ss  skipped on cuda on a machine with a GPU: %s\n' \
          "$label" "$secs" "$reason"
        echo "    !!! $label tested nothing on the GPU: a GPU suite that skips where a GPU is"
        echo "    !!! present is a failure (ZT_TEST_GPU_PRESENT=0 if this machine has none)"
        failed=$((failed + 1))
        failed_names+=("$label")
        continue
      fi
      printf '%-32s SKIP  %6ss  %s\n' "$label" "$secs" "$reason"
      skipped=$((skipped + (s > 0 ? s : 1)))
      skipped_names+=("$label")
      continue
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
      # Crashed, sanitizer report, or timed out before reporting a failure.
      f=1
      [ "$rc" -eq 124 ] && echo "# timed out after ${timeout_s}s" >>"$log"
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$f" -gt 0 ]; then
      printf '%-32s FAIL  %6ss  %d passed, %d failed, %d skipped (rc %d)\n' \
        "$label" "$secs" "$p" "$f" "$s" "$rc"
      sed -n '1,200p' "$log" | grep -vE '^ok [0-9]+' | tail -n 40 | sed 's/^/    /'
      failed_names+=("$label")
    else
      printf '%-32s ok    %6ss  %d passed, %d skipped\n' "$label" "$secs" "$p" "$s"
    fi
  done
done

[ ${#skipped_names[@]} -gt 0 ] && echo "skipped as a whole: ${skipped_names[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]} (logs in $logs)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

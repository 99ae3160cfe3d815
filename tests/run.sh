#!/usr/bin/env bash
# tests/run.sh BUILD_DIR — runs every test executable in BUILD_DIR/tests, each
# under a timeout, tallies the cmocka test cases they report (TAP), and ends
# with one line: "N passed, N failed, N skipped".
#
# A test executable exits 0 (all passed), 1 (a failure) or 77 (skipped as a
# whole, e.g. "skipped: no GPU"). One that crashes or times out counts as one
# failure. Logs are kept in BUILD_DIR/tests/logs/.
#
# Environment: ZT_TEST_TIMEOUT (seconds per executable, default 900),
# ZT_TEST_FILTER (substrings of the names to run, space-separated; a test runs
# when its name contains any of them), ZT_TEST_BACKEND (host|cuda).
set -u
build=${1:?usage: tests/run.sh BUILD_DIR}
timeout_s=${ZT_TEST_TIMEOUT:-900}
filter=${ZT_TEST_FILTER:-}
logs="$build/tests/logs"
mkdir -p "$logs"

export CMOCKA_MESSAGE_OUTPUT=TAP
# The static CUDA runtime maps memory where ASan keeps its shadow gap.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

passed=0 failed=0 skipped=0
failed_names=()
for t in "$build"/tests/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$t" in *.o|*.d) continue ;; esac
  name=$(basename "$t")
  if [ -n "$filter" ]; then
    keep=0
    for word in $filter; do [[ "$name" == *"$word"* ]] && keep=1; done
    [ "$keep" -eq 1 ] || continue
  fi
  log="$logs/$name.log"
  start=$(date +%s.%N)
  timeout --kill-after=10 "$timeout_s" "$t" >"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  p=$(grep -cE '^ok [0-9]+' "$log")
  s=$(grep -cE '^not ok [0-9]+ # SKIP' "$log")
  f=$(grep -E '^not ok [0-9]+' "$log" | grep -cv '# SKIP')
  if [ "$rc" -eq 77 ]; then
    reason=$(grep -m1 -i 'skipped:' "$log" || echo "skipped")
    printf '%-28s SKIP  %6ss  %s\n' "$name" "$secs" "$reason"
    skipped=$((skipped + (s > 0 ? s : 1)))
    continue
  fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    # Crashed, sanitizer report, or timed out before reporting a failure.
    f=1
    [ "$rc" -eq 124 ] && echo "# timed out after ${timeout_s}s" >>"$log"
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  if [ "$f" -gt 0 ]; then
    printf '%-28s FAIL  %6ss  %d passed, %d failed, %d skipped (rc %d)\n' \
      "$name" "$secs" "$p" "$f" "$s" "$rc"
    sed -n '1,200p' "$log" | grep -vE '^ok [0-9]+' | tail -n 40 | sed 's/^/    /'
    failed_names+=("$name")
  else
    printf '%-28s ok    %6ss  %d passed, %d skipped\n' "$name" "$secs" "$p" "$s"
  fi
done

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]} (logs in $logs)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS TARGET... — builds the fuzz targets
# (BUILD_DIR/fuzz/fuzz_<target>, through make) and runs each one named under
# libFuzzer for SECONDS, on its seed corpus tests/fuzz/corpus/<target>/ plus what
# earlier runs found (kept in BUILD_DIR/fuzz/corpus-<target>/; the source
# tree is left alone). Ends with one line, as tests/run.sh does: "N passed,
# N failed, N skipped", a target counting once. A crash leaves its input in
# BUILD_DIR/fuzz/crash-<target>-*; replay it with BUILD_DIR/fuzz/fuzz_<target>
# FILE.
#
# Without clang or its libFuzzer runtime (Debian: clang, libclang-rt-dev) every
# target is skipped, with a message saying so.
set -u
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...}
secs=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...}
shift 2
targets=("$@")
cc=${FUZZ_CC:-clang}

passed=0 failed=0 skipped=0
why=""
if ! command -v "$cc" >/dev/null; then
  why="no $cc on PATH"
else
  rt="$("$cc" -print-runtime-dir 2>/dev/null)/libclang_rt.fuzzer-$(uname -m).a"
  [ -f "$rt" ] || why="$cc has no libFuzzer runtime ($rt is missing)"
fi
if [ -n "$why" ]; then
  echo "fuzz: skipped: $why; install clang and libclang-rt-dev (scripts/deps.sh does)"
  echo "0 passed, 0 failed, ${#targets[@]} skipped"
  exit 0
fi

# The Makefile's `fuzzers` builds every target (quietly when they are up to date).
if ! "${MAKE:-make}" --no-print-directory BUILD="$build" fuzzers; then
  echo "fuzz: building the targets failed"
  echo "0 passed, ${#targets[@]} failed, 0 skipped"
  exit 1
fi

for t in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$t" corpus="$build/fuzz/corpus-$t" log="$build/fuzz/$t.log"
  mkdir -p "$corpus"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  start=$(date +%s)
  # The seed corpus is read, new inputs go to the copy in the build folder.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$build/fuzz/crash-$t-" "$corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  if [ "$rc" -eq 0 ]; then
    printf '%-24s ok    %5ss  %s runs, corpus %s files\n' "fuzz_$t" "$(($(date +%s) - start))" \
      "${runs:-?}" "$(find "$corpus" -type f | wc -l)"
    passed=$((passed + 1))
  else
    printf '%-24s FAIL  %5ss  (rc %d; log %s)\n' "fuzz_$t" "$(($(date +%s) - start))" "$rc" "$log"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written|==[0-9]+==' "$log" | head -n 20 |
      sed 's/^/    /'
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

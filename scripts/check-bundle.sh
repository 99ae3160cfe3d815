#!/usr/bin/env bash
# scripts/check-bundle.sh BUNDLE — checks a GPU bundle (make gpu-bundle) before
# it travels to a machine that has a GPU and none of this machine's libraries:
#   - the folder holds run-gpu.sh, run-tests.sh, ztier and test suites;
#   - it is at most BUNDLE_MAX_BYTES (default 64 MiB), and, inside a git
#     checkout, it fits beside what else travels with the working tree (its
#     tracked and untracked-not-ignored files) within the same 64 MiB;
#   - every ELF file in it is stripped, and loads nothing (ldd, transitively)
#     but the C and C++ runtimes, libcuda and libnccl (found on the GPU machine
#     at run time) and the copies in BUNDLE/lib (the bundle's library, libnuma,
#     libhwloc, libudev): never libmpi, nor liburing, libnuma, libhwloc or any
#     other library from this machine's folders.
# Exits 0 with one line of figures, or 1 naming every problem.
set -u
bundle=${1:?usage: scripts/check-bundle.sh BUNDLE}
max=${BUNDLE_MAX_BYTES:-$((64 * 1024 * 1024))}
problems=0
problem() {
  echo "check-bundle: $bundle: $*" >&2
  problems=$((problems + 1))
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

[ -d "$bundle" ] || { echo "check-bundle: $bundle is not a folder" >&2; exit 1; }
bundle_abs=$(cd "$bundle" && pwd -P)

for f in run-gpu.sh run-tests.sh ztier; do
  [ -f "$bundle/$f" ] || problem "$f is missing"
done
suites=0
for t in "$bundle"/tests/test_*; do [ -f "$t" ] && [ -x "$t" ] && suites=$((suites + 1)); done
[ "$suites" -gt 0 ] || problem "tests/ holds no test suite"

# ---- size -------------------------------------------------------------------
bytes=$(du -sb "$bundle" | cut -f1)
if [ "$bytes" -gt "$max" ]; then
  problem "it is $(mib "$bytes") ($bytes bytes); the limit is $(mib "$max") ($max bytes)." \
    "The largest files:"
  find "$bundle" -type f -printf '%s %p\n' | sort -rn | head -5 | sed 's/^/    /' >&2
fi
# What else travels with it: the checkout's tracked files and the untracked
# ones git does not ignore (the bundle itself is ignored, and carried).
tree=0
top=$(git -C "$bundle" rev-parse --show-toplevel 2>/dev/null || true)
if [ -n "$top" ]; then
  tree=$(git -C "$top" ls-files -z --cached --others --exclude-standard |
    (cd "$top" && xargs -0 -r stat -c %s -- 2>/dev/null) | awk '{ s += $1 } END { print s + 0 }')
  if [ $((bytes + tree)) -gt "$max" ]; then
    problem "it is $(mib "$bytes") and the working tree that travels with it" \
      "$(mib "$tree"): $(mib $((bytes + tree))) together, over $(mib "$max")"
  fi
fi

# ---- what the binaries load -------------------------------------------------
# Allowed by name anywhere: the C runtime, the C++ runtime, and what the GPU
# machine supplies (the driver's libcuda, NCCL from its PyTorch install).
allowed='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libnccl\.so\.2|libcuda\.so\.1)$'
never='^lib(mpi|open-pal|open-rte|pmix)[.-]'
forbidden='^lib(uring|numa|hwloc)[.-]'
elves=0
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  elves=$((elves + 1))
  rel=${f#"$bundle"/}
  if readelf -S "$f" 2>/dev/null | grep -qE '\.(symtab|debug_info)\b'; then
    problem "$rel is not stripped (it has .symtab or .debug_info)"
  fi
  # A copy in lib/ is loaded by the executables, whose rpath (DT_RPATH)
  # finds its own needs in lib/ too: each name it needs must be a runtime
  # library or another copy there. (ldd of the copy alone would look in
  # this machine's folders.)
  if [ "$(dirname "$rel")" = lib ]; then
    for name in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      if [[ "$name" =~ $never ]]; then
        problem "$rel needs $name, which the GPU machine lacks and the bundle must not need"
        continue
      fi
      [[ "$name" =~ $allowed ]] || [ -f "$bundle/lib/$name" ] ||
        problem "$rel needs $name, which is neither a runtime library nor a copy in lib/"
    done
    continue
  fi
  while read -r name arrow path _; do
    [ -n "$name" ] || continue
    [ "$name" = statically ] || [ "$name $arrow" = "not a" ] && continue
    case "$name" in /*) name=$(basename "$name") ;; esac
    if [[ "$name" =~ $never ]]; then
      problem "$rel loads $name, which the GPU machine lacks and the bundle must not need"
      continue
    fi
    [[ "$name" =~ $allowed ]] && continue
    if [ "$arrow" = "=>" ] && [ -n "$path" ] && [ "$path" != not ] &&
       [ "$(cd "$(dirname "$path")" 2>/dev/null && pwd -P)" = "$bundle_abs/lib" ]; then
      continue
    fi
    if [[ "$name" =~ $forbidden ]]; then
      problem "$rel loads $name from $path, not from the copy in lib/: the GPU machine" \
        "lacks it"
      continue
    fi
    [ "$path" = not ] && path="not found"
    problem "$rel loads $name ($path), which is neither a runtime library nor a copy" \
      "in lib/"
  done < <(env -u LD_LIBRARY_PATH -u LD_PRELOAD ldd "$f" 2>/dev/null | sed 's/([^)]*)//')
done < <(find "$bundle" -type f -print0)
[ "$elves" -gt 0 ] || problem "it holds no executable"

if [ "$problems" -gt 0 ]; then
  echo "check-bundle: $bundle: $problems problem(s)" >&2
  exit 1
fi
echo "check-bundle: $bundle: $(mib "$bytes") ($bytes bytes) in $elves ELF files, $suites" \
  "suites; with the working tree that travels: $(mib $((bytes + tree))) of $(mib "$max"); ok"

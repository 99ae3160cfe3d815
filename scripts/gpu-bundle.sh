#!/usr/bin/env bash
# scripts/gpu-bundle.sh BUNDLE — builds the GPU bundle (make gpu-bundle): a
# folder for a machine that has a GPU, the CUDA driver and PyTorch's NCCL, but
# none of this machine's libraries and no OpenMPI (docs/gpu.md, "The GPU
# bundle"). BUNDLE/ holds:
#   ztier, tests/test_*, examples/*   stripped, built at -O2 -g0 with MPI=0,
#                                     linked to lib/libztier-internal.so (but
#                                     test_comm_nccl: below);
#                                     cmocka linked statically, libnccl.so.2
#                                     left to the machine
#   gpu-info                          CUDA runtime, driver and NCCL versions,
#                                     devices; with copy-limit, the link as
#                                     cudaMemcpyAsync from cudaMallocHost
#                                     memory reaches it
#   lib/                              the shared objects that travel, found
#                                     through the binaries' rpath ($ORIGIN):
#                                     libztier-internal.so (the library with
#                                     its internal functions visible, which the
#                                     tests call; liburing, cJSON and cudart
#                                     inside it, statically), and this
#                                     machine's libnuma, libhwloc and libudev
#   ztier-base                        the tool as an earlier commit built it
#                                     (BUNDLE_BASELINE, below), which run-gpu.sh
#                                     runs beside ztier in `bench step`, for
#                                     before-and-after figures from one machine
#                                     in one run
#   run-gpu.sh, run-tests.sh          the runner (scripts/run-gpu.sh) and a copy
#                                     of tests/run.sh
#   torch-adamw.py                    PyTorch's AdamW, bench device's peer
#   BUILD-INFO                        what was built, from what, how linked
# Objects go to BUNDLE-obj/; Debian's sources of cJSON and cmocka are built
# once under BUNDLE-deps/ (beside it: make reads every *.d under a build
# folder). Ends with scripts/check-bundle.sh, whose failure fails the build.
#
# Environment: MAKE (the make to call), CUDA_HOME, NCCL_HOME, GPU_ARCH, CC,
# BUNDLE_PTX (1: PTX beside the machine code), BUNDLE_BASELINE (the commit
# ztier-base is built from; default: the one the newest run in
# docs/gpu-runs/ was built from, as its env.txt says; "none": no baseline).
set -euo pipefail
bundle=${1:?usage: scripts/gpu-bundle.sh BUNDLE}
bundle=${bundle%/}
case "$(basename "$bundle")" in
*gpu-bundle*) ;;
*)
  echo "gpu-bundle: $bundle: the folder's name must contain gpu-bundle (it is removed and" \
    "made again)" >&2
  exit 1
  ;;
esac
obj="$bundle-obj"
deps="$bundle-deps"
make=${MAKE:-make}
cc=${CC:-cc}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nccl_home=${NCCL_HOME:-$cuda_home}
gpu_arch=${GPU_ARCH:-90}
say() { echo "gpu-bundle: $*"; }
die() {
  echo "gpu-bundle: $*" >&2
  exit 1
}

[ -x "$cuda_home/bin/nvcc" ] ||
  die "no nvcc at $cuda_home/bin/nvcc: the bundle is for the cuda backend; set CUDA_HOME"
mkdir -p "$deps"
deps_abs=$(cd "$deps" && pwd -P)

# ---- cJSON and cmocka, static -------------------------------------------------
# Debian ships them shared only. Build the installed version's own source
# (apt-get source, Debian's patches applied) into a static archive, once; where
# that cannot be fetched, link the shared library and carry a copy in lib/.

# The deb-src twin of this machine's Debian sources, in a folder of our own.
apt_opts=()
apt_ready=0
apt_setup() {
  [ "$apt_ready" -eq 1 ] && return 0
  local a="$deps_abs/apt"
  mkdir -p "$a/lists/partial" "$a/sources.list.d"
  : >"$a/sources.list"
  [ -f /etc/apt/sources.list ] &&
    sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >"$a/sources.list"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && sed 's/^Types: deb$/Types: deb-src/' "$f" >"$a/sources.list.d/$(basename "$f")"
  done
  apt_opts=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=$a/sources.list.d"
    -o "Dir::State::Lists=$a/lists" -o "APT::Sandbox::User=$(id -un)")
  timeout 300 apt-get "${apt_opts[@]}" -qq update >"$a/update.log" 2>&1 || return 1
  apt_ready=1
}

# fetch BINARY_PACKAGE DIR: the source of the installed version, unpacked.
fetch_source() {
  local pkg=$1 dir=$2 src ver
  src=$(dpkg-query -W -f='${source:Package}' "$pkg" 2>/dev/null) || return 1
  ver=$(dpkg-query -W -f='${source:Version}' "$pkg" 2>/dev/null) || return 1
  apt_setup || return 1
  rm -rf "$dir" "$dir.dl" && mkdir -p "$dir.dl"
  (cd "$dir.dl" && timeout 300 apt-get "${apt_opts[@]}" -qq source --download-only \
    "$src=$ver") >"$dir.log" 2>&1 || return 1
  dpkg-source -x "$dir.dl"/*.dsc "$dir" >>"$dir.log" 2>&1 || return 1
  echo "$src $ver" >"$dir.version"
}

build_cjson() {
  [ -f "$deps/libcjson.a" ] && return 0
  fetch_source libcjson1 "$deps/cjson" || return 1
  "$cc" -O2 -g0 -fPIC -c "$deps/cjson/cJSON.c" -o "$deps/cjson/cJSON.o" &&
    ar rcs "$deps/libcjson.a" "$deps/cjson/cJSON.o" && cp "$deps/cjson.version" "$deps/libcjson.a.version"
}

build_cmocka() {
  [ -f "$deps/libcmocka.a" ] && return 0
  command -v cmake >/dev/null || return 1
  fetch_source libcmocka0 "$deps/cmocka" || return 1
  cmake -S "$deps/cmocka" -B "$deps/cmocka-build" -DWITH_STATIC_LIB=ON -DWITH_EXAMPLES=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_C_COMPILER="$cc" >"$deps/cmocka.cmake.log" 2>&1 &&
    cmake --build "$deps/cmocka-build" --target cmocka-static >>"$deps/cmocka.cmake.log" 2>&1 &&
    cp "$deps/cmocka-build/src/libcmocka-static.a" "$deps/libcmocka.a" &&
    cp "$deps/cmocka.version" "$deps/libcmocka.a.version"
}

ship=() # shared objects that travel in lib/
if build_cjson; then
  cjson_link="$deps_abs/libcjson.a"
  cjson_how="static, built from Debian's source ($(cat "$deps/libcjson.a.version"))"
else
  say "cJSON: Debian's source could not be fetched or built (see $deps/cjson.log);" \
    "linking libcjson.so.1 and carrying a copy in lib/ instead"
  cjson_link="-lcjson"
  cjson_how="shared: a copy of this machine's libcjson.so.1 in lib/"
  ship+=(libcjson.so.1)
fi
if build_cmocka; then
  cmocka_link="$deps_abs/libcmocka.a"
  cmocka_how="static, built from Debian's source ($(cat "$deps/libcmocka.a.version"))"
else
  say "cmocka: Debian's source could not be fetched or built (see $deps/cmocka.log);" \
    "linking libcmocka.so.0 and carrying a copy in lib/ instead"
  cmocka_link="-lcmocka"
  cmocka_how="shared: a copy of this machine's libcmocka.so.0 in lib/"
  ship+=(libcmocka.so.0)
fi

# ---- the build ------------------------------------------------------------------
# Size: the folder and the working tree must travel in 64 MiB together. Each
# executable once linked its own copy of the library, the kernels and cudart
# (about 2 MiB each, 60 MiB in all); now they share lib/libztier-internal.so
# (LINK=shared-internal, Makefile). test_comm_nccl calls the CUDA runtime
# itself, and a static cudart inside a shared object exports none of it, so
# it keeps its own copy of the library (a process holds one runtime). The
# kernels' fat binary is compressed (from about 1 MiB to about 120 KiB) and
# unused sections are dropped at link time.
#
# A shared object takes position-independent code only: Debian's liburing.a
# is, its libnuma.a and libhwloc.a are not, so those two are linked shared
# and travel in lib/, with libudev, which hwloc calls and Debian ships shared
# only. The rpath finds lib/ beside ztier and beside tests/ and examples/.
# It is an old-style DT_RPATH (--disable-new-dtags), which the loader also
# searches for the libraries' own needs (libhwloc's libudev), where a RUNPATH
# would serve the executable's direct needs only. '$$' is make's '$'; the
# quotes keep it from the shell of make's recipe.
ldlibs="$cjson_link -l:liburing.a -lnuma -lhwloc -ludev -lm -lpthread"
ldlibs+=" -Wl,--gc-sections -Wl,--disable-new-dtags '-Wl,-rpath,\$\$ORIGIN/lib:\$\$ORIGIN/../lib'"
# The GPU machine's cards are sm_90 (H100, H200): machine code for GPU_ARCH
# only, no PTX for later GPUs (another 4 MiB), unless BUNDLE_PTX=1.
gencode="-gencode arch=compute_$gpu_arch,code=sm_$gpu_arch -Xfatbin -compress-all"
[ "${BUNDLE_PTX:-0}" = 1 ] && gencode+=" -gencode arch=compute_$gpu_arch,code=compute_$gpu_arch"
cflags="-O2 -g0 -ffunction-sections -fdata-sections"
# The Makefile's stamp knows CUDA, SAN, GPU_ARCH and MPI, not these flags:
# objects built with others are removed first.
flags="$cflags | $gencode | $ldlibs | $cmocka_link | LINK=shared-internal"
if [ "$(cat "$obj/bundle-flags" 2>/dev/null)" != "$flags" ]; then
  rm -rf "$obj"
  mkdir -p "$obj"
  echo "$flags" >"$obj/bundle-flags"
fi
say "building into $obj (MPI=0, CUDA=1, CUDART=static, LINK=shared-internal," \
  "GPU_ARCH=$gpu_arch, -O2 -g0)"
"$make" --no-print-directory BUILD="$obj" CUDA=1 CUDART=static MPI=0 SAN= GPU_ARCH="$gpu_arch" \
  LINK=shared-internal \
  CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home" NVCC_GENCODE="$gencode" \
  CFLAGS="$cflags" \
  LDLIBS_BASE="$ldlibs" CMOCKA_LIBS="$cmocka_link" \
  "$obj/libztier.a" "$obj/libztier-internal.so" tool tests examples
"$cc" -O2 -g0 -Wall -Wextra -I"$cuda_home/include" -I"$nccl_home/include" \
  scripts/gpu-info.c scripts/gpu-copy-limit.c -o "$obj/gpu-info" -L"$cuda_home/lib64" \
  -L"$nccl_home/lib64" -lnccl -lcudart_static -ldl -lrt -lpthread

# ---- the baseline ---------------------------------------------------------------
# The tool of an earlier commit, built the same way from that commit's own
# tree (git archive into BUNDLE-base-src/, objects in BUNDLE-base-obj/, both
# kept while the commit stays the same): a GPU machine is lent for minutes,
# so a change's effect there is measured against the baseline in the same
# run, not against figures from another machine or day.
base=${BUNDLE_BASELINE:-}
if [ -z "$base" ]; then
  last=$(find docs/gpu-runs -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | tail -1)
  for f in "$last/env.txt" "$last/env/env.txt"; do
    [ -n "$last" ] && [ -f "$f" ] && base=$(awk '/^commit: / { print $2; exit }' "$f") && break
  done
fi
base_rev=
if [ -n "$base" ] && [ "$base" != none ]; then
  base_rev=$(git rev-parse --verify -q "$base^{commit}") ||
    die "BUNDLE_BASELINE: $base is not a commit of this checkout (or \"none\")"
  base_src=$(pwd -P)/$bundle-base-src
  base_obj=$(pwd -P)/$bundle-base-obj
  if [ "$(cat "$base_src/.base-rev" 2>/dev/null)" != "$base_rev $flags" ]; then
    rm -rf "$base_src" "$base_obj"
    mkdir -p "$base_src"
    git archive "$base_rev" | tar -x -C "$base_src"
    echo "$base_rev $flags" >"$base_src/.base-rev"
  fi
  say "baseline: ztier-base from ${base_rev:0:7} (into $bundle-base-obj)"
  (cd "$base_src" && "$make" --no-print-directory BUILD="$base_obj" CUDA=1 CUDART=static MPI=0 \
    SAN= GPU_ARCH="$gpu_arch" CUDA_HOME="$cuda_home" NCCL_HOME="$nccl_home" \
    NVCC_GENCODE="$gencode" CFLAGS="$cflags" LDLIBS_BASE="$ldlibs" \
    CMOCKA_LIBS="$cmocka_link" tool)
fi

# ---- the folder -----------------------------------------------------------------
tmp="$bundle.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/tests" "$tmp/examples" "$tmp/lib"
cp "$obj/ztier" "$obj/gpu-info" "$tmp/"
[ -n "$base_rev" ] && cp "$base_obj/ztier" "$tmp/ztier-base"
for t in "$obj"/tests/test_*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  case "$t" in *.o | *.d) continue ;; esac
  case "$(basename "$t")" in
  # The layer check and the install check read the source tree, which does
  # not travel; the GPT-2 example's checks need OpenBLAS, which the
  # bundle does not carry (its shared library alone is 36 MB). The config
  # and checkpoint-format parsers, the struct sizes, the small helpers, the
  # runner's own check, the thread pool, the swap engine, the host
  # backend's streams, the sim model, the CPU's rank sums and the CUDA
  # kernels' own code run on the host (test_cuda_kernels_host needs nvcc,
  # not a GPU) take no GPU backend and run the same everywhere: they stay
  # home. None of them touches a GPU.
  test_layers | test_install | test_gpt2_grad | test_gpt2_zt | test_gpt2_bpe) continue ;;
  test_config | test_config_deepspeed | test_ckpt_format | test_abi) continue ;;
  test_util | test_spares | test_runner | test_threadpool | test_swap) continue ;;
  test_host_streams | test_sim | test_rank_sum | test_cuda_kernels_host) continue ;;
  esac
  cp "$t" "$tmp/tests/"
done
for e in "$obj"/examples/*; do
  [ -f "$e" ] && [ -x "$e" ] || continue
  [ "$(basename "$e")" = gpt2 ] && continue # OpenBLAS, as above; host backend only
  cp "$e" "$tmp/examples/"
done
strip --strip-all "$tmp/ztier" "$tmp/gpu-info" "$tmp"/tests/* "$tmp"/examples/*
[ -n "$base_rev" ] && strip --strip-all "$tmp/ztier-base"
cp "$obj/libztier-internal.so" "$tmp/lib/"
strip --strip-unneeded "$tmp/lib/libztier-internal.so"

# What travels in lib/ besides: libnuma, libhwloc and libudev (and cJSON or
# cmocka where they are shared), this machine's copies, as ztier and the
# tests resolve them here.
ship+=(libnuma.so.1 libhwloc.so.15 libudev.so.1)
for so in "${ship[@]}"; do
  path=$(ldd "$tmp/tests/test_api" "$tmp/ztier" 2>/dev/null |
    awk -v n="$so" '$1 == n && $3 ~ /^\// { print $3; exit }')
  [ -n "$path" ] || die "$so: not found by ldd in the built binaries"
  cp -L "$path" "$tmp/lib/$so"
  strip --strip-unneeded "$tmp/lib/$so"
done

install -m 755 tests/run.sh "$tmp/run-tests.sh"
install -m 755 scripts/run-gpu.sh "$tmp/run-gpu.sh"
install -m 755 scripts/torch-adamw.py "$tmp/torch-adamw.py"

version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }
glibc_needed=$(objdump -T "$tmp/ztier" "$tmp"/tests/* "$tmp"/lib/* 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' |
  sort -uV | tail -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
git diff --quiet HEAD 2>/dev/null || commit="$commit plus uncommitted changes"
{
  echo "ztier GPU bundle (make gpu-bundle; docs/gpu.md, \"The GPU bundle\")"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "commit: $commit"
  echo "ztier: $(LD_LIBRARY_PATH="$obj" "$obj/ztier" version)"
  echo "compiler: $("$cc" --version | head -1)"
  echo "nvcc: $("$cuda_home/bin/nvcc" --version | tail -1)"
  echo "cudart: static, CUDART_VERSION $(sed -n 's/^#define CUDART_VERSION *//p' \
    "$cuda_home/include/cuda_runtime_api.h")"
  echo "nccl: libnccl.so.2 from the machine at run time (headers here: $(sed -n \
    's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$nccl_home/include/nccl.h" |
    paste -sd.))"
  echo "GPU code: sm_$gpu_arch machine code$([ "${BUNDLE_PTX:-0}" = 1 ] &&
    echo " and compute_$gpu_arch PTX"), compressed"
  echo "MPI: left out (MPI=0): comm \"mpi\" fails with a sentence; the mpirun cases skip"
  echo "cJSON: $cjson_how"
  echo "cmocka: $cmocka_how"
  echo "library: lib/libztier-internal.so, which every executable links but test_comm_nccl" \
    "(its own copy: it calls the CUDA runtime itself)"
  echo "liburing: static, inside the library (Debian $(version liburing-dev))"
  echo "libnuma, hwloc, libudev: shared, copies in lib/ (Debian $(version libnuma1)," \
    "$(version libhwloc15), $(version libudev1))"
  echo "glibc: at least ${glibc_needed#GLIBC_} on the machine that runs it"
  if [ -n "$base_rev" ]; then
    echo "baseline: ztier-base, built from $(git log -1 --format='%h (%cs)' "$base_rev")" \
      "the same way (its own copy of the library)"
  else
    echo "baseline: none"
  fi
} >"$tmp/BUILD-INFO"

rm -rf "$bundle"
mv "$tmp" "$bundle"
say "$bundle: $(find "$bundle"/tests -name 'test_*' | wc -l) suites, the tool, examples," \
  "gpu-info, lib/ ($(ls "$bundle/lib" | paste -sd' '))"
bash scripts/check-bundle.sh "$bundle" ||
  die "$bundle fails its check (above): it would not run on the GPU machine, or not travel"

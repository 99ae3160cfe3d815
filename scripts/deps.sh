#!/usr/bin/env bash
# scripts/deps.sh [PURPOSE...] — installs the Debian packages that the
# purposes named need and that are missing, and nothing when none is (a dpkg
# query, well under a second). Runs as root (CI does), or through sudo when
# that is available.
#
# Purposes (docs/dependencies.md says the same, package by package):
#   build   the library, the tool with its benchmarks, the examples (make)
#   demo    build, and what `make demo` runs with
#   test    build, and what `make test` runs with
#   bench   build, and what `ztier bench nvme` compares with and plots with
#   fuzz    the checkpoint parsers under libFuzzer (make fuzz, make
#           fuzz-brief), which clang builds without the rest of the library
#   bundle  build, and what `make gpu-bundle` links statically
# With none: every purpose (`make deps`), so a machine set up once stays set
# up. `make demo` asks for demo, `make test` for test, .ci/run for fuzz too.
set -euo pipefail

# Each purpose's packages, one a line with why; a package may appear in more
# than one purpose.
build=(
  build-essential    # gcc, make, ar, libc headers
  pkg-config         # finds OpenMPI's compiler flags (ompi-c)
  libcjson-dev       # config files, checkpoint manifests, safetensors headers
  libxxhash-dev      # XXH3 checksums of swap blocks and checkpoint files
  liburing-dev       # the io_uring swap engine
  libnuma-dev        # NUMA placement of pinned memory
  libhwloc-dev       # topology: which NUMA node is local to a GPU
  libopenmpi-dev     # comm "mpi" (make MPI=0 builds without it)
  libopenblas-dev    # examples/gpt2's matrix products (cblas_sgemm), and its test
)
demo=(
  base-files         # the demo's text: /usr/share/common-licenses/GPL-3
  gnuplot-nox        # the demo's loss curve (PNG)
  openmpi-bin        # mpirun: the demo's two ranks (one rank without it)
)
test=(
  libcmocka-dev      # unit-test framework of every suite
  openmpi-bin        # mpirun: the suites that launch 2 to 4 ranks
  python3            # tests/layers.py, the layer check (its shutil is not in python3-minimal)
  base-files         # test_charlm_resume trains charlm on its default text
  libudev-dev        # test_install links libztier.a statically: hwloc.pc's Libs.private names -ludev
)
bench=(
  fio                # bench nvme's reference figure on the same disk
  gnuplot-nox        # bench nvme's plot (PNG)
)
fuzz=(
  make               # tests/fuzz/run.sh builds the targets through the Makefile
  clang              # builds the fuzz targets with -fsanitize=fuzzer
  libclang-rt-dev    # clang's libFuzzer and sanitizer runtimes
  libcjson-dev       # the parsers read JSON with cJSON
  libxxhash-dev      # the manifest parser checks an XXH3 checksum
)
bundle=(
  libudev-dev        # the static hwloc calls libudev, which Debian ships shared only
)
purposes=(build demo test bench fuzz bundle)

usage() {
  echo "usage: scripts/deps.sh [${purposes[*]}]... (none: all of them)" >&2
  exit 2
}

asked=("$@")
[ ${#asked[@]} -eq 0 ] && asked=("${purposes[@]}")

# Every purpose but fuzz builds the library first, so it takes build's too.
wanted=()
for p in "${asked[@]}"; do
  case " ${purposes[*]} " in *" $p "*) ;; *) usage ;; esac
  [ "$p" != build ] && [ "$p" != fuzz ] && wanted+=("${build[@]}")
  list="$p[@]"
  wanted+=("${!list}")
done

missing=()
for p in $(printf '%s\n' "${wanted[@]}" | sort -u); do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps.sh: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "deps.sh: missing packages (${missing[*]}) and not root; install them by hand" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# An old or empty package list finds nothing: refresh it once, then install.
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

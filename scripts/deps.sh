#!/usr/bin/env bash
# Installs the Debian packages ztier needs that are missing, and nothing when
# none is (a dpkg query, well under a second). Runs as root (CI does), or
# through sudo when that is available.
set -euo pipefail

packages=(
  build-essential pkg-config
  libcjson-dev       # config files (JSON)
  libcmocka-dev      # unit-test framework
  libxxhash-dev      # block checksums of the swap engine
  liburing-dev       # io_uring swap engine
  libnuma-dev        # NUMA placement of pinned memory
  libhwloc-dev       # topology: which NUMA node is local to a GPU
  libudev-dev        # static hwloc needs it (GPU builds, see shared GPU notes)
  libopenmpi-dev openmpi-bin   # multi-rank comm
  base-files         # the demo's text: /usr/share/common-licenses
  gnuplot-nox        # PNG plots of the demo and the benchmarks
  fio                # the benchmark's reference figure
  clang libclang-rt-dev   # libFuzzer for the checkpoint parsers (make fuzz)
  python3-minimal    # tests/layers.py, the layer check of make test
)

missing=()
for p in "${packages[@]}"; do
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

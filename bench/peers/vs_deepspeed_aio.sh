#!/usr/bin/env bash
# bench/peers/vs_deepspeed_aio.sh — ztier's swap engine (`ztier bench nvme`)
# against DeepSpeed's async I/O core (csrc/aio/common, libaio), on one disk,
# interleaved, medians and ranges per cell. docs/nvme.md, "Against
# DeepSpeed's async_io", has the figures and how to read them.
#
# It builds the peer from a local DeepSpeed checkout given as the first
# argument (a work tree, or a bare git directory: its HEAD is read), with
# bench/peers/ds_aio_bench.cpp as the driver; nothing is downloaded at build
# or run time. Not part of `make` or `make test`. The peer needs g++ and
# libaio-dev; ztier itself does not link libaio.
#
#   bench/peers/vs_deepspeed_aio.sh DEEPSPEED ZTIER_BIN DIR [ROUNDS]
#
# DIR is a directory on the disk to measure, with room for two files of
# SIZE. Each peer works on one O_DIRECT file of SIZE there, single thread,
# one request of BLOCK bytes per I/O, QD in flight: DeepSpeed's file is
# made here and written once before timing; the engine makes its own (it
# refuses a file that exists) and writes it once before timing, so both
# overwrite written extents. Each round runs every cell, DeepSpeed first in
# odd rounds and ztier first in even ones; each run writes the whole file,
# then reads it whole. Both files are removed at the end.
#
# Each peer waits SETTLE seconds before its write and between its write and
# its read: this disk (a virtual one) acknowledges writes from a cache and
# writes them back afterwards, and a pass started at once shares the disk
# with that.
#
# Environment: SIZE (default 4GiB), CELLS (default "1MiB:8 1MiB:32 8MiB:8
# 8MiB:32", BLOCK:QD), SETTLE (default 5), ZTIER_BASE (a second ztier
# binary, e.g. an earlier build, run in the same rounds as "ztier_base",
# the two ztier builds taking turns to go first),
# PEER_BUILD (where the peer is built, default a temporary directory), OUT
# (the raw results, default DIR/vs-deepspeed.tsv, kept).
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n '13,14p' "$0" | sed 's/^# *//' >&2
  exit 2
fi
ds=$1 ztier=$2 dir=$3 rounds=${4:-5}
size=${SIZE:-4GiB}
cells=${CELLS:-"1MiB:8 1MiB:32 8MiB:8 8MiB:32"}
out=${OUT:-$dir/vs-deepspeed.tsv}
settle=${SETTLE:-5}
base=${ZTIER_BASE:-}
here=$(cd "$(dirname "$0")" && pwd)

[ -x "$ztier" ] || { echo "$0: $ztier is not an executable (build ztier first)" >&2; exit 1; }
[ -d "$dir" ] && [ -w "$dir" ] || { echo "$0: $dir is not a writable directory" >&2; exit 1; }

# ---- the peer, from the checkout ------------------------------------------------
build=${PEER_BUILD:-$(mktemp -d /tmp/ds-aio-peer.XXXXXX)}
mkdir -p "$build/src"
files="deepspeed_aio_common.cpp deepspeed_aio_common.h deepspeed_aio_types.cpp
       deepspeed_aio_types.h deepspeed_aio_utils.cpp deepspeed_aio_utils.h"
if [ -d "$ds/csrc/aio/common" ]; then
  for f in $files; do cp "$ds/csrc/aio/common/$f" "$build/src/"; done
  rev=$(git -C "$ds" rev-parse HEAD 2>/dev/null || echo "work tree")
else
  # A bare repository (one file at a time: an archive of the tree would
  # also need every other blob to be present).
  for f in $files; do git --git-dir="$ds" show "HEAD:csrc/aio/common/$f" > "$build/src/$f"; done
  rev=$(git --git-dir="$ds" rev-parse HEAD)
fi
g++ -O2 -std=c++17 -I"$build/src" -o "$build/ds_aio_bench" "$build"/src/*.cpp \
  "$here/ds_aio_bench.cpp" -laio
peer=$build/ds_aio_bench
echo "peer: DeepSpeed $rev, built in $build" >&2

# ---- DeepSpeed's file -----------------------------------------------------------------
dsfile=$dir/ds-aio-$$.dat
cleanup() { rm -f "$dsfile"; }
trap cleanup EXIT
fallocate -l "$size" "$dsfile"
"$peer" --file "$dsfile" --size "$size" --block 8MiB --qd 8 --op write >/dev/null

# ---- the rounds ---------------------------------------------------------------------------
printf 'round\tblock\tqd\tpeer\top\tgbps\n' > "$out"
run_ds() { # block qd round
  "$peer" --file "$dsfile" --size "$size" --block "$1" --qd "$2" --op write,read --verify \
    --settle "$settle" |
    python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    f = [sys.argv[1], j["block_bytes"], j["queue_depth"], "deepspeed", j["op"], j["gbps"]]
    print("\t".join(str(x) for x in f))
' "$3" >> "$out"
}
run_zt() { # block qd round [binary name]
  "${4:-$ztier}" bench nvme --path "$dir" --size "$size" --block "$1" --qd "$2" \
    --threads 1 --reps 1 --no-fio --settle "$settle" --json 2>/dev/null |
    python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
r, b, q, who = sys.argv[1], j["block_bytes"], j["queue_depth"], sys.argv[2]
for op, key in (("write", "cell_write_gbps"), ("read", "cell_read_gbps"),
                ("read_ring", "cell_read_gbps_small_ring")):
    print(f"{r}\t{b}\t{q}\t{who}\t{op}\t{j[key][0]}")
' "$3" "${5:-ztier}" >> "$out"
}
run_both_zt() { # block qd round; with a base build, the two in turns too
  if [ -z "$base" ]; then run_zt "$1" "$2" "$3"
  elif [ $(($3 % 2)) -eq 1 ]; then
    run_zt "$1" "$2" "$3"; run_zt "$1" "$2" "$3" "$base" ztier_base
  else
    run_zt "$1" "$2" "$3" "$base" ztier_base; run_zt "$1" "$2" "$3"
  fi
}
for r in $(seq 1 "$rounds"); do
  for c in $cells; do
    b=${c%%:*} q=${c##*:}
    echo "round $r/$rounds: block $b, qd $q" >&2
    if [ $((r % 2)) -eq 1 ]; then run_ds "$b" "$q" "$r"; run_both_zt "$b" "$q" "$r"
    else run_both_zt "$b" "$q" "$r"; run_ds "$b" "$q" "$r"; fi
  done
done

# ---- medians and ranges ---------------------------------------------------------------------
python3 - "$out" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
cells = []
for _, b, q, *_ in rows:
    if (b, q) not in cells: cells.append((b, q))
def fig(peer, b, q, op):
    v = [float(x[5]) for x in rows if (x[1], x[2], x[3], x[4]) == (b, q, peer, op)]
    return statistics.median(v), min(v), max(v), len(v)
peers = ["ztier"] + (["ztier_base"] if any(x[3] == "ztier_base" for x in rows) else [])
head = " | ".join(f"{p} | {p} / DeepSpeed" for p in peers)
print(f"| op | block | QD | DeepSpeed | {head} |")
print("|---|---|---|---|" + "---|---|" * len(peers))
for op, zop in (("read", "read"), ("read", "read_ring"), ("write", "write")):
    for b, q in cells:
        d = fig("deepspeed", b, q, op)
        name = op if zop == op else "read (ring of QD buffers)"
        line = f"| {name} | {int(b) >> 20} MiB | {q} | {d[0]:.2f} ({d[1]:.2f}-{d[2]:.2f}) "
        for p in peers:
            z = fig(p, b, q, zop)
            line += f"| {z[0]:.2f} ({z[1]:.2f}-{z[2]:.2f}) | {z[0] / d[0]:.2f} "
        print(line + "|")
print(f"\nGB/s (10^9 bytes/s), median (min-max) of {fig('deepspeed', *cells[0], 'read')[3]} rounds")
EOF

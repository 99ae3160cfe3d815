#!/usr/bin/env python3
"""layers.py — the check that the rooms of the source tree point one way.

docs/design.md ("Rooms and layers") draws the map this file encodes: each
room of the library has a layer, and a file may include headers of its own
room or of a lower layer only. On top of that no files may include each
other's headers in a cycle, and no file that ships (library, tool, benches,
example) is over MAX_LINES lines.

    tests/layers.py            the check, as TAP (make test runs it as test_layers)
    tests/layers.py --report [ROOT]
                               room sizes, include cycles and upward includes
                               of a tree, for comparing two versions

Each check also runs once on a small tree made to break it, so a checker
that stopped seeing a broken rule would fail too.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Lower layers first. A room may include its own headers and any lower
# layer's; rooms on one layer (the host and CUDA backends; the tool and the
# benchmarks it runs) may include each other.
LAYERS = [
    ["include"],            # the public API, ztier.h
    ["base"],               # errors, sizes, ABI rules, JSON helpers, util
    ["cpu"],                # optimizer math, kernels, thread pool, windows
    ["backend", "cuda"],    # host and CUDA backends (and their kernels)
    ["comm"],               # the comm front end and its backends
    ["offload"],            # pool, pinned memory, swap engine, tier storage
    ["zero"],               # partitioning, reduction, gather, prefetch
    ["engine"],             # engine, registration, step, fetch, config, plan
    ["ckpt"],               # checkpoints: save, load, consolidate, formats
    ["tool", "bench"],      # the ztier command and its benchmarks
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
MAX_LINES = 900
SHIPPED = ("src/", "offload/", "cuda/", "bench/", "examples/")
SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    """The room a tracked path lies in: src/<room>/..., or its top folder."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "cuda" and parts[-1].startswith("comm_"):
        return "comm"  # the NCCL comm backend is built by nvcc beside the kernels
    return parts[0]


def tracked_sources(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.relpath(os.path.join(d, f), root)
               for d, _, fs in os.walk(root) for f in fs]
    return sorted(p for p in out if SOURCE.search(p)
                  and os.path.isfile(os.path.join(root, p)))


def resolve(inc, src, files):
    """The tracked file an #include "inc" in `src` names, as the compiler
    would find it (-Iinclude -Isrc -I.), or None for a system header."""
    here = os.path.dirname(src)
    for cand in (os.path.join(here, inc), "src/" + inc, inc, "include/" + inc):
        cand = os.path.normpath(cand)
        if cand in files:
            return cand
    base = os.path.basename(inc)  # a flat tree with -I per folder
    hits = [f for f in files if os.path.basename(f) == base]
    return hits[0] if len(hits) == 1 else None


def graph(root):
    files = tracked_sources(root)
    fileset = set(files)
    edges = {}
    for f in files:
        with open(os.path.join(root, f), errors="replace") as fh:
            text = fh.read()
        edges[f] = sorted({t for t in (resolve(i, f, fileset)
                                       for i in INCLUDE.findall(text)) if t})
    return files, edges


def upward_includes(files, edges):
    bad = []
    for f in files:
        rf = room_of(f)
        if rf not in LAYER_OF:
            continue  # tests and examples may include anything
        for t in edges[f]:
            rt = room_of(t)
            if rt in LAYER_OF and LAYER_OF[rt] > LAYER_OF[rf]:
                bad.append(f"{f} includes {t}: {rf} may not include {rt}, "
                           f"a higher layer (docs/design.md)")
    return bad


def library_file(path):
    return not path.startswith(("tests/", "examples/"))


def cycles(files, edges):
    """Include cycles between modules (a module: a path without its
    extension, so engine.c and engine.h are one, and swap_impl.h is part of
    swap), as Tarjan's strongly connected components of more than one
    module."""
    # A private header X_impl.h, shared by the files that implement X, is
    # part of module X.
    mod = lambda p: re.sub(r"_impl$", "", os.path.splitext(p)[0])
    g = {}
    for f in files:
        if not library_file(f):
            continue
        g.setdefault(mod(f), set()).update(mod(t) for t in edges[f] if mod(t) != mod(f))
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(" <-> ".join(sorted(comp)))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def include_forms(root, files):
    """Includes name their room as the compiler sees it (-Iinclude -Isrc
    -I.): "zero/partition.h", "offload/swap.h", never "src/zero/..." or a
    path that climbs with "../"."""
    bad = []
    for f in files:
        with open(os.path.join(root, f), errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if inc.startswith(("src/", "../")) or "/../" in inc:
                bad.append(f'{f} includes "{inc}": name the room, as in "zero/partition.h"')
    return bad


def long_files(root, files):
    bad = []
    for f in files:
        if not f.startswith(SHIPPED):
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            bad.append(f"{f} has {n} lines (at most {MAX_LINES}): split it by job")
    return bad


CHECKS = [
    ("every include points to its own room or a lower layer", upward_includes),
    ("no include cycle between modules", cycles),
]


def run_checks(root):
    files, edges = graph(root)
    results = [(name, fn(files, edges)) for name, fn in CHECKS]
    results.append(("includes name their room", include_forms(root, files)))
    results.append((f"no shipped source file over {MAX_LINES} lines", long_files(root, files)))
    return results


def broken_tree():
    """A tree that breaks every rule once: offload includes the engine, two
    zero modules include each other, and one file is too long and names its
    header by its path from the top."""
    d = tempfile.mkdtemp(prefix="ztier-layers-")
    def put(path, text):
        os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(d, path), "w") as fh:
            fh.write(text)
    put("src/engine/engine.h", "")
    put("offload/pool.c", '#include "engine/engine.h"\n')
    put("src/zero/a.h", '#include "zero/b.h"\n')
    put("src/zero/b.c", '#include "zero/a.h"\n')
    put("src/zero/b.h", "")
    put("src/cpu/long.c", "\n" * (MAX_LINES + 1) + '#include "src/cpu/long.h"\n')
    return d


def tap(root):
    here = run_checks(root)
    scratch = broken_tree()
    try:
        broken = run_checks(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"1..{2 * len(here)}")
    n, failed = 0, 0
    for name, problems in here:
        n += 1
        if problems:
            failed += 1
            print(f"not ok {n} - {name}")
            for p in problems:
                print(f"#   {p}")
        else:
            print(f"ok {n} - {name}")
    for name, problems in broken:
        n += 1
        if problems:
            print(f"ok {n} - a tree made to break it fails: {name}")
        else:
            failed += 1
            print(f"not ok {n} - a tree made to break it passes: {name}")
    return 1 if failed else 0


def report(root):
    files, edges = graph(root)
    lines = {}
    for f in files:
        if not library_file(f) or f.startswith("include/"):
            continue
        room = f.split("/")[1] if f.startswith("src/") and f.count("/") > 1 else f.split("/")[0]
        with open(os.path.join(root, f), errors="replace") as fh:
            lines[room] = lines.get(room, 0) + sum(1 for _ in fh)
    total = sum(lines.values())
    print(f"rooms (lines of library, tool and bench code, {total} in all):")
    for room, n in sorted(lines.items(), key=lambda x: -x[1]):
        print(f"  {room:10s} {n:6d}  {100.0 * n / total:5.1f}%")
    cyc = cycles(files, edges)
    print(f"include cycles: {len(cyc)}")
    for c in cyc:
        print(f"  {c}")
    up = upward_includes(files, edges)
    print(f"upward includes: {len(up)}")
    for u in up:
        print(f"  {u}")
    longf = long_files(root, files)
    print(f"files over {MAX_LINES} lines: {len(longf)}")
    for x in longf:
        print(f"  {x}")


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) > 1 and sys.argv[1] == "--report":
        report(sys.argv[2] if len(sys.argv) > 2 else root)
        sys.exit(0)
    sys.exit(tap(root))

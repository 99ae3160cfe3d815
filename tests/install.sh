#!/usr/bin/env bash
# tests/install.sh BUILD — make install into a scratch root, then build
# README's snippet against it the way a user would, with pkg-config: linked
# to libztier.so, and linked to libztier.a with ztier.pc's private
# requirements; and once more from a build without MPI (make MPI=0 CUDA=0,
# the one-rank CPU user's), whose program must not need libmpi. Then make
# uninstall, which must leave nothing behind. TAP output, as the other
# suites' (tests/run.sh counts it); make test runs it through the wrapper
# $(BUILD)/tests/test_install.
#
# A sanitizer build is skipped as a whole: its library needs the
# sanitizer's runtime, which ztier.pc does not name (and need not).
set -uo pipefail
build=${1:?usage: tests/install.sh BUILD}
src=$(cd "$(dirname "$0")/.." && pwd)
settings=$(cat "$build/build-settings" 2>/dev/null) || {
  echo "not ok 1 - $build/build-settings: no build there"
  exit 1
}
if [[ "$settings" != *"SAN= "* ]]; then
  echo "# skipped: a sanitizer build ($settings); the plain build runs this suite"
  exit 77
fi
# Called from make test: the parent make's jobserver is not ours.
unset MAKEFLAGS MFLAGS MAKELEVEL

work=$(mktemp -d /tmp/ztier-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
n=0 failed=0
check() { # check NAME COMMAND...: one TAP line, the command's output on failure
  n=$((n + 1))
  local out
  if out=$("${@:2}" 2>&1); then
    echo "ok $n - $1"
  else
    echo "not ok $n - $1"
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/#   /'
    failed=1
  fi
}

# README's second C block (the wrapped update), inside a program: a model of
# the fields it uses, and a main that runs one step on random values and
# compares it with AdamW in double precision.
probe_source() {
  cat <<'EOF'
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct {
  float *params_memory, *grads_memory, *m_memory;
  size_t num_parameters;
} GPT2;
EOF
  awk '/^```c$/ { block++; keep = 0; next } /^```$/ { keep = 0 }
       block >= 1 && /^#include <ztier.h>/ { keep = 1 } keep' "$src/README.md"
  cat <<'EOF'
int main(void) {
  enum { N = 4099 };
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  GPT2 m = {malloc(N * 4), malloc(N * 4), NULL, N};
  double *p0 = malloc(N * sizeof(double));
  srand(7);
  for (size_t i = 0; i < N; i++) {
    m.params_memory[i] = (float)rand() / RAND_MAX - 0.5f;
    m.grads_memory[i] = ((float)rand() / RAND_MAX - 0.5f) * 1e-2f;
    p0[i] = m.params_memory[i];
  }
  gpt2_update(&m, lr, b1, b2, eps, wd, 1);
  double worst = 0;
  for (size_t i = 0; i < N; i++) {
    double g = m.grads_memory[i], mh = g, vh = g * g; /* step 1: bias-corrected */
    double want = p0[i] * (1 - (double)lr * wd) - lr * mh / (sqrt(vh) + eps);
    double d = fabs(m.params_memory[i] - want);
    if (d > worst) worst = d;
  }
  printf("largest difference from AdamW in double: %g\n", worst);
  return worst <= 1e-6 ? 0 : 1;
}
EOF
}
probe_source >"$work/probe.c"

# install ROOT BUILD [MAKE ARGS...]: ROOT is the prefix, so ztier.pc names it
install_into() {
  make --no-print-directory -s -C "$src" $3 BUILD="$2" PREFIX="$1" install
}
# pc ROOT ARGS...: pkg-config finding ztier.pc under ROOT, the others where they are
pc() {
  local root=$1
  shift
  PKG_CONFIG_PATH="$root/lib/pkgconfig" pkg-config "$@" ztier
}
link_dynamic() { # ROOT OUT
  gcc -o "$2" "$work/probe.c" $(pc "$1" --cflags --libs) -lm
}
link_static() { # ROOT OUT: libztier.a, and what ztier.pc says it needs
  gcc -o "$2" "$work/probe.c" $(pc "$1" --static --cflags --libs | sed 's/-lztier\b/-l:libztier.a/') -lm
}
runs() { # ROOT PROGRAM
  LD_LIBRARY_PATH="$1/lib" "$2"
}
needs() { # ROOT PROGRAM LIB: the program loads LIB (grep reads it whole: pipefail)
  local libs
  libs=$(LD_LIBRARY_PATH="$1/lib" ldd "$2") && grep -q "$3" <<<"$libs"
}
lacks() { ! needs "$@"; }
has_all() { # ROOT: every file make install names
  local f
  for f in include/ztier.h lib/libztier.a lib/libztier.so.0 lib/libztier.so \
    lib/pkgconfig/ztier.pc bin/ztier share/doc/ztier/README.md share/doc/ztier/docs/api.md; do
    [ -e "$1/$f" ] || { echo "missing: $f"; return 1; }
  done
}
empty_after_uninstall() { # ROOT BUILD [MAKE ARGS]
  make --no-print-directory -s -C "$src" $3 BUILD="$2" PREFIX="$1" uninstall || return 1
  local left
  left=$(find "$1" -type f -o -type l)
  [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}
requires_mpi() {
  local req
  req=$(pc "$1" --print-requires-private) && grep -q '^ompi-c' <<<"$req"
}

echo "1..14"
root="$work/root"
check "make install ($settings)" install_into "$root" "$build" "$settings"
check "it installs the header, both libraries, ztier.pc, the tool and the docs" has_all "$root"
check "README's snippet links to libztier.so by pkg-config" link_dynamic "$root" "$work/dyn"
check "and runs one AdamW step" runs "$root" "$work/dyn"
check "and loads libztier.so.0" needs "$root" "$work/dyn" libztier.so.0
check "README's snippet links to libztier.a by pkg-config --static" link_static "$root" "$work/static"
check "and runs one AdamW step" runs "$root" "$work/static"
check "and loads no libztier.so" lacks "$root" "$work/static" libztier.so
if [[ "$settings" == *"MPI=0"* ]]; then
  check "ztier.pc of a build without MPI requires no MPI" eval '! requires_mpi "$root"'
else
  check "ztier.pc of a build with MPI requires ompi-c (privately)" requires_mpi "$root"
fi
check "make uninstall leaves nothing" empty_after_uninstall "$root" "$build" "$settings"

# Without MPI: a build of its own, kept under this build's folder.
bare="$build/install-nompi" root="$work/root-nompi"
check "make install of a build with MPI=0 CUDA=0" install_into "$root" "$bare" "MPI=0 CUDA=0"
check "its ztier.pc requires no MPI" eval '! requires_mpi "$root"'
check "README's snippet links to it statically, without libmpi, and runs" \
  eval 'link_static "$root" "$work/bare" && runs "$root" "$work/bare" && lacks "$root" "$work/bare" libmpi'
check "and dynamically, without libmpi, and runs" \
  eval 'link_dynamic "$root" "$work/bare-dyn" && runs "$root" "$work/bare-dyn" && lacks "$root" "$work/bare-dyn" libmpi'
exit $failed

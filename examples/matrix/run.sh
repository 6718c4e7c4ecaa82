#!/bin/sh
# Compile matrix for kvidx.h: gcc and clang x -std=c11/c17/c2x x -O0/-O2,
# C++17 (g++ and clang++, and a C++ user TU linked to a C implementation),
# two translation units, KVIDX_STATIC (two private copies linked together),
# KVIDX_NO_MALLOC / KVIDX_NO_THREADS with nm proving which symbols are not
# referenced.  Warnings are errors:
#   -Wall -Wextra -Wpedantic -Wconversion -Wshadow -Werror
# Each configuration also runs a behavioural smoke test.  Prints one line per
# configuration, the first diagnostics of any failure, and a summary.
#
# Usage: examples/matrix/run.sh BUILD_DIR   (env CC CXX CLANG CLANGXX)
set -u
B=${1:-build}/matrix
CC=${CC:-cc}
CXX=${CXX:-c++}
CLANG=${CLANG:-}
CLANGXX=${CLANGXX:-}
M=examples/matrix
W="-Wall -Wextra -Wpedantic -Wconversion -Wshadow -Werror"
ok=0
bad=0
failed=""
rm -rf "$B" && mkdir -p "$B"

# run NAME CMD...: runs a shell command line, logs it, reports.
run() {
  name=$1; shift
  log="$B/$(echo "$name" | tr -c 'A-Za-z0-9_.\n-' '_').log"
  if sh -c "$*" >"$log" 2>&1; then
    ok=$((ok + 1)); echo "ok    $name"
  else
    bad=$((bad + 1)); failed="$failed
  $name"
    echo "FAIL  $name"; echo "      \$ $*"
    grep -E 'warning|error|FAILED|undefined|multiple definition| U ' "$log" | head -12 | sed 's/^/      /'
  fi
}

compilers="$CC"
[ -n "$CLANG" ] && compilers="$compilers $CLANG"
for c in $compilers; do
  cn=$(basename "$c")
  for std in c11 c17 c2x; do
    for opt in -O0 -O2; do
      o="$B/$cn-$std$opt"
      run "$cn -std=$std $opt two TUs" \
        "$c -std=$std $opt $W -I. -c $M/impl.c -o $o-impl.o && \
         $c -std=$std $opt $W -I. -c $M/user.c -o $o-user.o && \
         $c -o $o $o-impl.o $o-user.o -pthread && $o"
    done
  done
  run "$cn KVIDX_STATIC, two private copies" \
    "$c -std=c11 -O2 $W -I. -o $B/$cn-static $M/static_a.c $M/static_b.c -pthread && $B/$cn-static"
  for def in "-DKVIDX_NO_MALLOC" "-DKVIDX_NO_THREADS" "-DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS"; do
    o="$B/$cn-nm$(echo "$def" | tr -d ' =-')"
    pat=""
    case "$def" in *NO_MALLOC*) pat="malloc|calloc|realloc|free|aligned_alloc|posix_memalign" ;; esac
    case "$def" in *NO_THREADS*) pat="${pat:+$pat|}pthread_[a-z_]*|sched_yield|thrd_[a-z_]*|mtx_[a-z_]*" ;; esac
    run "$cn $def: nm shows no ${pat}" \
      "$c -std=c11 -O2 $W -I. $def -c $M/nomalloc.c -o $o.o && \
       ! nm $o.o | grep -E ' U ($pat)\$' && $c -o $o $o.o && $o"
  done
done

cxxs="$CXX"
[ -n "$CLANGXX" ] && cxxs="$cxxs $CLANGXX"
for cx in $cxxs; do
  cn=$(basename "$cx")
  o="$B/$cn-cxx17"
  run "$cn -std=c++17 two TUs" \
    "$cx -x c++ -std=c++17 -O2 $W -I. -c $M/impl.c -o $o-impl.o && \
     $cx -x c++ -std=c++17 -O2 $W -I. -c $M/user.c -o $o-user.o && \
     $cx -o $o $o-impl.o $o-user.o -pthread && $o"
  run "$cn -std=c++17 user TU linked to the C implementation" \
    "$CC -std=c11 -O2 $W -I. -c $M/impl.c -o $o-cimpl.o && \
     $cx -x c++ -std=c++17 -O2 $W -I. -c $M/user.c -o $o-user2.o && \
     $cx -o $o-mixed $o-cimpl.o $o-user2.o -pthread && $o-mixed"
done

[ -n "$failed" ] && echo "matrix: failed:$failed"
echo "matrix: $ok ok, $bad failed"
[ "$bad" -eq 0 ]

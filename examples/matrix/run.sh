#!/bin/sh
# Compile matrix for kvidx.h: gcc and clang x -std=c11/c17/c2x x -O0/-O2,
# C++11/14/17/20 (g++ and clang++, and a C++ user TU linked to a C
# implementation), two translation units, KVIDX_STATIC (two private copies
# linked together), KVIDX_NO_MALLOC / KVIDX_NO_THREADS with nm proving which
# symbols are not referenced, C99 with KVIDX_NO_THREADS; 32-bit: gcc and
# clang for armhf (run under qemu-arm); tcc (core tests, KVIDX_NO_THREADS);
# the core, edge, event, snapshot-bounds, hostile-prompt, generation and
# interleaving tests compiled and run as C++ (g++ optimized, clang++ under
# ASan+UBSan), and the thread stress under TSan as C++ (clang++).
# What must not build stops at one clear #error: C++98, C99 with threads,
# tcc with threads, an xxhash.h older than 0.8.0.  Warnings are errors:
#   -Wall -Wextra -Wpedantic -Wconversion -Wshadow -Wcast-align -Werror
# (the tests' own sources: the project's -Wall -Wextra -Wpedantic -Werror).
# Each configuration also runs a behavioural smoke test.  Prints one line per
# configuration, the first diagnostics of any failure, and a summary.
#
# Usage: examples/matrix/run.sh BUILD_DIR
#   env CC CXX CLANG CLANGXX SAN; TCC (tcc), CC32 (arm-linux-gnueabihf-gcc),
#   QEMU32 (qemu-arm-static), VECTORS (the hash vectors for tcc's core tests)
set -u
B=${1:-build}/matrix
CC=${CC:-cc}
CXX=${CXX:-c++}
CLANG=${CLANG:-}
CLANGXX=${CLANGXX:-}
M=examples/matrix
W="-Wall -Wextra -Wpedantic -Wconversion -Wshadow -Wcast-align -Werror"
WT="-Wall -Wextra -Wpedantic -Werror" # the tests' own sources: the project's flags
SAN=${SAN:-} # the Makefile's sanitizer flags (clang++ runs the C++ tests under them)
TCC=${TCC:-}
CC32=${CC32:-}
QEMU32=${QEMU32:-}
VECTORS=${VECTORS:-tests/dynamo_hash_vectors.json}
ok=0
bad=0
failed=""
rm -rf "$B" && mkdir -p "$B"

# must_fail NAME MESSAGE CMD...: the command must fail with exactly one
# diagnostic, the #error whose text contains MESSAGE.
must_fail() {
  name=$1; msg=$2; shift 2
  mf="$B/mf$((n + 1)).log" # the next job's own: jobs run side by side
  run "$name" "! ( $* ) >$mf 2>&1 && grep -q '$msg' $mf && \
    test \$(grep -c 'error:' $mf) -eq 1 && cat $mf"
}

# run NAME CMD...: runs a shell command line, logs it, reports.
# Jobs run $JOBS at a time (default: the machine's cores; CI has 15
# minutes for all of make test); results are reported in order at the end.
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
n=0
run() {
  name=$1; shift
  n=$((n + 1))
  log="$B/$(echo "$name" | tr -c 'A-Za-z0-9_.\n-' '_').log"
  printf '%s\n' "$name" >"$B/job$n.name"
  printf '%s\n' "$*" >"$B/job$n.cmd"
  printf '%s\n' "$log" >"$B/job$n.log"
  ( if sh -c "$*" >"$log" 2>&1; then echo ok; else echo FAIL; fi >"$B/job$n.rc" ) &
  [ $((n % JOBS)) -ne 0 ] || wait
}

report() {
  wait
  i=1
  while [ "$i" -le "$n" ]; do
    name=$(cat "$B/job$i.name"); log=$(cat "$B/job$i.log")
    if [ "$(cat "$B/job$i.rc" 2>/dev/null)" = ok ]; then
      ok=$((ok + 1)); echo "ok    $name"
    else
      bad=$((bad + 1)); failed="$failed
  $name"
      echo "FAIL  $name"; echo "      \$ $(cat "$B/job$i.cmd")"
      grep -E 'warning|error|FAILED|undefined|multiple definition| U ' "$log" | head -12 | sed 's/^/      /'
    fi
    i=$((i + 1))
  done
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
  for std in c++11 c++14 c++17 c++20; do
    o="$B/$cn-$std"
    run "$cn -std=$std two TUs" \
      "$cx -x c++ -std=$std -O2 $W -I. -c $M/impl.c -o $o-impl.o && \
       $cx -x c++ -std=$std -O2 $W -I. -c $M/user.c -o $o-user.o && \
       $cx -o $o $o-impl.o $o-user.o -pthread && $o"
  done
  o="$B/$cn-cxx17"
  must_fail "$cn -std=c++98: one clear #error" "needs C++11 or later" \
    "$cx -x c++ -std=c++98 -I. -c $M/impl.c -o $o-98.o"
  # the tests themselves as C++: the header's C++ branch (std::atomic, the
  # casts) runs the same checks as the C builds, not a smoke test only.
  # g++ builds them optimized; clang++ under the sanitizers the C builds run
  # under (SAN from the Makefile; unset: no sanitizers)
  case "$cn" in
    clang*) xo="-O1 -g $SAN"; xs="${SAN:+ under the Makefile's SAN}" ;;
    *) xo="-O2"; xs="" ;;
  esac
  run "$cn -std=c++17: core tests (semantics, differential, buffer mode) as C++$xs" \
    "$cx -x c++ -std=c++17 $xo $WT -I. -o $o-core tests/test_core.c tests/test_impl.c -pthread && \
     $o-core $VECTORS"
  run "$cn -std=c++17: edge, event, snapshot-bounds, hostile-prompt, generation, interleaving tests as C++$xs" \
    "$cx -x c++ -std=c++17 $xo $WT -I. -c tests/test_impl.c -o $o-timpl.o && \
     for t in test_edges test_events test_snapshot_bounds test_hostile_prompts; do \
       $cx -x c++ -std=c++17 $xo $WT -I. -o $o-\$t tests/\$t.c -x none $o-timpl.o -pthread && $o-\$t || exit 1; \
     done && $cx -x c++ -std=c++17 $xo $WT -I. -o $o-gen tests/test_generations.c -pthread && $o-gen && \
     $cx -x c++ -std=c++17 $xo $WT -I. -DKVIDX_TEST_DRAIN_STEP=1 -o $o-interleave tests/test_interleave.c -pthread && \
     $o-interleave"
  case "$cn" in clang*) # gcc's TSan does not support fences (-Wtsan): clang only, as test-threads-tsan
    run "$cn -std=c++17: thread stress under TSan as C++ (2 writers, 2 readers, 1 s per kind)" \
      "$cx -x c++ -std=c++17 -O1 -g $WT -I. -fsanitize=thread -o $o-threads tests/test_threads.c -pthread && \
       TSAN_OPTIONS=halt_on_error=1 $o-threads 1 2 2" ;;
  esac
  run "$cn -std=c++17 user TU linked to the C implementation" \
    "$CC -std=c11 -O2 $W -I. -c $M/impl.c -o $o-cimpl.o && \
     $cx -x c++ -std=c++17 -O2 $W -I. -c $M/user.c -o $o-user2.o && \
     $cx -o $o-mixed $o-cimpl.o $o-user2.o -pthread && $o-mixed"
done

# C99: fine single-threaded, a clear #error with threads
for c in $compilers; do
  cn=$(basename "$c")
  o="$B/$cn-c99"
  run "$cn -std=c99 KVIDX_NO_THREADS two TUs" \
    "$c -std=c99 -O2 $W -I. -DKVIDX_NO_THREADS -c $M/impl.c -o $o-impl.o && \
     $c -std=c99 -O2 $W -I. -DKVIDX_NO_THREADS -c $M/user.c -o $o-user.o && \
     $c -o $o $o-impl.o $o-user.o && $o"
  must_fail "$cn -std=c99 with threads: one clear #error" "C before C11 has no atomics" \
    "$c -std=c99 -I. -c $M/impl.c -o $o-thr.o"
done

# an xxhash.h older than 0.8.0 (XXH3's output was not frozen yet)
mkdir -p "$B/oldxxhash"
sed -e 's/^#define XXH_VERSION_MINOR .*/#define XXH_VERSION_MINOR    7/' \
    -e 's/^#define XXH_VERSION_RELEASE .*/#define XXH_VERSION_RELEASE  3/' \
    /usr/include/xxhash.h >"$B/oldxxhash/xxhash.h"
must_fail "$CC with xxhash.h 0.7.3: #error" "xxhash.h 0.8.0 or later needed" \
  "$CC -std=c11 -I$B/oldxxhash -I. -c $M/impl.c -o $B/oldxx.o"

# 32-bit (armhf): gcc and clang, run under qemu-user
if [ -n "$CC32" ]; then
  for c in "$CC32" ${CLANG:+"$CLANG --target=arm-linux-gnueabihf"}; do
    cn=$(echo "$c" | tr ' =' '__' | sed 's|.*/||')
    o="$B/$cn-32"
    run "$c -std=c11 32-bit armhf two TUs" \
      "$c -std=c11 -O2 $W -I. -c $M/impl.c -o $o-impl.o && \
       $c -std=c11 -O2 $W -I. -c $M/user.c -o $o-user.o && \
       $CC32 -static -o $o $o-impl.o $o-user.o -pthread && $QEMU32 $o"
    run "$c -std=c11 32-bit armhf KVIDX_NO_MALLOC KVIDX_NO_THREADS" \
      "$c -std=c11 -O2 $W -I. -DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS -c $M/nomalloc.c -o $o-nm.o"
  done
fi

# tcc: single-threaded only (no <stdatomic.h>): builds and passes the core tests
if [ -n "$TCC" ]; then
  run "tcc KVIDX_NO_THREADS: core tests" \
    "$TCC -std=c11 -Wall -Werror -I. -DKVIDX_NO_THREADS -o $B/tcc-core tests/test_core.c tests/test_impl.c && \
     $B/tcc-core $VECTORS"
  run "tcc KVIDX_NO_THREADS two TUs" \
    "$TCC -std=c11 -Wall -Werror -I. -DKVIDX_NO_THREADS -o $B/tcc-2tu $M/impl.c $M/user.c && $B/tcc-2tu"
  must_fail "tcc with threads: one clear #error" "has no <stdatomic.h>" \
    "$TCC -std=c11 -I. -c $M/impl.c -o $B/tcc-thr.o"
fi

report
[ -n "$failed" ] && echo "matrix: failed:$failed"
echo "matrix: $ok ok, $bad failed"
[ "$bad" -eq 0 ]

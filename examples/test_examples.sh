#!/bin/sh
# Runs every example built by `make examples` and checks its output for the
# content it must show.  Usage: examples/test_examples.sh BUILD_DIR
set -u
B=${1:-build}
E=$B/examples
pass=0
fail=0

# check NAME CMD PATTERN...: runs CMD (must exit 0), then every extended
# regex PATTERN must match some line of its output.
check() {
  name=$1 cmd=$2; shift 2
  out=$E/$name.out
  if ! sh -c "$cmd" >"$out" 2>&1; then
    echo "FAIL  $name: '$cmd' exited non-zero"; sed 's/^/      /' "$out" | tail -20
    fail=$((fail + 1)); return
  fi
  for p in "$@"; do
    if ! grep -Eq -- "$p" "$out"; then
      echo "FAIL  $name: output lacks /$p/"; sed 's/^/      /' "$out" | tail -20
      fail=$((fail + 1)); return
    fi
  done
  echo "ok    $name"
  pass=$((pass + 1))
}

check demo_basic "$B/demo_basic" \
  '^1\. hashed 100 tokens into 6 blocks of 16' \
  'block 0: local d47a8f41c833328a' \
  'worker 1 \(dp_rank 0\): 6 of 6 blocks cached' \
  'worker 2 \(dp_rank 0\): 2 of 6 blocks cached' \
  'worker 1 \(dp_rank 0\): 3 of 6 blocks cached'

check basic "$E/basic" \
  '^store with unknown parent: ' \
  '^prompt of 8 blocks, 2 workers match$' \
  '^worker 10 dp_rank 0 depth 8$' \
  '^worker 20 dp_rank 0 depth 3$' \
  '^worker 20 holds 3 blocks$'

check router "$E/router" \
  '^kv-aware T=0 +[0-9.]+%' '^kv-aware T=0\.5 +[0-9.]+%' \
  '^least-loaded +[0-9.]+%' '^random +[0-9.]+%' \
  'index overlap matched the simulated caches on every request' \
  'kv-aware routing hits .* random: better'
# Same seed, same result: the softmax sampling is reproducible.
check router_seeded "$E/router --temperature 0.7 --seed 9 --requests 200 >$E/r1 && \
  $E/router --temperature 0.7 --seed 9 --requests 200 >$E/r2 && cmp $E/r1 $E/r2 && cat $E/r1" \
  '^kv-aware T=0\.7 '

check embedded "$E/embedded" \
  '^positional: memory [0-9]+ bytes for 2048 blocks' \
  'holding 2048 blocks, then: ' \
  'after clearing worker 0, store: ' \
  '^embedded: ok, no heap allocation$'
check embedded_nm "! nm $E/embedded.o | grep -E ' U (malloc|calloc|realloc|free|pthread_[a-z_]*)\$' && echo no-alloc-symbols" \
  '^no-alloc-symbols$'

check threads "$E/threads positional 3" \
  'reader violations 0, final-state mismatches 0' '^threads: ok$'
check threads_radix "$E/threads radix 3" \
  'reader violations 0, final-state mismatches 0' '^threads: ok$'

echo "test-examples: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

# Sourced by run_dynamo.sh and run_floor.sh: what the side-by-side suites
# share.  Sets DYNAMO_FILES (the mock-engine configurations of issue 12's
# four files, lines "label|kvidx-bench workload flags", and W16 C16384 with
# the seqs an engine with its own block hashes publishes) and defines
#   field LINE KEY   the value of KEY=... in a key=value result line;
#   median           the median of the numbers on stdin, one per line (of an
#                    even count, the mean of the middle two), %.4f;
#   find_dynamo      builds dynamo-replay from ANCHOR (its build.sh) and
#                    sets DYN to its path, or to "" with a note when ANCHOR
#                    is missing or the build fails.
DYNAMO_FILES="W16 C2048 F1|-W 16 -C 2048 -F 1
W16 C16384 F1|-W 16 -C 16384 -F 1
W64 C16384 F16|-W 64 -C 16384 -F 16
W16 C2048 F1, 20% collisions|-W 16 -C 2048 -F 1 --collide 0.2
W16 C16384 F1, opaque seqs|-W 16 -C 16384 -F 1 --opaque-seqs"

field() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.4f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

find_dynamo() {
  DYN=""
  if [ -d "$ANCHOR" ]; then
    echo "=== building dynamo-replay ($ANCHOR/build.sh)"
    DYN=$(sh "$ANCHOR/build.sh") || { echo "NOTE: dynamo-replay failed to build: the Dynamo side is skipped"; DYN=""; }
  else
    echo "NOTE: $ANCHOR not found: the Dynamo side is skipped (kvidx figures only)"
  fi
}

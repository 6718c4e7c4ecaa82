#!/bin/sh
# Event-file round trip for `make test-bench`: the in-process replay and the
# replay of the written event file must give the same answers.
#   1. in-process run (all kinds) -> "score sums" line (sum of every score);
#   2. --write-events FILE of the same stream;
#   3. --replay FILE --time 1 for each kind: checksum (sum of scores) equals 1.'s,
#      no apply errors;
#   4. per-query answers: radix and reference equal positional's (--expect);
#   5. malformed event files are rejected;
#   6. --seq-floor runs and its seq tables end as full as the index;
#   7. --walk-floor's counting copy answers as kvidx does and counts steps;
#   8. --opaque-seqs: the same stream with every seq remapped (S and R lines
#      differ, Q lines do not) replays to the same checksum.
# Usage: test_events.sh BENCH_BIN DIR WORKLOAD_FLAGS...
set -u
b=$1 dir=$2
shift 2
f="$dir/test-events.ev"
out=$("$b" "$@" --kinds positional,radix,reference) || { echo "in-process run failed"; echo "$out"; exit 1; }
sums=$(printf '%s\n' "$out" | grep '^score sums') || { echo "no 'score sums' line"; exit 1; }
want=$(printf '%s\n' "$sums" | sed -n 's/.* positional=\([0-9]*\).*/\1/p')
[ -n "$want" ] || { echo "cannot read the positional score sum: $sums"; exit 1; }
for k in radix reference; do
  printf '%s\n' "$sums" | grep -q " $k=$want" || { echo "in-process kinds disagree: $sums"; exit 1; }
done
"$b" "$@" --write-events "$f" || { echo "--write-events failed"; exit 1; }
for k in positional radix reference; do
  l=$("$b" --replay "$f" --kind "$k" --time 1 2>/dev/null) || { echo "--replay --kind $k --time 1 failed: $l"; exit 1; }
  echo "$l"
  case " $l " in
    *" checksum=$want apply_errors=0 "*) ;;
    *) echo "replay ($k) checksum differs from the in-process run's score sum $want"; exit 1 ;;
  esac
done
"$b" --replay "$f" --kind positional >"$dir/test-answers.txt" 2>/dev/null || { echo "--replay (answers) failed"; exit 1; }
[ "$(grep -c '^Q' "$f")" = "$(wc -l <"$dir/test-answers.txt" | tr -d ' ')" ] || { echo "one answer line per Q expected"; exit 1; }
for k in radix reference; do
  "$b" --replay "$f" --kind "$k" --expect "$dir/test-answers.txt" 2>/dev/null || { echo "kind $k answers differ from positional's"; exit 1; }
done
bad="$dir/test-bad.ev"
for line in 'S 1 - 2 10 11' 'S 1 - 0' 'R 1 1' 'Q 3 1 2' 'X 1' 'S 1 - 1 10 11 12' 'Q 1 18446744073709551616' 'S 1 x 1 10 11'; do
  printf '%s\n' "$line" >"$bad"
  if "$b" --replay "$bad" >/dev/null 2>&1; then echo "malformed event line accepted: $line"; exit 1; fi
done
printf 'S 1 - 2 10 11 12 13\nQ 2 10 12\nR 1 1 13\nQ 2 10 12\nC 1\nQ 1 10\n' >"$bad"
a=$("$b" --replay "$bad" 2>/dev/null | tr '\n' '/')
[ "$a" = "1:2/1:1//" ] || { echo "hand-made event file: answers '$a', want '1:2/1:1//'"; exit 1; }
# the same file through a pipe (read as it comes, no size known ahead) and
# without its last newline
a=$(printf 'S 1 - 2 10 11 12 13\nQ 2 10 12\nR 1 1 13\nQ 2 10 12\nC 1\nQ 1 10' | "$b" --replay /dev/stdin 2>/dev/null | tr '\n' '/')
[ "$a" = "1:2/1:1//" ] || { echo "event file from a pipe, no last newline: answers '$a', want '1:2/1:1//'"; exit 1; }
l=$(cat "$f" | "$b" --replay /dev/stdin --time 1 2>/dev/null) || { echo "--replay /dev/stdin --time 1 failed: $l"; exit 1; }
case " $l " in
  *" checksum=$want apply_errors=0 "*) ;;
  *) echo "replay from a pipe: checksum differs from the in-process run's score sum $want"; exit 1 ;;
esac
# --seq-floor: the seq tables alone end holding what the index holds (the
# mode dies otherwise), on the written file and on the hand-made one
for ev in "$f" "$bad"; do
  l=$("$b" --replay "$ev" --seq-floor --time 1 2>&1) || { echo "--seq-floor on $ev failed: $l"; exit 1; }
  case " $l " in
    *" seq_share="*" apply_errors=0 "*) ;;
    *) echo "--seq-floor on $ev: unexpected line: $l"; exit 1 ;;
  esac
done
# --walk-floor: the counting copy answers as kvidx does (the mode dies
# otherwise), and its walk counted: every query probes the child map at
# least once (the root), and the slowest read runs
l=$("$b" --replay "$f" --walk-floor --time 1 2>&1) || { echo "--walk-floor failed: $l"; exit 1; }
printf '%s\n' "$l" | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
  END { ok = v["all_probes"] >= 1 && v["slow_runs_probed"] + v["slow_runs_hinted"] > 0 && v["miss_ns"] > 0 &&
          v["slow_queries"] >= 1 && v["apply_errors"] == "0"; exit !ok }' || { echo "--walk-floor: unexpected line: $l"; exit 1; }
if "$b" --replay "$f" --walk-floor --kind reference --time 1 >/dev/null 2>&1; then echo "--walk-floor accepted the reference kind"; exit 1; fi
grep '^Q' "$f" >"$dir/test-queries.ev" # queries alone: a file with no workers
l=$("$b" --replay "$dir/test-queries.ev" --walk-floor --time 1 2>&1) || { echo "--walk-floor on queries alone failed: $l"; exit 1; }
# --opaque-seqs: seqs as an engine with its own block hashes publishes
# them; answers are matched on locals, so they stay the same
o="$dir/test-events-opaque.ev"
"$b" "$@" --opaque-seqs --write-events "$o" || { echo "--opaque-seqs --write-events failed"; exit 1; }
[ "$(grep '^Q' "$f" | cksum)" = "$(grep '^Q' "$o" | cksum)" ] || { echo "--opaque-seqs changed the Q lines"; exit 1; }
for t in S R; do
  if [ "$(grep "^$t" "$f" | cksum)" = "$(grep "^$t" "$o" | cksum)" ]; then echo "--opaque-seqs left the $t lines as they were"; exit 1; fi
done
l=$("$b" --replay "$o" --kind positional --time 1 2>/dev/null) || { echo "--replay of the opaque-seq file failed: $l"; exit 1; }
case " $l " in
  *" checksum=$want apply_errors=0 "*) ;;
  *) echo "opaque-seq replay: checksum differs from the in-process run's score sum $want: $l"; exit 1 ;;
esac
if "$b" --opaque-seqs >/dev/null 2>&1; then echo "--opaque-seqs accepted without --write-events"; exit 1; fi
echo "event file round trip: ok (score sum $want)"

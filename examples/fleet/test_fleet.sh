#!/bin/sh
# test_fleet.sh BUILD_DIR - fault test of the kvidx router fleet on NATS
# JetStream (examples/fleet/README.md).  Loopback only, temp dirs only.
#
#   1. the mock engine (kvidx-bench --write-events) writes an event file over
#      the bundled trace; `kvidx-fleet direct` feeds it into one index and
#      answers a fixed query set: the reference;
#   2. nats-server -js (file storage, random free port), a bridge (rate
#      limited so the faults land mid-stream) and 3 replicas; mid-stream:
#      kill -9 a replica and restart it, kill -9 the bridge and restart it
#      (it republishes its last events on purpose: the stream must drop
#      them), restart nats-server;
#   3. the stream holds each event exactly once; every replica applied every
#      sequence once (no gaps, no duplicates, no errors) and answers the query
#      set exactly as the reference;
#   4. catch-up times: restarted replica from its snapshot vs an empty start;
#   5. trimmed stream: a replica whose snapshot is older than the stream's
#      first event says so and refuses queries; with a fresh snapshot, fine;
#   6. throughput: bridge -> JetStream -> replica, unthrottled.
set -u
B=${1:?usage: test_fleet.sh BUILD_DIR}
FLEET=$B/kvidx-fleet
BENCH=$B/kvidx-bench
TRACE=bench/data/mooncake_conversation_trace.jsonl.gz
RATE=${FLEET_RATE:-4000}

T=$(mktemp -d /tmp/kvidx-fleet.XXXXXX) || exit 1
PIDS=""
NS_PID=""
cleanup() {
  for p in $PIDS $NS_PID; do kill "$p" 2>/dev/null; done
  sleep 0.3
  for p in $PIDS $NS_PID; do kill -9 "$p" 2>/dev/null; done
  if [ -n "${FLEET_KEEP:-}" ]; then echo "test-fleet: kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT INT TERM

fail() {
  echo "test-fleet: FAIL: $*"
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 8 "$f"; }; done
  exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

[ -x "$FLEET" ] || fail "$FLEET not built"
[ -f "$TRACE" ] || fail "trace $TRACE not found (bench/data is part of the repository)"
command -v nats-server >/dev/null || fail "nats-server not installed (Debian package nats-server)"

# ---- 1. event file and reference ------------------------------------------------
"$BENCH" --write-events "$T/ev.txt" --trace "$TRACE" --max-requests 12100 -C 512 -D 2 -q \
  || fail "kvidx-bench --write-events"
NEV=$(grep -c '^[SRC] ' "$T/ev.txt")
[ "$NEV" -ge 20000 ] || fail "event file has only $NEV events"
"$FLEET" direct --file "$T/ev.txt" --queries-out "$T/q.txt" --query-every 2 --max-queries 1000 \
  > "$T/ref.txt" 2> "$T/direct.log" || fail "direct reference"
grep -q 'errors=0 gaps=0 malformed=0' "$T/direct.log" || fail "reference: $(cat "$T/direct.log")"
NQ=$(wc -l < "$T/q.txt")
echo "test-fleet: $NEV events, $NQ queries; reference: $(cat "$T/direct.log")"

# ---- NATS server ------------------------------------------------------------------
PORT=""
start_server() { # port ready_count
  touch "$T/nats.log"
  nats-server -js -a 127.0.0.1 -p "${1:--1}" -sd "$T/store" >> "$T/nats.log" 2>&1 &
  NS_PID=$!
  i=0
  while [ $i -lt 100 ]; do
    n=$(grep -c 'Server is ready' "$T/nats.log")
    [ "$n" -ge "${2:-1}" ] && break
    sleep 0.1; i=$((i + 1))
  done
  [ $i -lt 100 ] || fail "nats-server did not start"
}
start_server -1 1
PORT=$(grep -o 'client connections on 127.0.0.1:[0-9]*' "$T/nats.log" | head -n 1 | sed 's/.*://')
[ -n "$PORT" ] || fail "no port in nats.log"
URL=nats://127.0.0.1:$PORT
echo "test-fleet: nats-server $(nats-server --version | sed 's/.*v//') on $URL, store $T/store"

start_replica() { # name [extra args] ; sets RPID
  n=$1; shift
  touch "$T/$n.out" "$T/$n.log"
  "$FLEET" replica --nats "$URL" --name "$n" --listen "$T/$n.sock" --snap-every 5000 --snap-secs 1 "$@" \
    >> "$T/$n.out" 2>> "$T/$n.log" &
  RPID=$!
  PIDS="$PIDS $RPID"
}
status() { echo STATUS | "$FLEET" ask "$T/$1.sock" 2>/dev/null; }
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
wait_caught_up() { # name seq seconds
  i=0; lim=$(($3 * 10))
  while [ $i -lt $lim ]; do
    s=$(status "$1")
    [ "$(echo "$s" | field applied_seq)" = "$2" ] && echo "$s" | grep -q 'ready=1' && return 0
    sleep 0.1; i=$((i + 1))
  done
  fail "replica $1 did not reach seq $2 in $3 s (last status: $s)"
}

# ---- 2. the fleet, with faults ------------------------------------------------------
start_replica r1; P1=$RPID
start_replica r2 --blocks-per-worker 512; P2=$RPID # seq tables made at the file's C: same answers
start_replica r3; P3=$RPID
sleep 0.5
"$FLEET" bridge --nats "$URL" --file "$T/ev.txt" --rate "$RATE" > "$T/bridge1.out" 2> "$T/bridge1.log" &
BR=$!; PIDS="$PIDS $BR"
sleep 2
kill -9 "$P2"; echo "test-fleet: kill -9 replica r2 at seq $(status r1 | field applied_seq)"
sleep 1
start_replica r2; P2=$RPID
sleep 1.5
kill -9 "$BR"; wait "$BR" 2>/dev/null
echo "test-fleet: kill -9 bridge; restarting it with --rewind 300 (republishes 300 events per worker)"
"$FLEET" bridge --nats "$URL" --file "$T/ev.txt" --rate "$RATE" --rewind 300 > "$T/bridge2.out" 2> "$T/bridge2.log" &
BR=$!; PIDS="$PIDS $BR"
sleep 2
echo "test-fleet: restarting nats-server at seq $(status r1 | field applied_seq)"
kill "$NS_PID"; wait "$NS_PID" 2>/dev/null
start_server "$PORT" 2
i=0
while kill -0 "$BR" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 "$BR" 2>/dev/null && fail "bridge did not finish within 60 s"
wait "$BR" || fail "bridge exited with an error"
cat "$T/bridge2.out"
grep -q 'reconnects=[1-9]' "$T/bridge2.out" || fail "the bridge never saw the server restart"
DUPS=$(field duplicates_dropped_by_stream < "$T/bridge2.out")
[ "${DUPS:-0}" -gt 0 ] || fail "the rewound events were not dropped as duplicates by the stream"

# ---- 3. exactly once, same answers ------------------------------------------------------
"$FLEET" info --nats "$URL" > "$T/info.txt" || fail "info"
INFO=$(head -n 1 "$T/info.txt")
SNAPMSGS=$(sed -n 's/^snapshot stream: msgs=\([0-9]*\).*/\1/p' "$T/info.txt")
# the head and a few snapshots' chunks (4 each; racing writers each keep
# their predecessor's): without purging, all ~35 written (~140 messages)
[ "${SNAPMSGS:-999}" -le 41 ] || fail "snapshot stream keeps old snapshots: $(tail -n 1 "$T/info.txt")"
[ "$INFO" = "first=1 last=$NEV msgs=$NEV" ] || fail "stream is '$INFO', want first=1 last=$NEV msgs=$NEV"
echo "test-fleet: stream holds each of the $NEV events once ($INFO); $(tail -n 1 "$T/info.txt")"
for r in r1 r2 r3; do
  wait_caught_up $r "$NEV" 30
  s=$(status $r)
  for k in gaps errors malformed dup_skipped rebuilds; do
    [ "$(echo "$s" | field $k)" = 0 ] || fail "replica $r: $k != 0 ($s)"
  done
  # each sequence applied once: from the snapshot on, every event exactly once
  [ $(($(echo "$s" | field events) + $(echo "$s" | field snapshot_loaded_seq))) = "$NEV" ] ||
    fail "replica $r: events + snapshot_loaded_seq != $NEV ($s)"
  "$FLEET" ask "$T/$r.sock" < "$T/q.txt" > "$T/$r.ans" || fail "ask $r"
  cmp -s "$T/$r.ans" "$T/ref.txt" || fail "replica $r answers differ from the reference: $(diff "$T/$r.ans" "$T/ref.txt" | head -n 4)"
  echo "test-fleet: replica $r: $NQ answers identical to the reference; $s"
done
grep -h 'caught up' "$T/r2.out" | tail -n 1 | sed 's/^/test-fleet: mid-stream restart: /'

# ---- 4. catch-up: from the snapshot vs from empty -------------------------------------------
kill -9 "$P1"
start_replica r1; P1=$RPID
wait_caught_up r1 "$NEV" 30
start_replica r4 --no-snapshot
wait_caught_up r4 "$NEV" 60
SNAPLINE=$(grep -h 'caught up' "$T/r1.out" | tail -n 1)
EMPTYLINE=$(grep -h 'caught up' "$T/r4.out" | tail -n 1)
echo "test-fleet: catch-up from snapshot: $SNAPLINE"
echo "test-fleet: catch-up from empty:    $EMPTYLINE"
echo "$SNAPLINE" | grep -q 'snapshot none' && fail "r1 restarted without a snapshot"
for r in r1 r4; do
  "$FLEET" ask "$T/$r.sock" < "$T/q.txt" | cmp -s - "$T/ref.txt" || fail "replica $r answers differ after catch-up"
done

# ---- 5. trimmed stream ------------------------------------------------------------------------
# fresh streams (prefix trim): half the file, a snapshot, the rest, then
# retention drops all but the last 100 events: the snapshot is too old.
# Replica t0 follows all along but writes no snapshot until asked.
touch "$T/t0.out" "$T/t0.log" "$T/t1.out" "$T/t1.log" "$T/t2.out" "$T/t2.log" "$T/p1.out"
HALF=$(grep -n '^[SRC] ' "$T/ev.txt" | sed -n "$((NEV / 2))p" | cut -d: -f1)
head -n "$HALF" "$T/ev.txt" > "$T/half.txt"
"$FLEET" bridge --nats "$URL" --prefix trim --file "$T/half.txt" > /dev/null 2> "$T/trim-bridge.log" || fail "trim: bridge half"
"$FLEET" replica --nats "$URL" --prefix trim --name t0 --listen "$T/t0.sock" --snap-every 0 --snap-secs 100000 \
  > "$T/t0.out" 2> "$T/t0.log" &
PIDS="$PIDS $!"
"$FLEET" replica --nats "$URL" --prefix trim --name t1 --listen "$T/t1.sock" --snap-secs 0.2 \
  > "$T/t1.out" 2> "$T/t1.log" &
TP=$!; PIDS="$PIDS $TP"
i=0
while ! grep -q 'caught up' "$T/t1.out" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
i=0
while [ "$(status t1 | field snapshots_written)" != 1 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ $i -lt 50 ] || fail "trim: replica t1 wrote no snapshot"
kill "$TP"; wait "$TP" 2>/dev/null
"$FLEET" bridge --nats "$URL" --prefix trim --file "$T/ev.txt" > /dev/null 2>> "$T/trim-bridge.log" || fail "trim: bridge rest"
wait_caught_up t0 "$NEV" 30 # (trimmed under it, t0 would have to rebuild too)
TINFO=$("$FLEET" purge --nats "$URL" --prefix trim --keep 100 | head -n 1) || fail "purge"
"$FLEET" replica --nats "$URL" --prefix trim --name t2 --listen "$T/t2.sock" > "$T/t2.out" 2> "$T/t2.log" &
TP=$!; PIDS="$PIDS $TP"
i=0
while ! grep -q 'trimmed past snapshot' "$T/t2.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
grep -q 'trimmed past snapshot' "$T/t2.log" || fail "trimmed stream: replica did not say so"
A=$(head -n 1 "$T/q.txt" | "$FLEET" ask "$T/t2.sock")
case "$A" in "ERR not ready: stream trimmed past snapshot"*) ;; *) fail "trimmed stream: replica answered '$A'" ;; esac
status t2 | grep -q 'ready=0' || fail "trimmed stream: replica claims ready"
echo "test-fleet: trimmed stream ($TINFO): replica refuses: $(grep -h 'trimmed past' "$T/t2.log" | head -n 1 | sed 's/^kvidx-fleet replica: //')"
# rebuild: t0, which kept up, writes a snapshot; t2 picks it up and serves
TLAST=$(echo "$TINFO" | sed 's/.*last=\([0-9]*\).*/\1/')
wait_caught_up t0 "$TLAST" 30
echo SNAPSHOT | "$FLEET" ask "$T/t0.sock" > /dev/null
wait_caught_up t2 "$TLAST" 30
"$FLEET" ask "$T/t2.sock" < "$T/q.txt" | cmp -s - "$T/ref.txt" || fail "t2 after rebuild differs from the reference"
echo "test-fleet: trimmed stream: after replica t0 wrote a fresh snapshot, t2 rebuilt from it and answers as the reference ($(status t2 | sed 's/.*\(snapshot_loaded_seq=[0-9]*\).*\(rebuilds=[0-9]*\).*/\1 \2/'))"
kill "$TP"; wait "$TP" 2>/dev/null
# the main streams trimmed to their last 100 events: snapshot-based replicas
# still start (their snapshot covers the gap), an empty one must refuse
"$FLEET" purge --nats "$URL" --keep 100 > /dev/null || fail "purge main"
start_replica r5
wait_caught_up r5 "$NEV" 30
"$FLEET" ask "$T/r5.sock" < "$T/q.txt" | cmp -s - "$T/ref.txt" || fail "r5 (snapshot after trim) differs"
start_replica r6 --no-snapshot
i=0
while ! grep -q 'trimmed past snapshot' "$T/r6.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
grep -q 'trimmed past snapshot' "$T/r6.log" || fail "empty replica on a trimmed stream did not refuse"
echo "test-fleet: main stream trimmed to 100 events: snapshot replica serves correct answers, empty replica refuses"

# ---- 6. throughput ------------------------------------------------------------------------------
"$FLEET" replica --nats "$URL" --prefix tput --name p1 --listen "$T/p1.sock" --batch 1024 \
  --snap-every 0 --snap-secs 3600 > "$T/p1.out" 2> "$T/p1.log" &
PIDS="$PIDS $!"
i=0
while ! grep -q 'caught up' "$T/p1.out" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
t0=$(now)
"$FLEET" bridge --nats "$URL" --prefix tput --file "$T/ev.txt" > "$T/tput-bridge.out" 2> "$T/tput-bridge.log" || fail "throughput bridge"
wait_caught_up p1 "$NEV" 60
t1=$(now)
E2E=$(elapsed "$t0" "$t1")
BRATE=$(field events_per_s < "$T/tput-bridge.out")
echo "test-fleet: throughput: bridge published $NEV events at $BRATE events/s (acked by JetStream);"
echo "test-fleet: throughput: end to end (bridge start -> replica applied all) $E2E s = $(awk -v n="$NEV" -v s="$E2E" 'BEGIN { printf "%.0f", n / s }') events/s"
echo "test-fleet: ok"

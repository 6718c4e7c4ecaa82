# bench/bench.mk - kvidx-bench: Mooncake trace replay benchmarks.
# Included by the top Makefile (uses CC, CLANG, CFLAGS_BASE, BUILD, PTHREAD,
# deps).  Targets:
#   make bench        standard suite (< 5 min on 2 cores) -> bench/results/latest.md
#   make demo-bench   routing showcase: kvidx-guided vs random cache-hit rate
#   make bench-dynamo side by side with Dynamo's indexers (dynamo-replay) on the
#                     same event files -> bench/results/dynamo.md (a few minutes)
#   make bench-floor  the worker seq tables' share of the event lines and what the
#                     2x-arena_c target leaves; the slowest queries' walk steps
#                     -> bench/results/floor.md (4-5 minutes)
#   make bench-growth growth latency to 4M blocks + writer scaling -> bench/results/growth.md
#   make test-bench   smoke test: kinds must agree on every score (< 30 s)
# Tool help: build/kvidx-bench --help.  Docs: bench/README.md.

BENCH_TRACE  ?= bench/data/mooncake_conversation_trace.jsonl.gz
BENCH_SRC    := bench/kvidx-bench.c bench/walk_floor.c
BENCH_CFLAGS ?= $(CFLAGS_BASE)
BENCH_LIBS   := $(PTHREAD) -lm

.PHONY: bench demo-bench test-bench bench-dynamo bench-dynamo-keep bench-floor bench-growth

$(BUILD)/kvidx-bench: $(BENCH_SRC) bench/walk_floor.h kvidx.h | deps
	@mkdir -p $(BUILD)
	$(CC) $(BENCH_CFLAGS) -o $@ $(BENCH_SRC) $(BENCH_LIBS)

# variants compiled by test-bench: clang, and a KVIDX_NO_THREADS build
$(BUILD)/kvidx-bench-clang: $(BENCH_SRC) bench/walk_floor.h kvidx.h | deps
	@mkdir -p $(BUILD)
	$(CLANG) $(CFLAGS_BASE) -o $@ $(BENCH_SRC) $(BENCH_LIBS)

$(BUILD)/kvidx-bench-nothreads: $(BENCH_SRC) bench/walk_floor.h kvidx.h | deps
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_BASE) -DKVIDX_NO_THREADS -o $@ $(BENCH_SRC) -lm

bench: $(BUILD)/kvidx-bench
	@sh bench/run_suite.sh $(BUILD)/kvidx-bench $(BENCH_TRACE) bench/results

# kvidx and Dynamo's indexers on identical event files, in one run.  Needs
# ../shared/anchors/dynamo (its build.sh builds dynamo-replay); without it the
# Dynamo side is skipped with a note.
bench-dynamo: $(BUILD)/kvidx-bench
	@sh bench/run_dynamo.sh $(BUILD)/kvidx-bench $(BENCH_TRACE) bench/results

# The same with glibc keeping freed memory in both processes -> dynamo-keep.md.
bench-dynamo-keep: $(BUILD)/kvidx-bench
	@HEAP=keep sh bench/run_dynamo.sh $(BUILD)/kvidx-bench $(BENCH_TRACE) bench/results

# The worker seq tables' share of the event lines, and the event time the
# 2x-arena_c target leaves (issue 12); the slowest 1% of queries' dependent
# walk steps beside the machine's cache-miss latency -> bench/results/floor.md.
bench-floor: $(BUILD)/kvidx-bench
	@sh bench/run_floor.sh $(BUILD)/kvidx-bench $(BENCH_TRACE) bench/results

bench-growth: $(BUILD)/kvidx-bench
	@sh bench/run_growth.sh $(BUILD)/kvidx-bench $(BENCH_TRACE) bench/results

demo-bench: $(BUILD)/kvidx-bench
	@$(BUILD)/kvidx-bench --demo --trace $(BENCH_TRACE) -W 16 -C 2048

BENCH_SMOKE := --trace $(BENCH_TRACE) --max-requests 3000 -W 4 -C 512 -F 2 --collide 0.05 --min-time 0 -q

BENCH_LOG := $(BUILD)/test-bench.log

test-bench: $(BUILD)/kvidx-bench $(BUILD)/kvidx-bench-nothreads $(if $(CLANG),$(BUILD)/kvidx-bench-clang)
	@b=$(BUILD)/kvidx-bench; : >$(BENCH_LOG); \
	run() { echo "test-bench: $$1"; shift; "$$@" >>$(BENCH_LOG) 2>&1 || \
	  { echo "test-bench: FAILED: $$*"; tail -n 40 $(BENCH_LOG); exit 1; }; }; \
	run "three kinds, random routing, collisions" $$b $(BENCH_SMOKE); \
	grep -q 'checksums: all 3 kinds agree' $(BENCH_LOG) || { echo "test-bench: no agreement line"; exit 1; }; \
	run "kvidx routing, duplication, dp ranks, heavy collisions" \
	  $$b --trace $(BENCH_TRACE) --max-requests 2000 -W 3 -C 384 -F 3 -D 2 --dp-ranks 2 \
	  --collide 0.3 --collide-pool 8 --route kvidx --min-time 0 -q; \
	run "concurrency (1 writer x 1 reader), final state check" \
	  $$b $(BENCH_SMOKE) --kinds positional,radix --writers 1 --readers 1 --conc-time 0.2; \
	run "offered-load sweep" $$b $(BENCH_SMOKE) --kinds positional --sweep --sweep-step 0.01 \
	  --csv $(BUILD)/test-sweep.csv; \
	test "$$(wc -l <$(BUILD)/test-sweep.csv)" -gt 5 || { echo "test-bench: sweep csv too short"; exit 1; }; \
	run "trace parser: odd formatting" $$b --trace bench/tests/odd_format.jsonl -W 2 -C 16 --min-time 0 -q; \
	grep -q '5 requests, 8 prompt blocks' $(BENCH_LOG) || { echo "test-bench: odd_format.jsonl misparsed"; exit 1; }; \
	echo "test-bench: trace parser: malformed input is rejected"; \
	if $$b --trace bench/tests/malformed.jsonl -q >/dev/null 2>&1; then echo "test-bench: malformed trace accepted"; exit 1; fi; \
	run "event file: write, replay (--time, --expect), malformed lines" \
	  sh bench/test_events.sh $$b $(BUILD) $(BENCH_SMOKE); \
	run "growth with a reader (answers checked)" $$b --growth --growth-blocks 30000 --growth-workers 16 --readers 1; \
	run "writer scaling" $$b $(BENCH_SMOKE) --scaling --scale-writers 1,2 --readers 1 --conc-time 0.1; \
	grep -q 'fraction_of_alone=' $(BENCH_LOG) || { echo "test-bench: no scaling line"; exit 1; }; \
	run "result ordering: order-hint placement equals the merge sort" $$b --order-bench 64,3; \
	run "demo" $$b --demo --trace $(BENCH_TRACE) --max-requests 3000 -W 8 -C 512; \
	run "KVIDX_NO_THREADS build" $(BUILD)/kvidx-bench-nothreads $(BENCH_SMOKE); \
	if [ -n "$(CLANG)" ]; then run "clang build" $(BUILD)/kvidx-bench-clang $(BENCH_SMOKE); fi; \
	echo "test-bench: ok (log: $(BENCH_LOG))"

TEST_PARTS += test-bench

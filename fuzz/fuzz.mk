# fuzz/fuzz.mk - libFuzzer targets (included by the top Makefile).
#
#   make fuzz [FUZZ_SECONDS=600] [FUZZ_TARGETS="fuzz_ops ..."]
#       each target built with clang -fsanitize=fuzzer,address,undefined, run
#       for FUZZ_SECONDS on a work corpus in $(BUILD)/fuzz/work/<t> seeded from
#       fuzz/corpus/<t>; prints libFuzzer's final stats.  Crashes land in
#       $(BUILD)/fuzz/artifacts/.
#   make test-fuzz
#       replays fuzz/corpus/<t> through the gcc driver (fuzz/main.c) built with
#       ASan+UBSan, then (clang present) runs each libFuzzer target for
#       FUZZ_TEST_SECONDS (default 20), in parallel.
#   make fuzz-replay   just the corpus replay;  build/fuzz/<t>_replay FILE|DIR...
#       replays given inputs (FUZZ_VERBOSE=1 prints every decoded op).

FUZZ_TARGETS      ?= fuzz_ops fuzz_hash fuzz_capacity fuzz_snapshot fuzz_interleave fuzz_events \
                     fuzz_vllm_decode
FUZZ_SECONDS      ?= 600
FUZZ_TEST_SECONDS ?= 20
# extra compiler flags for the fuzz builds (e.g. -DKVIDX_NO_THREADS);
# rm -rf build/fuzz after changing it
FUZZ_DEFS         ?=
FUZZ_DIR          := $(BUILD)/fuzz
FUZZ_HDRS         := kvidx.h fuzz/fuzz_common.h fuzz/fz_alloc.h fuzz/fz_seed.h fuzz/model.h fuzz/model.c
FUZZ_SAN_FLAGS    := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

# fuzz_hash carries its own copy of xxhash.h, so kvidx's implementation goes in
# a separate translation unit for it.
fuzz_ops_SRCS      := fuzz/fuzz_ops.c fuzz/model.c
fuzz_capacity_SRCS := fuzz/fuzz_capacity.c
fuzz_snapshot_SRCS := fuzz/fuzz_snapshot.c
fuzz_interleave_SRCS := fuzz/fuzz_interleave.c
fuzz_events_SRCS   := fuzz/fuzz_events.c
fuzz_hash_SRCS     := fuzz/fuzz_hash.c fuzz/kvidx_impl.c
# the vLLM event decoder of examples/vllm_events (no ZeroMQ in it)
fuzz_vllm_decode_SRCS := fuzz/fuzz_vllm_decode.c examples/vllm_events/vllm_decode.c
$(FUZZ_DIR)/fuzz_vllm_decode_replay $(FUZZ_DIR)/fuzz_vllm_decode_fuzzer: \
  examples/vllm_events/vllm_decode.c examples/vllm_events/vllm_decode.h

# fuzz_ops: no coverage for the reference kind / checker (the oracle's
# O(max_workers) loops) and no trace-cmp (its bytecode goes through small
# tables): together about 4x more executions per second.
fuzz_ops_COVFLAGS  := -fsanitize-coverage-ignorelist=fuzz/fuzz_ops.covignore -fno-sanitize-coverage=trace-cmp
fuzz_snapshot_COVFLAGS := -fsanitize-coverage-ignorelist=fuzz/fuzz_snapshot.covignore
# fuzz_ops: seq tables past 8 places shrink (64 by default), so the fuzzer's
# small workers shrink and regrow their tables against the model
fuzz_ops_DEFS      := -DKVIDX_TEST_SHRINK_MIN=8

.PHONY: fuzz test-fuzz fuzz-replay fuzz-build fuzz-build-replay

# gcc (or $(CC)) replay driver builds, ASan+UBSan
$(FUZZ_DIR)/%_replay: fuzz/%.c fuzz/main.c fuzz/kvidx_impl.c $(FUZZ_HDRS) | deps
	@mkdir -p $(FUZZ_DIR)
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) $(FUZZ_DEFS) $($*_DEFS) -o $@ $($*_SRCS) fuzz/main.c $(PTHREAD)

# libFuzzer builds.  -O2 (not -O1): the chain hashing in the oracles' queries
# (XXH3 under ASan) and the model's scans dominate fuzz_ops; `-runs=0` over
# one fixed corpus took 4.79 / 4.22 s at -O2 and 4.98 / 5.58 s at -O1, and
# ASan and UBSan check the same.
FUZZ_OPT ?= -O2
$(FUZZ_DIR)/%_fuzzer: fuzz/%.c fuzz/kvidx_impl.c $(FUZZ_HDRS) $(wildcard fuzz/*.covignore) | deps
	@mkdir -p $(FUZZ_DIR)
	$(CLANG) $(CFLAGS_BASE) $(FUZZ_OPT) $(FUZZ_SAN_FLAGS) $($*_COVFLAGS) $(FUZZ_DEFS) $($*_DEFS) -o $@ $($*_SRCS) $(PTHREAD)

fuzz-build-replay: $(addprefix $(FUZZ_DIR)/,$(addsuffix _replay,$(FUZZ_TARGETS)))
fuzz-build: $(addprefix $(FUZZ_DIR)/,$(addsuffix _fuzzer,$(FUZZ_TARGETS)))

fuzz-replay: fuzz-build-replay
	@rc=0; for t in $(FUZZ_TARGETS); do \
	  $(FUZZ_DIR)/$${t}_replay fuzz/corpus/$$t || { rc=1; echo "*** $$t: corpus replay FAILED (see fuzz/BUGS.md)"; }; \
	done; exit $$rc

# libFuzzer flags shared by both runs ($(1) is a shell word); -dict only when
# fuzz/<t>.dict exists.
fuzz_flags = -print_final_stats=1 -timeout=25 -rss_limit_mb=2048 -max_len=$$(case $(1) in fuzz_ops) echo 1024;; *) echo 4096;; esac) \
  -artifact_prefix=$(FUZZ_DIR)/artifacts/$(1)- \
  $$(test -f fuzz/$(1).dict && echo -dict=fuzz/$(1).dict)

ifeq ($(CLANG),)
fuzz:
	@echo "fuzz: clang not found (install clang libclang-rt-14-dev)"; exit 1
else
fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/artifacts $(FUZZ_DIR)/logs
	@rc=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/work/$$t; \
	  echo "=== $$t: $(FUZZ_SECONDS) s (log $(FUZZ_DIR)/logs/$$t.fuzz.log)"; \
	  $(FUZZ_DIR)/$${t}_fuzzer $(call fuzz_flags,$$t) -max_total_time=$(FUZZ_SECONDS) \
	    $(FUZZ_DIR)/work/$$t fuzz/corpus/$$t >$(FUZZ_DIR)/logs/$$t.fuzz.log 2>&1; s=$$?; \
	  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::|^Done ' $(FUZZ_DIR)/logs/$$t.fuzz.log; \
	  if [ $$s != 0 ]; then rc=1; echo "--- $$t FAILED (exit $$s):"; tail -60 $(FUZZ_DIR)/logs/$$t.fuzz.log; fi; \
	done; exit $$rc
endif

# make test: replay the corpus, then fuzz each target briefly (in parallel).
test-fuzz: fuzz-replay
ifneq ($(CLANG),)
test-fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/artifacts $(FUZZ_DIR)/logs
	@for t in $(FUZZ_TARGETS); do \
	  rm -rf $(FUZZ_DIR)/test-work/$$t; mkdir -p $(FUZZ_DIR)/test-work/$$t; \
	  ( $(FUZZ_DIR)/$${t}_fuzzer $(call fuzz_flags,$$t) -max_total_time=$(FUZZ_TEST_SECONDS) \
	      $(FUZZ_DIR)/test-work/$$t fuzz/corpus/$$t >$(FUZZ_DIR)/logs/$$t.log 2>&1; \
	    echo $$? >$(FUZZ_DIR)/logs/$$t.rc ) & \
	done; wait; \
	rc=0; for t in $(FUZZ_TARGETS); do \
	  s=$$(cat $(FUZZ_DIR)/logs/$$t.rc); \
	  printf '%s: exit %s, ' $$t $$s; \
	  grep -E '^#[0-9]+[[:space:]]+DONE' $(FUZZ_DIR)/logs/$$t.log | tail -1; \
	  if [ "$$s" != 0 ]; then rc=1; echo "--- $$t failed, log $(FUZZ_DIR)/logs/$$t.log:"; tail -40 $(FUZZ_DIR)/logs/$$t.log; fi; \
	done; exit $$rc
endif

TEST_PARTS += test-fuzz

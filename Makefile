# kvidx - build, test, demo.  `make demo` and `make test` work on a fresh
# Debian machine: missing packages are installed when run as root.
#
# Fragments (bench/bench.mk, fuzz/fuzz.mk, examples/examples.mk) add their own
# targets and append the names of their test targets to TEST_PARTS; `make
# test` runs every part through tests/run_parts.sh, which prints the
# closing "N passed, N failed" line.

CC      ?= cc
CXX     ?= c++
CLANG   := $(shell command -v clang 2>/dev/null)
CLANGXX := $(shell command -v clang++ 2>/dev/null)
BUILD   := build
WARN    := -Wall -Wextra -Wpedantic -Werror
CFLAGS_BASE := -std=c11 $(WARN) -O2 -g -I.
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
PTHREAD := -pthread
PREFIX  ?= /usr/local

# Debian packages the build needs; `deps` installs them when root.
DEB_PKGS := libxxhash-dev clang libclang-rt-14-dev
DEB_OPT_PKGS := hyperfine

TEST_PARTS :=

.PHONY: all deps test demo install clean stress soak test-interleave test-threads-tsan test-compile test-soak-short test-snapshot-bounds test-generations test-hostile-prompts

all: $(BUILD)/test_core

# every install step waits for the dpkg lock: make test builds a part's
# prerequisites in parallel, and two steps may meet
APT_GET := apt-get -o DPkg::Lock::Timeout=600

deps: $(BUILD)/.deps
$(BUILD)/.deps:
	@mkdir -p $(BUILD)
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing$$missing"; \
	    ($(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing $(DEB_OPT_PKGS)) >$(BUILD)/apt.log 2>&1 || \
	      { echo "deps: apt-get failed, see $(BUILD)/apt.log"; exit 1; }; \
	  else \
	    echo "deps: missing Debian packages:$$missing"; \
	    echo "deps: run: sudo apt-get install$$missing"; exit 1; \
	  fi; \
	fi
	@test -f /usr/include/xxhash.h || { echo "deps: xxhash.h not found (install libxxhash-dev)"; exit 1; }
	@touch $@

# installs Debian packages $(1) (when root), else fails naming them
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "$@: installing$$missing"; mkdir -p $(BUILD); \
	    ($(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends $$missing) \
	      >$(BUILD)/apt-$@.log 2>&1 || { echo "$@: apt-get failed, see $(BUILD)/apt-$@.log"; exit 1; }; \
	  else \
	    echo "$@: missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi
endef

-include bench/bench.mk
-include fuzz/fuzz.mk
-include examples/examples.mk
-include examples/fleet/fleet.mk
-include examples/firmware/firmware.mk
-include fuzz/coverage.mk

# ---- core tests ------------------------------------------------------------
TEST_SRCS := tests/test_core.c tests/test_impl.c
TEST_HDRS := kvidx.h tests/testutil.h

$(BUILD)/test_core: $(TEST_SRCS) $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -o $@ $(TEST_SRCS) $(PTHREAD)

# (gcc + ASan runs without control bytes, KVIDX_NO_SIMD: seq tables probe
# place by place; the other builds keep them, compared with SSE2 except in
# clang's plain build, which compares them as 64-bit words as targets
# without SSE2 or NEON do; the cross part runs NEON on aarch64)
$(BUILD)/test_core_asan: $(TEST_SRCS) $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -DKVIDX_NO_SIMD -o $@ $(TEST_SRCS) $(PTHREAD)

$(BUILD)/test_core_clang: $(TEST_SRCS) $(TEST_HDRS) | deps
	$(CLANG) $(CFLAGS_BASE) -DKVIDX_TEST_GROUP_WORDS -o $@ $(TEST_SRCS) $(PTHREAD)

# (clang + ASan also keeps every map growth in flight for long: one place
# drained per reservation and no table moved at once, so the two-table
# paths meet every operation; and seq tables past 8 places shrink, so small
# workers shrink and regrow)
$(BUILD)/test_core_clang_asan: $(TEST_SRCS) $(TEST_HDRS) | deps
	$(CLANG) $(CFLAGS_BASE) -O1 $(SAN) -DKVIDX_TEST_DRAIN_STEP=1 -DKVIDX_TEST_BULK_MAX=0 -DKVIDX_TEST_SHRINK_MIN=8 -o $@ $(TEST_SRCS) $(PTHREAD)

VECTORS := tests/dynamo_hash_vectors.json

# cross-platform part (s390x, armhf, aarch64 under qemu-user)
include tests/cross.mk

test-core-gcc: $(BUILD)/test_core
	$(BUILD)/test_core $(VECTORS)
test-core-gcc-asan: $(BUILD)/test_core_asan
	$(BUILD)/test_core_asan $(VECTORS)
test-core-clang: $(BUILD)/test_core_clang
	$(BUILD)/test_core_clang $(VECTORS)
test-core-clang-asan: $(BUILD)/test_core_clang_asan
	$(BUILD)/test_core_clang_asan $(VECTORS)

# Compile checks: C11 / C++ / two TUs / KVIDX_STATIC / KVIDX_NO_MALLOC (nm) / KVIDX_NO_SIMD /
# KVIDX_NO_RUN_SPLIT.
test-compile: | deps
	@mkdir -p $(BUILD)/compile
	$(CC)  -std=c11 $(WARN) -I. -c tests/compile_impl.c -o $(BUILD)/compile/impl_c.o
	$(CXX) -std=c++17 -Wall -Wextra -Wpedantic -Werror -I. -x c++ -c tests/compile_impl.c -o $(BUILD)/compile/impl_cxx.o
	$(CC)  -std=c11 $(WARN) -I. -o $(BUILD)/compile/two_tu tests/compile_impl.c tests/compile_user.c $(PTHREAD) && $(BUILD)/compile/two_tu
	$(CC)  -std=c11 $(WARN) -I. -DKVIDX_STATIC -c tests/compile_impl.c -o $(BUILD)/compile/static.o
	$(CC)  -std=c11 $(WARN) -I. -DKVIDX_NO_SIMD -c tests/compile_impl.c -o $(BUILD)/compile/nosimd.o
	$(CC)  -std=c11 $(WARN) -I. -DKVIDX_NO_RUN_SPLIT -c tests/compile_impl.c -o $(BUILD)/compile/nosplit.o
	$(CC)  -std=c11 $(WARN) -I. -DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS -c tests/compile_impl.c -o $(BUILD)/compile/nomalloc.o
	@if nm $(BUILD)/compile/nomalloc.o | grep -E ' U (malloc|calloc|realloc|free|pthread_[a-z_]*)$$'; then \
	  echo "KVIDX_NO_MALLOC build references an allocator or pthread symbol"; exit 1; fi
	@echo "compile checks ok"
ifneq ($(CLANG),)
	$(CLANG) -std=c11 $(WARN) -I. -c tests/compile_impl.c -o $(BUILD)/compile/impl_clang.o
	$(CLANGXX) -std=c++17 -Wall -Wextra -Wpedantic -Werror -I. -x c++ -c tests/compile_impl.c -o $(BUILD)/compile/impl_clangxx.o
endif

# ---- concurrency tests (lock-free readers) ---------------------------------
$(BUILD)/test_interleave: tests/test_interleave.c kvidx.h | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -DKVIDX_TEST_DRAIN_STEP=1 -o $@ tests/test_interleave.c
test-interleave: $(BUILD)/test_interleave
	$(BUILD)/test_interleave

$(BUILD)/test_threads_tsan: tests/test_threads.c kvidx.h | deps
	$(CLANG) -std=c11 $(WARN) -O1 -g -I. -fsanitize=thread -o $@ tests/test_threads.c $(PTHREAD)
$(BUILD)/test_threads: tests/test_threads.c kvidx.h | deps
	$(CC) $(CFLAGS_BASE) -o $@ tests/test_threads.c $(PTHREAD)
# short, under ThreadSanitizer: 2 s per kind, 2 writers x 2 readers
test-threads-tsan: $(BUILD)/test_threads_tsan
	TSAN_OPTIONS=halt_on_error=1 $(BUILD)/test_threads_tsan 2 2 2
STRESS_SECONDS ?= 30
STRESS_WRITERS ?= 2
STRESS_READERS ?= 4
# longer: `make stress STRESS_SECONDS=300 STRESS_WRITERS=4 STRESS_READERS=8`
stress: $(BUILD)/test_threads $(BUILD)/test_threads_tsan
	$(BUILD)/test_threads $(STRESS_SECONDS) $(STRESS_WRITERS) $(STRESS_READERS)
	TSAN_OPTIONS=halt_on_error=1 $(BUILD)/test_threads_tsan $(STRESS_SECONDS) $(STRESS_WRITERS) $(STRESS_READERS)

# The implementation under gcc + ASan, compiled once for the tests below
# that link to it (events, snapshot bounds, edges, hostile prompts).
$(BUILD)/test_impl_asan.o: tests/test_impl.c $(TEST_HDRS) | deps
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -c -o $@ tests/test_impl.c

# ---- production events: ids, tiers, eviction, TTL, snapshots ---------------
$(BUILD)/test_events_asan: tests/test_events.c $(BUILD)/test_impl_asan.o $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/test_events.c $(BUILD)/test_impl_asan.o
$(BUILD)/test_events_clang: tests/test_events.c tests/test_impl.c $(TEST_HDRS) | deps
	$(CLANG) $(CFLAGS_BASE) -o $@ tests/test_events.c tests/test_impl.c
test-events-gcc-asan: $(BUILD)/test_events_asan
	$(BUILD)/test_events_asan
test-events-clang: $(BUILD)/test_events_clang
	$(BUILD)/test_events_clang

# hostile snapshot streams: work and memory bounded by the stream's length
$(BUILD)/test_snapshot_bounds: tests/test_snapshot_bounds.c $(BUILD)/test_impl_asan.o $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/test_snapshot_bounds.c $(BUILD)/test_impl_asan.o
test-snapshot-bounds: $(BUILD)/test_snapshot_bounds
	$(BUILD)/test_snapshot_bounds

# edge statuses and config flags (every status message, bad configs and
# events, the event-id table filling, checksummed but malformed records)
$(BUILD)/test_edges: tests/test_edges.c $(BUILD)/test_impl_asan.o $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/test_edges.c $(BUILD)/test_impl_asan.o
test-edges: $(BUILD)/test_edges
	$(BUILD)/test_edges

# slot generations never wrap (64 bits): flapping workers cross 2^31..2^33
$(BUILD)/test_generations: tests/test_generations.c kvidx.h | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/test_generations.c
test-generations: $(BUILD)/test_generations
	$(BUILD)/test_generations

# hostile prompts: thousands of blocks with colliding table keys; stores and
# queries exact, no reader give-up (it failed on 0.1's unkeyed table: readers
# gave up with KVIDX_EAGAIN; 0.2 keys every map with a per-index seed).
$(BUILD)/test_hostile_prompts: tests/test_hostile_prompts.c $(BUILD)/test_impl_asan.o $(TEST_HDRS) | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/test_hostile_prompts.c $(BUILD)/test_impl_asan.o
test-hostile-prompts: $(BUILD)/test_hostile_prompts
	$(BUILD)/test_hostile_prompts

# soak: writers (store, remove, clear, eviction, TTL expiry) and readers on
# a growing / shrinking index, snapshots restored mid-run (tests/soak.c).
# `make soak SOAK_SECONDS=600 [SOAK_WRITERS=2 SOAK_READERS=2]`; a 10 s run is
# part of `make test`.
SOAK_SECONDS ?= 600
SOAK_WRITERS ?= 2
SOAK_READERS ?= 2
$(BUILD)/soak: tests/soak.c kvidx.h tests/testutil.h | deps
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) -o $@ tests/soak.c $(PTHREAD)
soak: $(BUILD)/soak
	$(BUILD)/soak $(SOAK_SECONDS) $(SOAK_WRITERS) $(SOAK_READERS)
test-soak-short: $(BUILD)/soak
	$(BUILD)/soak 10 2 2

# the README's API reference lists every public function of the header
test-api-docs:
	sh tests/check_api_docs.sh kvidx.h README.md

CORE_PARTS := test-core-gcc test-core-gcc-asan test-compile test-interleave test-events-gcc-asan test-snapshot-bounds test-edges test-generations test-hostile-prompts test-soak-short test-api-docs
ifneq ($(CLANG),)
CORE_PARTS += test-core-clang test-core-clang-asan test-threads-tsan test-events-clang
endif

test: deps
	@sh tests/run_parts.sh $(CORE_PARTS) $(TEST_PARTS)

# ---- demo / install ----------------------------------------------------------
DEMO_TARGET ?= demo-bench
demo: deps $(DEMO_TARGET)

$(BUILD)/demo_basic: examples/demo_basic.c kvidx.h | deps
	$(CC) $(CFLAGS_BASE) -o $@ examples/demo_basic.c
demo-basic: $(BUILD)/demo_basic
	$(BUILD)/demo_basic

# header, pkg-config file and CMake package (kvidx::kvidx): examples/examples.mk
install: install-all

clean:
	rm -rf $(BUILD)

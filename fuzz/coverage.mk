# fuzz/coverage.mk - `make coverage`: clang source-based coverage of kvidx.h
# (included by the top Makefile).
#
# Builds the core tests and the fuzz corpus replay drivers with
# -fprofile-instr-generate -fcoverage-mapping (no sanitizers, -O0), runs the
# tests and replays every fuzz/corpus/<target>/ input, merges the profiles
# (llvm-profdata), prints line / region / branch coverage of kvidx.h
# (llvm-cov report) and writes an HTML report to build/coverage/html/.
# Needs Debian's llvm-14 (installed by `make coverage-deps` when root).
# What stays uncovered, and why: fuzz/README.md.

COV_DIR      := $(BUILD)/coverage
COV_LLVM     := /usr/lib/llvm-14/bin
COV_PROFDATA := $(COV_LLVM)/llvm-profdata
COV_COV      := $(COV_LLVM)/llvm-cov
COV_CC       := $(COV_LLVM)/clang
COV_FLAGS    := -std=c11 $(WARN) -O0 -g -I. -fprofile-instr-generate -fcoverage-mapping
COV_DEB_PKGS := llvm-14 clang-14

# test binaries: name -> sources, and how each runs (ARGS)
# (test_core_drain: test_core again with every map growth kept in flight,
# one place drained per reservation, as make test's clang+ASan build does)
COV_TESTS := test_core test_core_drain test_events test_snapshot_bounds test_edges test_interleave test_threads
cov_test_core_SRCS            := tests/test_core.c tests/test_impl.c
cov_test_core_drain_SRCS      := tests/test_core.c tests/test_impl.c
cov_test_core_drain_DEFS      := -DKVIDX_TEST_DRAIN_STEP=1 -DKVIDX_TEST_BULK_MAX=0
cov_test_interleave_DEFS      := -DKVIDX_TEST_DRAIN_STEP=1
cov_test_events_SRCS          := tests/test_events.c tests/test_impl.c
cov_test_snapshot_bounds_SRCS := tests/test_snapshot_bounds.c tests/test_impl.c
cov_test_edges_SRCS           := tests/test_edges.c tests/test_impl.c
cov_test_interleave_SRCS      := tests/test_interleave.c
cov_test_threads_SRCS         := tests/test_threads.c
cov_test_core_ARGS            := $(VECTORS)
cov_test_core_drain_ARGS      := $(VECTORS)
cov_test_threads_ARGS         := 1 2 2

.PHONY: coverage coverage-deps coverage-build

coverage-deps: $(COV_DIR)/.deps
$(COV_DIR)/.deps:
	@mkdir -p $(COV_DIR)
	@missing=""; for p in $(COV_DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "coverage-deps: installing$$missing"; \
	    ($(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing) >$(COV_DIR)/apt.log 2>&1 || \
	      { echo "coverage-deps: apt-get failed, see $(COV_DIR)/apt.log"; exit 1; }; \
	  else \
	    echo "coverage-deps: missing Debian packages:$$missing"; \
	    echo "coverage-deps: run: sudo apt-get install$$missing"; exit 1; \
	  fi; \
	fi
	@test -x $(COV_PROFDATA) -a -x $(COV_COV) -a -x $(COV_CC) || { echo "coverage-deps: llvm-14 tools not found in $(COV_LLVM)"; exit 1; }
	@touch $@

$(COV_DIR)/bin/%: $(TEST_HDRS) $(wildcard tests/*.c) | deps coverage-deps
	@mkdir -p $(COV_DIR)/bin
	$(COV_CC) $(COV_FLAGS) $(cov_$*_DEFS) -o $@ $(cov_$*_SRCS) $(PTHREAD)

$(COV_DIR)/bin/%_replay: fuzz/%.c fuzz/main.c fuzz/kvidx_impl.c $(FUZZ_HDRS) | deps coverage-deps
	@mkdir -p $(COV_DIR)/bin
	$(COV_CC) $(COV_FLAGS) -o $@ $($*_SRCS) fuzz/main.c $(PTHREAD)

COV_BINS := $(addprefix $(COV_DIR)/bin/,$(COV_TESTS) $(addsuffix _replay,$(FUZZ_TARGETS)))
coverage-build: $(COV_BINS)

# Every run writes its own profile (%p: the replay driver forks per input);
# a failing test or input is reported and fails the target after the report.
coverage: coverage-build
	@rm -rf $(COV_DIR)/prof $(COV_DIR)/html; mkdir -p $(COV_DIR)/prof
	@rc=0; \
	$(foreach t,$(COV_TESTS),echo "coverage: running $(t)"; \
	  LLVM_PROFILE_FILE=$(COV_DIR)/prof/$(t)-%p.profraw $(COV_DIR)/bin/$(t) $(cov_$(t)_ARGS) >$(COV_DIR)/$(t).log 2>&1 || \
	    { rc=1; echo "coverage: $(t) FAILED (log $(COV_DIR)/$(t).log)"; };) \
	for t in $(FUZZ_TARGETS); do \
	  echo "coverage: replaying fuzz/corpus/$$t"; \
	  LLVM_PROFILE_FILE=$(COV_DIR)/prof/$$t-%p.profraw $(COV_DIR)/bin/$${t}_replay fuzz/corpus/$$t >$(COV_DIR)/$$t.log 2>&1 || \
	    { rc=1; echo "coverage: $$t replay FAILED (log $(COV_DIR)/$$t.log)"; }; \
	done; \
	$(COV_PROFDATA) merge -sparse -o $(COV_DIR)/kvidx.profdata $(COV_DIR)/prof/*.profraw || exit 1; \
	objs="$(firstword $(COV_BINS))"; for b in $(wordlist 2,99,$(COV_BINS)); do objs="$$objs -object $$b"; done; \
	$(COV_COV) report -instr-profile=$(COV_DIR)/kvidx.profdata $$objs kvidx.h | tee $(COV_DIR)/report.txt; \
	$(COV_COV) show -format=html -show-branches=count -show-line-counts-or-regions \
	  -instr-profile=$(COV_DIR)/kvidx.profdata $$objs -output-dir=$(COV_DIR)/html kvidx.h || exit 1; \
	awk '$$1 == "TOTAL" { printf "kvidx.h coverage: lines %s (%d of %d), branches %s (%d of %d), regions %s, functions %s\n", \
	  $$10, $$8 - $$9, $$8, $$13, $$11 - $$12, $$11, $$4, $$7 }' $(COV_DIR)/report.txt; \
	echo "coverage: HTML report in $(COV_DIR)/html/index.html"; \
	exit $$rc

# tests/cross.mk - the cross-platform part of `make test` (included by the
# top Makefile).
#
#   make test-cross [CROSS_ARCHS="s390x armhf aarch64"]
#       For each architecture: cross-build (static, -O2, Debian's
#       gcc-<triplet> cross compilers) the core tests, the event tests, the
#       golden check and the fuzz corpus replay drivers, run them under
#       qemu-user (qemu-user-static), and compare the golden check's snapshot
#       and answers byte for byte with the host build's.
#         s390x    big endian, 64-bit
#         armhf    32-bit, strict alignment (ARMv7 hard float)
#         aarch64  64-bit, weakly ordered (the seqlock's fences matter);
#                  the core tests also as C++17 (NEON control bytes)
#       i686 is available too (CROSS_ARCHS=i686: gcc-i686-linux-gnu).
#   make cross-deps     just install the cross compilers and qemu-user.
#
# Time: about a minute per architecture on 2 cores (build once, then a
# representative subset: core tests, event tests, golden checks,
# corpus replay).

CROSS_ARCHS ?= s390x armhf aarch64
CROSS_DIR   := $(BUILD)/cross

cross_triplet_s390x   := s390x-linux-gnu
cross_triplet_armhf   := arm-linux-gnueabihf
cross_triplet_aarch64 := aarch64-linux-gnu
cross_triplet_i686    := i686-linux-gnu
cross_qemu_s390x      := qemu-s390x-static
cross_qemu_armhf      := qemu-arm-static
cross_qemu_aarch64    := qemu-aarch64-static
cross_qemu_i686       := qemu-i386-static
cross_debarch_s390x   := s390x
cross_debarch_armhf   := armhf
cross_debarch_aarch64 := arm64
cross_debarch_i686    := i386

CROSS_DEB_PKGS := qemu-user-static $(foreach a,$(CROSS_ARCHS),gcc-$(cross_triplet_$(a)) libc6-dev-$(cross_debarch_$(a))-cross)


.PHONY: cross-deps test-cross cross-build

cross-deps: | deps
	$(call apt_install,$(CROSS_DEB_PKGS))

# what runs on each target; the fuzz drivers replay fuzz/corpus/<t>
CROSS_FUZZ := $(FUZZ_TARGETS)
CROSS_CFLAGS := -std=c11 $(WARN) -O2 -I. -static

# $(call cross_rules,ARCH)
define cross_rules
$(CROSS_DIR)/$(1)/test_core: $(TEST_SRCS) $(TEST_HDRS) | cross-deps
	@mkdir -p $$(@D)
	nice -n 10 $(cross_triplet_$(1))-gcc $(CROSS_CFLAGS) -o $$@ $(TEST_SRCS) -pthread
$(CROSS_DIR)/$(1)/test_events: tests/test_events.c tests/test_impl.c $(TEST_HDRS) | cross-deps
	@mkdir -p $$(@D)
	nice -n 10 $(cross_triplet_$(1))-gcc $(CROSS_CFLAGS) -o $$@ tests/test_events.c tests/test_impl.c -pthread
$(CROSS_DIR)/$(1)/test_golden: tests/test_golden.c kvidx.h | cross-deps
	@mkdir -p $$(@D)
	nice -n 10 $(cross_triplet_$(1))-gcc $(CROSS_CFLAGS) -o $$@ tests/test_golden.c -pthread
$(CROSS_DIR)/$(1)/%_replay: fuzz/%.c fuzz/main.c fuzz/kvidx_impl.c $(FUZZ_HDRS) | cross-deps
	@mkdir -p $$(@D)
	nice -n 10 $(cross_triplet_$(1))-gcc $(CROSS_CFLAGS) -O1 -o $$@ $$($$*_SRCS) fuzz/main.c -pthread
cross-build-$(1): $(addprefix $(CROSS_DIR)/$(1)/,test_core test_events test_golden $(addsuffix _replay,$(CROSS_FUZZ)))
test-cross-$(1): cross-build-$(1) $(CROSS_DIR)/host/answers.txt
	@echo "--- $(1) ($(cross_triplet_$(1)), $(cross_qemu_$(1)))"
	@q=$(cross_qemu_$(1)); d=$(CROSS_DIR)/$(1); rc=0; \
	$$$$q $$$$d/test_golden tests/golden_hashes.txt $$$$d >$$$$d/golden.log 2>&1 || { rc=1; echo "golden hashes: FAILED"; }; \
	tail -1 $$$$d/golden.log; \
	cmp $$$$d/snapshot.bin $(CROSS_DIR)/host/snapshot.bin && cmp $$$$d/answers.txt $(CROSS_DIR)/host/answers.txt \
	  && echo "snapshot and answers: byte-identical to the host's" || { rc=1; echo "snapshot/answers differ from the host's"; }; \
	$$$$q $$$$d/test_core $(VECTORS) >$$$$d/core.log 2>&1 || { rc=1; echo "core tests: FAILED"; }; \
	tail -1 $$$$d/core.log; \
	$$$$q $$$$d/test_events >$$$$d/events.log 2>&1 || { rc=1; echo "event tests: FAILED"; }; \
	tail -1 $$$$d/events.log; \
	for t in $(CROSS_FUZZ); do \
	  $$$$q $$$$d/$$$${t}_replay fuzz/corpus/$$$$t >$$$$d/$$$$t.log 2>&1 || { rc=1; echo "$$$$t corpus replay: FAILED"; }; \
	done; echo "corpus replay: $(words $(CROSS_FUZZ)) targets, $$$$(find $(addprefix fuzz/corpus/,$(CROSS_FUZZ)) -type f | wc -l) files"; \
	if [ $$$$rc != 0 ]; then echo "$(1): FAILED, logs in $$$$d/"; grep -h -m5 -iE 'fail|mismatch|error' $$$$d/*.log | head -20; fi; \
	exit $$$$rc
endef
$(foreach a,$(CROSS_ARCHS),$(eval $(call cross_rules,$(a))))

# the host's own answers, the reference for the byte-for-byte comparisons
$(CROSS_DIR)/host/test_golden: tests/test_golden.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -o $@ tests/test_golden.c $(PTHREAD)
$(CROSS_DIR)/host/answers.txt: $(CROSS_DIR)/host/test_golden tests/golden_hashes.txt
	$(CROSS_DIR)/host/test_golden tests/golden_hashes.txt $(CROSS_DIR)/host

# aarch64 also as C++17: the header's NEON control-byte groups and its
# std::atomic branch on a weakly ordered CPU, in a C++ translation unit
CROSS_CXX := $(if $(filter aarch64,$(CROSS_ARCHS)),test-cross-aarch64-cxx)
CROSS_DEB_PKGS += $(if $(CROSS_CXX),g++-$(cross_triplet_aarch64))
$(CROSS_DIR)/aarch64/test_core_cxx: $(TEST_SRCS) $(TEST_HDRS) | cross-deps
	@mkdir -p $(@D)
	nice -n 10 $(cross_triplet_aarch64)-g++ -x c++ -std=c++17 $(WARN) -O2 -I. -static -o $@ $(TEST_SRCS) -pthread
test-cross-aarch64-cxx: $(CROSS_DIR)/aarch64/test_core_cxx
	@echo "--- aarch64 as C++17 ($(cross_triplet_aarch64)-g++, $(cross_qemu_aarch64))"
	@d=$(CROSS_DIR)/aarch64; $(cross_qemu_aarch64) $$d/test_core_cxx $(VECTORS) >$$d/core_cxx.log 2>&1; rc=$$?; \
	tail -1 $$d/core_cxx.log; \
	if [ $$rc != 0 ]; then echo "aarch64 C++ core tests: FAILED, log in $$d/core_cxx.log"; grep -m5 -iE 'fail|error' $$d/core_cxx.log; fi; \
	exit $$rc

cross-build: $(addprefix cross-build-,$(CROSS_ARCHS))
test-cross: $(addprefix test-cross-,$(CROSS_ARCHS)) $(CROSS_CXX)

TEST_PARTS += test-cross

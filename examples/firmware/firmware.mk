# examples/firmware/firmware.mk - kvidx as Cortex-M4 firmware (included by the
# top Makefile).
#
#   make test-firmware
#       builds examples/embedded.c (caller buffer, KVIDX_NO_MALLOC,
#       KVIDX_NO_THREADS, KVIDX_NO_SIMD, KVIDX_NO_RUN_SPLIT, output through Arm semihosting) with
#       arm-none-eabi-gcc + newlib for a Cortex-M4F, runs it on the emulated
#       Arm MPS2 AN386 board (qemu-system-arm -M mps2-an386 -semihosting),
#       checks that its answers equal the host build's, that nm shows no
#       malloc/free/stdio symbol, and that the worst stack depth (-fstack-usage
#       plus -fcallgraph-info call graph, stack_depth.py) fits the stack.
#       Prints the README figures: .text, RAM, stack.  About 15 s.

FW_DIR  := $(BUILD)/firmware
FW_DEB_PKGS := gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
FW_ARCH := -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16
# KVIDX_WORKERS_MAX sizes the query bitsets on the stack: the firmware's 8
# workers need one 64-bit word, not the default 4096 workers' 64 words.
FW_WORKERS_MAX ?= 64
# KVIDX_NO_SIMD: caller-buffer mode never uses control bytes, and without it
# their 64-bit-word form would be linked for heap mode anyway (+5,824 bytes
# of .text, +24 bytes of stack bound in session 34); KVIDX_NO_RUN_SPLIT:
# nor does it move a run's rest out (+2,816 bytes of .text, +896 of stack bound in session 35)
FW_CFLAGS := $(FW_ARCH) -std=c11 $(WARN) -Os -g -ffunction-sections -fdata-sections \
  -fstack-usage -fcallgraph-info=su -I. -I$(FW_DIR)/include \
  -DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS -DKVIDX_NO_SIMD -DKVIDX_NO_RUN_SPLIT -DKVIDX_EMBEDDED_SEMIHOSTING -DKVIDX_WORKERS_MAX=$(FW_WORKERS_MAX)
FW_STACK := 16384
# stack_depth.py: the targets of indirect calls; bounds for recursions (the
# library has none since 0.2: stack_depth.py fails on an unbounded cycle)
FW_INDIRECT := XXH3_hashLong_64b_withSecret,XXH3_hashLong_64b_withSeed,kvidx__cmp_u64,kvidx__score_cmp
FW_BOUNDS   :=
# symbols that must not be linked: allocator, stdio, newlib's reentrant I/O
FW_FORBIDDEN := malloc|calloc|realloc|free|_malloc_r|_free_r|_sbrk|_sbrk_r|printf|puts|putchar|fputs|fwrite|fprintf|sprintf|snprintf|vfprintf|_vfprintf_r|_write|_write_r|__swsetup_r|stdout|_impure_ptr

.PHONY: firmware-deps firmware test-firmware

firmware-deps: | deps
	$(call apt_install,$(FW_DEB_PKGS))

$(FW_DIR)/include/xxhash.h: /usr/include/xxhash.h | firmware-deps
	@mkdir -p $(@D)
	cp $< $@   # only this header: the host's others would clash with newlib's

$(FW_DIR)/embedded.o: examples/embedded.c kvidx.h $(FW_DIR)/include/xxhash.h | firmware-deps
	nice -n 10 arm-none-eabi-gcc $(FW_CFLAGS) -c examples/embedded.c -o $@
$(FW_DIR)/startup.o: examples/firmware/startup.c | firmware-deps
	@mkdir -p $(@D)
	arm-none-eabi-gcc $(FW_ARCH) -std=c11 $(WARN) -Os -g -ffunction-sections \
	  -fstack-usage -fcallgraph-info=su -c examples/firmware/startup.c -o $@
$(FW_DIR)/kvidx-fw.elf: $(FW_DIR)/startup.o $(FW_DIR)/embedded.o examples/firmware/mps2-an386.ld
	arm-none-eabi-gcc $(FW_ARCH) -nostartfiles --specs=nano.specs -T examples/firmware/mps2-an386.ld \
	  -Wl,--gc-sections -Wl,--defsym=STACK_BYTES=$(FW_STACK) -Wl,-Map=$(FW_DIR)/kvidx-fw.map \
	  -o $@ $(FW_DIR)/startup.o $(FW_DIR)/embedded.o

firmware: $(FW_DIR)/kvidx-fw.elf

test-firmware: $(FW_DIR)/kvidx-fw.elf $(EX_BUILD)/embedded
	@rc=0; d=$(FW_DIR); \
	timeout 120 qemu-system-arm -M mps2-an386 -nographic -monitor none -serial null \
	  -semihosting-config enable=on,target=native -kernel $$d/kvidx-fw.elf >$$d/run.txt 2>&1 \
	  || { rc=1; echo "firmware run: FAILED (exit status $$?)"; cat $$d/run.txt; }; \
	$(EX_BUILD)/embedded >$$d/host.txt || { rc=1; echo "host build of examples/embedded.c failed"; }; \
	grep -v ': memory \|^firmware: ' $$d/run.txt >$$d/run.answers; grep -v ': memory ' $$d/host.txt >$$d/host.answers; \
	if cmp -s $$d/run.answers $$d/host.answers && [ -s $$d/host.answers ]; then \
	  echo "firmware answers equal the host build's ($$(wc -l <$$d/host.answers) lines; memory lines differ: 32-bit)"; \
	else rc=1; echo "firmware answers differ from the host build's:"; diff $$d/host.answers $$d/run.answers; fi; \
	if arm-none-eabi-nm $$d/kvidx-fw.elf | grep -E ' ($(FW_FORBIDDEN))$$'; then \
	  rc=1; echo "the firmware links an allocator or stdio symbol (above)"; \
	else echo "nm: no malloc/free/stdio symbol linked"; fi; \
	python3 examples/firmware/stack_depth.py kvidx_fw_reset $$d/*.ci --indirect $(FW_INDIRECT) $(FW_BOUNDS) \
	  --limit $(FW_STACK) >$$d/stack.txt || rc=1; head -1 $$d/stack.txt; tail -n +2 $$d/stack.txt | grep -v '^ ' ; \
	arm-none-eabi-size -A $$d/kvidx-fw.elf | awk '$$1==".text"{t=$$2} $$1==".data"{dd=$$2} $$1==".bss"{b=$$2} \
	  END{printf "figures: .text %d bytes, .data %d, .bss %d (the arena included), stack reserved $(FW_STACK)\n", t, dd, b}'; \
	grep '^positional: memory' $$d/run.txt | sed 's/^/figures: Cortex-M4 /'; \
	grep '^firmware: stack' $$d/run.txt; \
	bound=$$(sed -n '1s/.*: \([0-9]*\) bytes$$/\1/p' $$d/stack.txt); \
	used=$$(sed -n 's/^firmware: stack high-water mark \([0-9]*\) bytes$$/\1/p' $$d/run.txt); \
	if [ -z "$$used" ] || [ -z "$$bound" ] || [ "$$used" -gt "$$bound" ]; then \
	  rc=1; echo "measured stack ($$used) above the static bound ($$bound), or either missing"; fi; \
	exit $$rc

TEST_PARTS += test-firmware

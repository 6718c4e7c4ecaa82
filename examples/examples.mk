# examples/examples.mk - included by the top Makefile.
#
#   make examples        build every example into build/examples/
#   make test-examples   run each example and check its output
#   make python          build/libkvidx.so for bindings/python/kvidx.py
#   make test-python     unittest of the ctypes binding (build/libkvidx.so)
#   make test-python-package  pip install ./bindings/python into a fresh venv,
#                        the same unittest against the installed package
#   make install-all     header + pkg-config file + CMake package config
#   make test-install    install into build/, build a consumer via
#                        pkg-config and via CMake find_package(kvidx)
#   make test-matrix     compilers x standards x options, warnings as errors
#   make check-warnings  just kvidx.h under -Wconversion -Wshadow -Wcast-align
#                        with 32-bit gcc, clang (x86-64 and armhf), g++, clang++
#   make vllm-events     the vLLM KV-event daemon (libzmq3-dev)
#   make test-vllm       its end-to-end test with a Python vLLM-format publisher
#
# Uses the top Makefile's CC CXX CLANG CLANGXX CFLAGS_BASE WARN BUILD PTHREAD
# PREFIX VECTORS and its deps target.

EX_BUILD  := $(BUILD)/examples
EX_BINS   := $(EX_BUILD)/basic $(EX_BUILD)/router $(EX_BUILD)/embedded \
             $(EX_BUILD)/threads $(BUILD)/demo_basic
PYTHON    ?= python3
KVIDX_VERSION_STR = $(shell sed -n 's/^\#define KVIDX_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' kvidx.h | paste -sd. -)

.PHONY: examples test-examples python test-python install-all test-install \
        test-matrix matrix-deps check-warnings vllm-events test-vllm python-deps test-python-package

examples: $(EX_BINS)

$(EX_BUILD)/basic: examples/basic.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -o $@ examples/basic.c

$(EX_BUILD)/router: examples/router.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -o $@ examples/router.c -lm

# Object kept: test-examples runs nm on it (no malloc/free/pthread).
$(EX_BUILD)/embedded.o: examples/embedded.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -DKVIDX_NO_THREADS -DKVIDX_NO_MALLOC -c -o $@ examples/embedded.c
$(EX_BUILD)/embedded: $(EX_BUILD)/embedded.o
	$(CC) -o $@ $<

$(EX_BUILD)/threads: examples/threads.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -o $@ examples/threads.c $(PTHREAD)

test-examples: examples
	@sh examples/test_examples.sh $(BUILD)

# ---- Python binding ----------------------------------------------------------
python: $(BUILD)/libkvidx.so

$(BUILD)/libkvidx.so: bindings/python/libkvidx.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -fPIC -shared -o $@ bindings/python/libkvidx.c $(PTHREAD)

test-python: $(BUILD)/libkvidx.so
	cd bindings/python && KVIDX_LIB=$(abspath $(BUILD)/libkvidx.so) \
	  KVIDX_VECTORS=$(abspath $(VECTORS)) $(PYTHON) -m unittest -v test_kvidx

# The package: `pip install ./bindings/python` into a fresh venv (Debian's
# python3-venv, setuptools and wheel; no network, no PyPI), then the same
# unittest run against the installed module, from outside the source tree.
PY_DEB_PKGS := python3-venv python3-pip-whl python3-setuptools-whl python3-wheel-whl
PY_SYS      ?= /usr/bin/python3
PY_VENV     := $(abspath $(BUILD))/pyvenv
python-deps: | deps
	$(call apt_install,$(PY_DEB_PKGS))
test-python-package: | deps python-deps
	rm -rf $(PY_VENV) && $(PY_SYS) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install -q --no-index /usr/share/python-wheels/wheel-*.whl
	$(PY_VENV)/bin/pip install -q --no-build-isolation --no-index ./bindings/python; \
	  s=$$?; rm -rf bindings/python/build bindings/python/kvidx.egg-info; exit $$s
	mkdir -p $(PY_VENV)/t && cp bindings/python/test_kvidx.py $(PY_VENV)/t/
	cd $(PY_VENV)/t && env -u KVIDX_LIB $(PY_VENV)/bin/python -c "import kvidx; \
	  assert kvidx.__file__.startswith('$(PY_VENV)/lib/'), kvidx.__file__; \
	  assert '_kvidx_native' in kvidx.library_path, kvidx.library_path; \
	  print('installed:', kvidx.__file__, kvidx.library_path, kvidx.version())"
	cd $(PY_VENV)/t && env -u KVIDX_LIB KVIDX_VECTORS=$(abspath $(VECTORS)) \
	  $(PY_VENV)/bin/python -m unittest test_kvidx

# ---- install: header, pkg-config, CMake package config -------------------------
# Layout under $(DESTDIR)$(PREFIX):
#   include/kvidx.h
#   share/pkgconfig/kvidx.pc                   (header-only: arch independent)
#   share/cmake/kvidx/kvidxConfig.cmake        (INTERFACE target kvidx::kvidx)
#   share/cmake/kvidx/kvidxConfigVersion.cmake
install-all:
	@test -n "$(KVIDX_VERSION_STR)" || { echo "install: no version in kvidx.h"; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/share/pkgconfig \
	  $(DESTDIR)$(PREFIX)/share/cmake/kvidx
	install -m 644 kvidx.h $(DESTDIR)$(PREFIX)/include/kvidx.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(KVIDX_VERSION_STR)|g' \
	  packaging/kvidx.pc.in > $(DESTDIR)$(PREFIX)/share/pkgconfig/kvidx.pc
	chmod 644 $(DESTDIR)$(PREFIX)/share/pkgconfig/kvidx.pc
	install -m 644 packaging/kvidxConfig.cmake $(DESTDIR)$(PREFIX)/share/cmake/kvidx/kvidxConfig.cmake
	sed -e 's|@VERSION@|$(KVIDX_VERSION_STR)|g' packaging/kvidxConfigVersion.cmake.in \
	  > $(DESTDIR)$(PREFIX)/share/cmake/kvidx/kvidxConfigVersion.cmake
	chmod 644 $(DESTDIR)$(PREFIX)/share/cmake/kvidx/kvidxConfigVersion.cmake

INST_TEST := $(abspath $(BUILD))/install-test
test-install: | deps
	@rm -rf $(INST_TEST) && mkdir -p $(INST_TEST)
	@echo "-- install into $(INST_TEST)/prefix"
	@$(MAKE) --no-print-directory install-all PREFIX=$(INST_TEST)/prefix >$(INST_TEST)/install.log
	cmp kvidx.h $(INST_TEST)/prefix/include/kvidx.h
	@echo "-- DESTDIR staging"
	@$(MAKE) --no-print-directory install-all DESTDIR=$(INST_TEST)/stage PREFIX=/opt/kvidx >>$(INST_TEST)/install.log
	test -f $(INST_TEST)/stage/opt/kvidx/include/kvidx.h
	grep -q '^prefix=/opt/kvidx$$' $(INST_TEST)/stage/opt/kvidx/share/pkgconfig/kvidx.pc
	@echo "-- consumer via pkg-config"
	test "$$(PKG_CONFIG_PATH=$(INST_TEST)/prefix/share/pkgconfig pkg-config --modversion kvidx)" = "$(KVIDX_VERSION_STR)"
	cd $(INST_TEST) && $(CC) -std=c11 -Wall -Wextra -Wpedantic -Werror \
	  $$(PKG_CONFIG_PATH=$(INST_TEST)/prefix/share/pkgconfig pkg-config --cflags kvidx) \
	  -o consumer_pkgconfig $(abspath packaging/test/consumer.c) \
	  $$(PKG_CONFIG_PATH=$(INST_TEST)/prefix/share/pkgconfig pkg-config --libs kvidx) && ./consumer_pkgconfig
	@echo "-- consumer via CMake find_package(kvidx) / kvidx::kvidx"
	cmake -S packaging/test -B $(INST_TEST)/cmake -DCMAKE_C_COMPILER=$(CC) \
	  -DCMAKE_PREFIX_PATH=$(INST_TEST)/prefix >$(INST_TEST)/cmake.log 2>&1 || { cat $(INST_TEST)/cmake.log; exit 1; }
	cmake --build $(INST_TEST)/cmake >>$(INST_TEST)/cmake.log 2>&1 || { cat $(INST_TEST)/cmake.log; exit 1; }
	grep -q 'kvidx_DIR:PATH=$(INST_TEST)/prefix/share/cmake/kvidx' $(INST_TEST)/cmake/CMakeCache.txt
	$(INST_TEST)/cmake/consumer
	@echo "test-install: ok"

# ---- compile matrix ------------------------------------------------------------
# tcc, and gcc/clang for 32-bit armhf (run under qemu-user)
MATRIX_DEB_PKGS := tcc gcc-arm-linux-gnueabihf libc6-dev-armhf-cross qemu-user-static
matrix-deps: | deps
	$(call apt_install,$(MATRIX_DEB_PKGS))
test-matrix: | deps matrix-deps
	@CC="$(CC)" CXX="$(CXX)" CLANG="$(CLANG)" CLANGXX="$(CLANGXX)" TCC=tcc SAN="$(SAN)" \
	  CC32=arm-linux-gnueabihf-gcc QEMU32=qemu-arm-static VECTORS=$(VECTORS) \
	  sh examples/matrix/run.sh $(BUILD)

# The matrix's warning flags on the compilers that find the most (32-bit gcc,
# clang on any target), the implementation only: seconds, not minutes.
WARN_STRICT := $(WARN) -Wconversion -Wshadow -Wcast-align
check-warnings: | deps matrix-deps
	@for c in "$(CC)" arm-linux-gnueabihf-gcc "$(CLANG)" "$(CLANG) --target=arm-linux-gnueabihf"; do \
	  for d in "" "-DKVIDX_NO_MALLOC -DKVIDX_NO_THREADS"; do \
	    echo "$$c -std=c11 $(WARN_STRICT) -O2 $$d"; \
	    $$c -std=c11 $(WARN_STRICT) -O2 $$d -I. -c examples/matrix/impl.c -o /dev/null || exit 1; \
	  done; done; \
	for c in "$(CXX)" "$(CLANGXX)"; do \
	  echo "$$c -x c++ -std=c++17 $(WARN_STRICT) -O2"; \
	  $$c -x c++ -std=c++17 $(WARN_STRICT) -O2 -I. -c examples/matrix/impl.c -o /dev/null || exit 1; \
	done; echo "check-warnings: clean"

# ---- vLLM KV-event daemon (optional dependencies) ----------------------------------
VLLM_DEB_PKGS := libzmq3-dev python3-zmq python3-msgpack
VLLM_BIN := $(BUILD)/kvidx-vllm-events

vllm-events: $(VLLM_BIN)

# The decoder (vllm_decode.c) has its own bounded msgpack reader: no msgpack-c.
$(VLLM_BIN): examples/vllm_events/kvidx_vllm.c examples/vllm_events/vllm_decode.c \
             examples/vllm_events/vllm_decode.h kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $$(pkg-config --cflags libzmq 2>/dev/null) \
	  -o $@ examples/vllm_events/kvidx_vllm.c examples/vllm_events/vllm_decode.c \
	  $$(pkg-config --libs libzmq 2>/dev/null || echo -lzmq)

# Installs the Debian packages when root; otherwise skips with a message.
test-vllm: $(BUILD)/libkvidx.so | deps
	@missing=""; for p in $(VLLM_DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "test-vllm: installing$$missing"; \
	    ($(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing) \
	      >$(BUILD)/apt-vllm.log 2>&1 || { echo "test-vllm: apt-get failed, see $(BUILD)/apt-vllm.log"; exit 1; }; \
	  else \
	    echo "test-vllm: SKIPPED: missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; \
	    exit 0; \
	  fi; \
	fi; \
	$(MAKE) --no-print-directory $(VLLM_BIN) && \
	timeout 240 /usr/bin/python3 examples/vllm_events/test_vllm_events.py \
	  $(VLLM_BIN) $(abspath $(BUILD))/vllm-test $(abspath $(BUILD))/libkvidx.so

TEST_PARTS += test-examples test-python test-python-package test-install test-matrix test-vllm

# examples/fleet/fleet.mk - included by the top Makefile.
#
#   make fleet        build/kvidx-fleet: bridge / replica / direct / ask / info /
#                     purge roles over NATS JetStream (libnats-dev)
#   make test-fleet   fault tests against a real nats-server -js on loopback:
#                     test_fleet.sh (event file: bridge + 3 replicas, kill -9,
#                     server restart, trimmed stream, throughput; ~35 s) and
#                     test_fleet_vllm.py (the vLLM ZeroMQ input against the
#                     kvidx-vllm-events daemon; ~10 s)
#
# Debian packages: libnats-dev (C client 3.4), nats-server (2.9), and for the
# vLLM ZeroMQ input libzmq3-dev libmsgpack-dev (+ python3-zmq python3-msgpack
# for its test publisher).  Installed when run as root; otherwise the part
# fails with the apt-get line to run.

FLEET_DEB_PKGS := libnats-dev nats-server libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
FLEET_BIN := $(BUILD)/kvidx-fleet

.PHONY: fleet fleet-deps test-fleet

fleet-deps: | deps
	@missing=""; for p in $(FLEET_DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "fleet: installing$$missing"; \
	    ($(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing) \
	      >$(BUILD)/apt-fleet.log 2>&1 || { echo "fleet: apt-get failed, see $(BUILD)/apt-fleet.log"; exit 1; }; \
	  else \
	    echo "fleet: missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi
	@test -f /usr/include/nats/nats.h || { echo "fleet: nats/nats.h not found (install libnats-dev)"; exit 1; }

fleet: fleet-deps
	@$(MAKE) --no-print-directory $(FLEET_BIN)

FLEET_CFLAGS = $$(pkg-config --cflags libzmq msgpack 2>/dev/null)
FLEET_LIBS = -lnats $$(pkg-config --libs libzmq msgpack 2>/dev/null || echo -lzmq -lmsgpackc) $(PTHREAD)

$(FLEET_BIN): examples/fleet/kvidx_fleet.c examples/fleet/fleet_vllm.h kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(FLEET_CFLAGS) -o $@ examples/fleet/kvidx_fleet.c $(FLEET_LIBS)
ifneq ($(CLANG),)
	$(CLANG) $(CFLAGS_BASE) $(FLEET_CFLAGS) -fsyntax-only examples/fleet/kvidx_fleet.c
endif

FLEET_VLLM_TMP := $(abspath $(BUILD))/fleet-vllm-test

test-fleet: fleet-deps
	@$(MAKE) --no-print-directory $(FLEET_BIN) $(BUILD)/kvidx-bench $(VLLM_BIN)
	timeout 240 sh examples/fleet/test_fleet.sh $(BUILD)
	rm -rf $(FLEET_VLLM_TMP)
	timeout 120 /usr/bin/python3 examples/fleet/test_fleet_vllm.py $(FLEET_BIN) $(VLLM_BIN) $(FLEET_VLLM_TMP)
	rm -rf $(FLEET_VLLM_TMP)

TEST_PARTS += test-fleet

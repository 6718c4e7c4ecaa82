# examples/fleet/fleet.mk - included by the top Makefile.
#
#   make fleet        build/kvidx-fleet: bridge / replica / direct / ask / info /
#                     purge roles over NATS JetStream (libnats-dev)
#   make test-fleet   fault test against a real nats-server -js on loopback
#                     (bridge + 3 replicas, kill -9, server restart, trimmed
#                     stream, throughput); about 40 s
#
# Debian packages: libnats-dev (C client 3.4), nats-server (2.9).  Installed
# when run as root; otherwise the part fails with the apt-get line to run.

FLEET_DEB_PKGS := libnats-dev nats-server
FLEET_BIN := $(BUILD)/kvidx-fleet

.PHONY: fleet fleet-deps test-fleet

fleet-deps: | deps
	@missing=""; for p in $(FLEET_DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "fleet: installing$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) \
	      >$(BUILD)/apt-fleet.log 2>&1 || { echo "fleet: apt-get failed, see $(BUILD)/apt-fleet.log"; exit 1; }; \
	  else \
	    echo "fleet: missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi
	@test -f /usr/include/nats/nats.h || { echo "fleet: nats/nats.h not found (install libnats-dev)"; exit 1; }

fleet: fleet-deps
	@$(MAKE) --no-print-directory $(FLEET_BIN)

$(FLEET_BIN): examples/fleet/kvidx_fleet.c kvidx.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -o $@ examples/fleet/kvidx_fleet.c -lnats $(PTHREAD)
ifneq ($(CLANG),)
	$(CLANG) $(CFLAGS_BASE) -fsyntax-only examples/fleet/kvidx_fleet.c
endif

test-fleet: fleet-deps
	@$(MAKE) --no-print-directory $(FLEET_BIN) $(BUILD)/kvidx-bench
	timeout 240 sh examples/fleet/test_fleet.sh $(BUILD)

TEST_PARTS += test-fleet

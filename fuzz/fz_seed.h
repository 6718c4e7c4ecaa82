/* fz_seed.h - the hash-table seed every fuzz target gives its indexes.
 *
 * kvidx keys its tables by cfg.seed, and 0 (the default) picks one from the
 * index's address and a counter: the same input then makes different
 * tables from run to run (and under ASLR), so a layout-dependent failure
 * might not come back when its input is replayed.  One fixed seed makes a
 * rerun of an input exact, and lets the fuzzer learn keys that collide
 * under it (long probe rows, growth sweeps that must not stop early),
 * which a secret seed hides. */
#ifndef FZ_SEED_H
#define FZ_SEED_H
#define FZ_TABLE_SEED 0x9E3779B97F4A7C15ull
#endif

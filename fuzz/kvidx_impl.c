/* kvidx_impl.c - the kvidx implementation in its own translation unit, for
 * fuzz_hash.c (which includes its own copy of xxhash.h with XXH_INLINE_ALL
 * and must not share a TU with kvidx's private copy). */
#define KVIDX_IMPLEMENTATION
#include "kvidx.h"

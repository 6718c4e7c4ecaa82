/* fz_alloc.h - kvidx's default allocator (KVIDX_MALLOC / KVIDX_CALLOC /
 * KVIDX_FREE) for fuzz_ops and fuzz_snapshot; include before kvidx.h.
 *
 * Under ASan, blocks of FZ_BIG bytes or more (an index's fixed part, its
 * tables) are not given back to ASan when freed but kept, poisoned, and
 * handed out again for the same size by a later input (fz_alloc_next_input()
 * at the start of each input): ASan maps such blocks fresh for every
 * allocation, and their page faults were ~10% of fuzz_ops' run time.
 *
 * What ASan still sees: a cached block is poisoned, so any access to it
 * (a use after free within the input) is reported (as use-after-poison); a
 * block freed twice is caught here; a pointer ASan does not own (not the
 * start of a live block) goes to free() and ASan reports it.  Blocks are
 * reused only by a later input (kvidx keeps no state between indexes), so a
 * stale pointer into a freed table always hits poison, never a live
 * block.  Overruns hit ASan's own redzones (blocks are reused for their exact
 * size only).  Without ASan these are plain malloc / calloc / free.
 *
 * Every block fz_malloc hands out is filled with 0xbe (ASan's malloc fills
 * only its first 4 KiB; a fresh mapping is zeros): kvidx must never read
 * memory it has not written as if it were zero (a table with control bytes
 * leaves its entries unzeroed, kvidx__place_used). */
#ifndef FZ_ALLOC_H
#define FZ_ALLOC_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define FZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_ASAN 1
#endif
#endif

#ifdef FZ_ASAN
void __asan_poison_memory_region(void const volatile *addr, size_t size);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
int __sanitizer_get_ownership(const volatile void *p);
size_t __sanitizer_get_allocated_size(const volatile void *p);

#define FZ_BIG 16384         /* smaller blocks go through ASan as they are */
#define FZ_CACHE 48          /* cached blocks                              */
#define FZ_CACHE_BYTES (96u << 20)

typedef struct {
  void *p;
  size_t n;
  unsigned epoch; /* the input that freed it */
} fz_cached;
static fz_cached fz_cache[FZ_CACHE];
static int fz_ncache;
static size_t fz_cache_bytes;
static unsigned fz_epoch;

static inline void fz_alloc_next_input(void) { fz_epoch++; }

static inline void fz_cache_drop(int i) {
  fz_cache_bytes -= fz_cache[i].n;
  fz_cache[i] = fz_cache[--fz_ncache];
}

static inline void *fz_cache_take(size_t n) {
  for (int i = fz_ncache; i-- > 0;)
    if (fz_cache[i].n == n && fz_cache[i].epoch != fz_epoch) {
      void *p = fz_cache[i].p;
      fz_cache_drop(i);
      __asan_unpoison_memory_region(p, n);
      return p;
    }
  return NULL;
}

static inline void *fz_malloc(size_t n) {
  void *p = n >= FZ_BIG ? fz_cache_take(n) : NULL;
  if (!p) p = malloc(n);
  if (p) memset(p, 0xbe, n); /* all of it (ASan's malloc fills 4 KiB): see below */
  return p;
}

static inline void *fz_calloc(size_t n) {
  void *p = n >= FZ_BIG ? fz_cache_take(n) : NULL;
  if (!p) return calloc(1, n);
  memset(p, 0, n);
  return p;
}

static inline void fz_free(void *p) {
  size_t n;
  if (!p) return;
  if (!__sanitizer_get_ownership(p) || (n = __sanitizer_get_allocated_size(p)) < FZ_BIG) {
    free(p); /* ASan judges it */
    return;
  }
  for (int i = 0; i < fz_ncache; i++)
    if (fz_cache[i].p == p) {
      fprintf(stderr, "\n*** FUZZ: double free of %p (%zu bytes, cached by fz_alloc.h)\n", p, n);
      abort();
    }
  while (fz_ncache && (fz_ncache == FZ_CACHE || fz_cache_bytes + n > FZ_CACHE_BYTES)) {
    void *q = fz_cache[0].p;
    __asan_unpoison_memory_region(q, fz_cache[0].n);
    fz_cache_drop(0);
    free(q);
  }
  __asan_poison_memory_region(p, n);
  fz_cache[fz_ncache].p = p;
  fz_cache[fz_ncache].n = n;
  fz_cache[fz_ncache].epoch = fz_epoch;
  fz_cache_bytes += n;
  fz_ncache++;
}
#else
static inline void fz_alloc_next_input(void) {}
static inline void *fz_malloc(size_t n) {
  void *p = malloc(n);
  if (p) memset(p, 0xbe, n); /* see below */
  return p;
}
static inline void *fz_calloc(size_t n) { return calloc(1, n); }
static inline void fz_free(void *p) { free(p); }
#endif

#define KVIDX_MALLOC(sz) fz_malloc(sz)
#define KVIDX_CALLOC(sz) fz_calloc(sz)
#define KVIDX_FREE(p) fz_free(p)

#endif

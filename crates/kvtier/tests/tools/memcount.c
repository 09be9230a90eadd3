// Counts the bytes a process copies in user space with memcpy / memmove,
// calls of at least MEMCOUNT_THRESHOLD bytes (default 64 KiB) only: payload
// copies, not metadata. Loaded with LD_PRELOAD; Rust's copies of non-constant
// size go through libc's memcpy / memmove (the binary imports both), so they
// land here. Writes {"calls": N, "bytes": B} to $MEMCOUNT_OUT at exit.
// The kernel's socket copies are not user-space copies and are not counted.
// Used by crates/kvtier/tests/copies.rs and scripts/count-copies.py.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static atomic_ullong big_calls, big_bytes;
static size_t threshold = 65536;
static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);
void *memcpy(void *d, const void *s, size_t n) {
  if (n >= threshold) { atomic_fetch_add(&big_calls, 1); atomic_fetch_add(&big_bytes, n); }
  if (!real_memcpy) { char *dd = d; const char *ss = s; for (size_t i = 0; i < n; i++) dd[i] = ss[i]; return d; }
  return real_memcpy(d, s, n);
}
void *memmove(void *d, const void *s, size_t n) {
  if (n >= threshold) { atomic_fetch_add(&big_calls, 1); atomic_fetch_add(&big_bytes, n); }
  if (!real_memmove) { char *dd = d; const char *ss = s; if (dd < ss) { for (size_t i = 0; i < n; i++) dd[i] = ss[i]; } else { for (size_t i = n; i > 0; i--) dd[i-1] = ss[i-1]; } return d; }
  return real_memmove(d, s, n);
}
__attribute__((constructor)) static void init(void) {
  real_memcpy = dlsym(RTLD_NEXT, "memcpy");
  real_memmove = dlsym(RTLD_NEXT, "memmove");
  const char *t = getenv("MEMCOUNT_THRESHOLD");
  if (t) threshold = strtoull(t, 0, 10);
}
__attribute__((destructor)) static void dump(void) {
  const char *p = getenv("MEMCOUNT_OUT");
  if (!p) return;
  FILE *f = fopen(p, "w");
  if (!f) return;
  fprintf(f, "{\"calls\": %llu, \"bytes\": %llu}\n", (unsigned long long)big_calls, (unsigned long long)big_bytes);
  fclose(f);
}

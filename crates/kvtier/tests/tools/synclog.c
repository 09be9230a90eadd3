// Logs the durability calls a process makes: every successful fsync and
// fdatasync with the path of the file or directory synced (resolved through
// /proc/self/fd), and every successful rename. Loaded with LD_PRELOAD; Rust's
// File::sync_all / sync_data and fs::rename call libc's fsync / fdatasync /
// rename, so they land here. One line per call, appended with a single
// write(2) to $SYNCLOG_OUT as the call returns, so a reader sees a call as
// soon as it completed:
//   fsync <path> | fdatasync <path> | rename <from> <to>
// Used by crates/kvtier/tests/sync_calls.rs.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int out = -1;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);

static void emit(const char *op, const char *a, const char *b) {
  if (out < 0) return;
  char line[3 * PATH_MAX];
  int n = b ? snprintf(line, sizeof line, "%s %s %s\n", op, a, b)
            : snprintf(line, sizeof line, "%s %s\n", op, a);
  if (n > 0 && (size_t)n < sizeof line) { ssize_t w = write(out, line, (size_t)n); (void)w; }
}

static void emit_fd(const char *op, int fd) {
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 0) return;
  path[n] = 0;
  emit(op, path, 0);
}

int fsync(int fd) {
  if (!real_fsync) real_fsync = dlsym(RTLD_NEXT, "fsync");
  int rc = real_fsync(fd);
  if (rc == 0) emit_fd("fsync", fd);
  return rc;
}

int fdatasync(int fd) {
  if (!real_fdatasync) real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
  int rc = real_fdatasync(fd);
  if (rc == 0) emit_fd("fdatasync", fd);
  return rc;
}

int rename(const char *from, const char *to) {
  if (!real_rename) real_rename = dlsym(RTLD_NEXT, "rename");
  int rc = real_rename(from, to);
  if (rc == 0) emit("rename", from, to);
  return rc;
}

__attribute__((constructor)) static void init(void) {
  const char *p = getenv("SYNCLOG_OUT");
  if (p) out = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

/* main.c - runs a libFuzzer target without libFuzzer: replays every file
 * named on the command line (directories: every regular file inside, in name
 * order), or standard input when there are no arguments.  Links with any
 * fuzz_*.c here; build with gcc (see fuzz.mk), so the corpus is a regression
 * test.  Each file runs in a child process, so one failing input (a mismatch
 * aborts) does not hide the others: every failing file is named, and the exit
 * status is 1 if any failed.  FUZZ_NO_FORK=1 runs them in-process;
 * with FUZZ_TIME=1 as well, each input's run time goes to stderr (profiling). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t n_run, n_failed;

/* All of f, in a heap buffer (its length in *len). */
static uint8_t *read_all(FILE *f, size_t *len) {
  size_t cap = 4096;
  uint8_t *buf = (uint8_t *)malloc(cap);
  if (!buf) abort();
  *len = 0;
  for (;;) {
    if (*len == cap) {
      cap *= 2;
      buf = (uint8_t *)realloc(buf, cap);
      if (!buf) abort();
    }
    size_t got = fread(buf + *len, 1, cap - *len, f);
    if (got == 0) break;
    *len += got;
  }
  return buf;
}

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 1;
  }
  size_t len;
  uint8_t *buf = read_all(f, &len);
  fclose(f);
  /* exact-size copy so that reads past the end are caught by ASan */
  uint8_t *in = (uint8_t *)malloc(len ? len : 1);
  if (!in) abort();
  memcpy(in, buf, len);
  free(buf);
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "== %s (%zu bytes)\n", path, len);
  n_run++;
  const char *nf = getenv("FUZZ_NO_FORK");
  if (nf && *nf && *nf != '0') {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    LLVMFuzzerTestOneInput(in, len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("FUZZ_TIME"))
      fprintf(stderr, "%.3f ms %s\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6, path);
    free(in);
    return 0;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    LLVMFuzzerTestOneInput(in, len);
    free(in);
    return 0;
  }
  if (pid == 0) {
    LLVMFuzzerTestOneInput(in, len);
    free(in);
    fflush(NULL);
    exit(0); /* exit, not _exit: LeakSanitizer runs at exit */
  }
  free(in);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0) {}
  if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) {
    n_failed++;
    fprintf(stderr, "FAILED: %s (%s %d)\n", path, WIFSIGNALED(ws) ? "signal" : "exit status",
            WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
    return 1;
  }
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) return run_file(path);
  DIR *d = opendir(path);
  if (!d) {
    perror(path);
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      names = (char **)realloc(names, cap * sizeof *names);
      if (!names) abort();
    }
    size_t l = strlen(path) + strlen(e->d_name) + 2;
    names[n] = (char *)malloc(l);
    if (!names[n]) abort();
    snprintf(names[n], l, "%s/%s", path, e->d_name);
    n++;
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, cmp_str);
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat fs;
    if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) rc |= run_file(names[i]);
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  int rc = 0;
  if (argc < 2) {
    /* standard input */
    size_t len;
    uint8_t *buf = read_all(stdin, &len);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    n_run = 1;
  } else {
    for (int i = 1; i < argc; i++) {
      if (argv[i][0] == '-') continue; /* ignore libFuzzer-style flags */
      rc |= run_path(argv[i]);
    }
  }
  printf("%s: replayed %zu inputs, %zu failed\n", argv[0], n_run, n_failed);
  return rc || n_failed ? 1 : 0;
}

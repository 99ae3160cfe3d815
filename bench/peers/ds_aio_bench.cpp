/*
 * bench/peers/ds_aio_bench.cpp — a driver for DeepSpeed's async I/O core
 * (csrc/aio/common/ of a DeepSpeed checkout, libaio), built beside ztier by
 * vs_deepspeed_aio.sh to compare `ztier bench nvme` against it. Not part of
 * ztier's build or tests: it compiles only against that checkout.
 *
 * It does what DeepSpeed's py_test/aio benchmark does with its default
 * engine (aio_handle, one thread, io_parallel 1, overlapped submission and
 * completion, queue_depth iocbs submitted in one io_submit), without Python
 * or torch: one whole-file O_DIRECT read or write of --size bytes between
 * the file and one page-locked buffer of the same size, in blocks of
 * --block with --qd in flight, through do_aio_operation_overlap. The rate
 * is DeepSpeed's own (deepspeed_aio_perf_t._e2e_rate_GB: bytes over the
 * time of that call, 10^9 bytes/s). The file must exist and hold --size
 * bytes; a write overwrites it in place (open without O_TRUNC, as
 * DeepSpeed's open_file does). Every write writes the same bytes, and
 * --verify checks after each read (outside the timing) that the buffer
 * holds them.
 *
 *   ds_aio_bench --file F --size BYTES --block BYTES --qd N --op LIST
 *                [--sequential] [--single-submit] [--reps R] [--verify]
 *                [--settle S]
 *
 * --op is read, write, or a list of them run in order each rep ("write,read");
 * --settle S waits S seconds before each write and between a write and the
 * read after it.
 * Prints one JSON object per operation on stdout:
 *   {"peer": "deepspeed_aio", "op": "read", "block_bytes": 1048576,
 *    "queue_depth": 8, "size_bytes": 4294967296, "seconds": 1.7, "gbps": 2.5}
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>

#include "deepspeed_aio_common.h" // defines: do_aio_operation_overlap, open_file

static long long parse_size(const char *s) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || v <= 0) return -1;
  switch (*end) {
  case 'K': case 'k': v <<= 10; end++; break;
  case 'M': case 'm': v <<= 20; end++; break;
  case 'G': case 'g': v <<= 30; end++; break;
  default: break;
  }
  if (*end == 'i') end++;
  if (*end == 'B') end++;
  return *end ? -1 : v;
}

/* The bytes every write puts in the file, so that a read can be checked
 * (outside the timed call) against what the driver wrote there. */
static void fill(void *buf, long long size) {
  for (long long i = 0; i < size; i += 8)
    *(uint64_t *)((char *)buf + i) = (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

static bool holds_fill(const void *buf, long long size) {
  for (long long i = 0; i < size; i += 8)
    if (*(const uint64_t *)((const char *)buf + i) != (uint64_t)i * 0x9E3779B97F4A7C15ull)
      return false;
  return true;
}

/* One timed whole-file operation through DeepSpeed's core, and its line. A
 * checked read starts from a zeroed buffer (outside the timing) and must
 * end holding the bytes every write writes, which leaves the buffer ready
 * for the next write. */
static int run_op(const char *prog, const char *file, bool read_op, bool verify, void *buf,
                  long long size, deepspeed_aio_config_t *config) {
  const int fd = open_file(file, read_op);
  if (fd < 0) return 1;
  int64_t fsize = 0;
  if (get_fd_file_size(fd, fsize) != 0 || fsize < size) {
    fprintf(stderr, "%s: %s holds %lld bytes; expected at least %lld\n", prog, file,
            (long long)fsize, size);
    close(fd);
    return 1;
  }
  if (read_op && verify) memset(buf, 0, (size_t)size);
  std::unique_ptr<io_xfer_ctxt> xfer(new io_xfer_ctxt(fd, 0, 0, size, buf));
  std::unique_ptr<aio_context> ctxt(new aio_context(config->_block_size, config->_queue_depth));
  deepspeed_aio_perf_t perf;
  memset(&perf, 0, sizeof perf);
  if (config->_overlap_events)
    do_aio_operation_overlap(read_op, ctxt, xfer, config, &perf);
  else
    do_aio_operation_sequential(read_op, ctxt, xfer, config, &perf);
  close(fd);
  // DeepSpeed does not look at the events' results: a read is checked here.
  if (read_op && verify && !holds_fill(buf, size)) {
    fprintf(stderr, "%s: the bytes read from %s are not those this driver writes\n", prog,
            file);
    return 1;
  }
  printf("{\"peer\": \"deepspeed_aio\", \"op\": \"%s\", \"block_bytes\": %d, "
         "\"queue_depth\": %d, \"size_bytes\": %lld, \"overlap\": %s, \"seconds\": %.6f, "
         "\"gbps\": %.6f}\n",
         read_op ? "read" : "write", config->_block_size, config->_queue_depth, size,
         config->_overlap_events ? "true" : "false", perf._e2e_usec * 1e-6, perf._e2e_rate_GB);
  fflush(stdout);
  return 0;
}

static int usage(const char *prog) {
  fprintf(stderr,
          "usage: %s --file F --size BYTES --block BYTES --qd N --op LIST "
          "[--sequential] [--single-submit] [--reps R] [--verify] [--settle S]\n",
          prog);
  return 2;
}

int main(int argc, char **argv) {
  const char *file = NULL, *op = NULL;
  long long size = -1, block = -1, qd = -1, reps = 1, settle = 0;
  bool sequential = false, single_submit = false, verify = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--sequential")) sequential = true;
    else if (!strcmp(a, "--single-submit")) single_submit = true;
    else if (!strcmp(a, "--verify")) verify = true;
    else if (!v) return usage(argv[0]);
    else if (!strcmp(a, "--file")) file = v, i++;
    else if (!strcmp(a, "--op")) op = v, i++;
    else if (!strcmp(a, "--size")) size = parse_size(v), i++;
    else if (!strcmp(a, "--block")) block = parse_size(v), i++;
    else if (!strcmp(a, "--qd")) qd = parse_size(v), i++;
    else if (!strcmp(a, "--reps")) reps = parse_size(v), i++;
    else if (!strcmp(a, "--settle")) settle = atoll(v), i++;
    else return usage(argv[0]);
  }
  // --op is a list run in order each rep: "write,read" writes then reads.
  bool ops[8];
  int n_ops = 0;
  for (const char *p = op; p && *p && n_ops < 8; n_ops++) {
    size_t n = strcspn(p, ",");
    if ((n == 4 && !strncmp(p, "read", 4)) || (n == 5 && !strncmp(p, "write", 5)))
      ops[n_ops] = n == 4;
    else
      return usage(argv[0]);
    p += n + (p[n] == ',');
  }
  if (!file || n_ops == 0 || size <= 0 || block <= 0 || qd <= 0 || reps <= 0 ||
      size % block || block > (1ll << 30))
    return usage(argv[0]);

  // DeepSpeed's py_test buffer is a page-locked tensor of the whole size:
  // aligned, every page touched and locked before the timed call.
  void *buf = NULL;
  if (posix_memalign(&buf, 4096, (size_t)size)) {
    fprintf(stderr, "%s: cannot allocate %lld bytes\n", argv[0], size);
    return 1;
  }
  fill(buf, size);
  if (mlock(buf, (size_t)size) != 0)
    fprintf(stderr, "%s: mlock of %lld bytes refused (%s): buffer not locked\n", argv[0], size,
            strerror(errno));

  deepspeed_aio_config_t config((int)block, (int)qd, single_submit, !sequential, false);
  for (long long r = 0; r < reps; r++)
    for (int k = 0; k < n_ops; k++) {
      // As `ztier bench nvme --settle`: a write, and a read after a write,
      // start once a disk that took the writes before them into a cache has
      // had time to write them back.
      if (settle > 0 && (!ops[k] || (k > 0 && !ops[k - 1]))) sleep((unsigned)settle);
      if (run_op(argv[0], file, ops[k], verify, buf, size, &config) != 0) return 1;
    }
  munlock(buf, (size_t)size);
  free(buf);
  return 0;
}

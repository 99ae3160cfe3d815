/*
 * src/tool/env_report.c — `ztier report`: what this build of ztier is and
 * what this machine offers it, in the spirit of DeepSpeed's ds_report, for
 * bug reports and for questions like "why does the nvme tier run buffered
 * here".
 *
 * Each probe does what ztier itself would do, on a small scale: the CPU
 * dispatcher's choice of kernels (src/cpu/cpu_dispatch.c), an io_uring ring
 * of 8 entries, an O_DIRECT write and read of one 4 KiB block in a temporary
 * file under --path (removed at once), an mlock of one page, the CUDA
 * runtime's device count and NCCL's version (cuda/cuda_probe.h; a build
 * without CUDA says so), and MPI_Get_library_version, which the standard
 * allows before MPI_Init. The report ends with one line per feature: whether
 * it works here, and why not when it does not.
 *
 * Nothing here needs a GPU, a launcher or MPI_Init: a probe that fails is a
 * line of the report, not a failure of the command. Exit status: 0 once the
 * report is printed (whatever it says), 2 for a bad argument (--path not a
 * directory), 1 when the report could not be written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h> // defines: sched_getaffinity, CPU_COUNT
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>     // defines: mlock
#include <sys/resource.h> // defines: getrlimit, RLIMIT_MEMLOCK
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/vfs.h> // defines: fstatfs
#include <unistd.h>

#include <liburing.h> // defines: io_uring_queue_init, IO_URING_VERSION_*
#include <numa.h>     // defines: numa_available, numa_num_configured_nodes
#if ZT_HAVE_MPI
/* The Makefile gives this file MPI's compile flags, as it does comm_mpi.c. */
#include <mpi.h> // defines: MPI_Get_library_version, MPI_MAX_LIBRARY_VERSION_STRING
#endif

#include "cpu/cpu_kernels.h" // defines: zt__isa_detect, zt__isa_supported, zt__isa_name
#include "cuda/cuda_probe.h" // defines: zt__cuda_probe
#include "tool/args.h"       // defines: tool_args_parse
#include "tool/report.h"     // defines: tool_report_*, tool_table_*
#include "ztier.h"           // defines: zt_version

int tool_report_main(int argc, char **argv);

/* What a sanitizer build left behind. GCC defines a macro for ASan and
 * TSan but none for UBSan, whose runtime's handlers a weak reference finds
 * (linked only under -fsanitize=undefined; declared as the runtime declares
 * it, which GCC checks). Clang says so by __has_feature, and must: its ASan
 * runtime carries the UBSan handlers as well. */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
void __ubsan_handle_add_overflow(void *, void *, void *) __attribute__((weak));

#define SMALL 256 /* a sentence of the report */

typedef struct feature {
  int ok;
  char detail[2 * SMALL + PATH_MAX]; /* what works, or why not */
} feature_t;

typedef struct env {
  /* build */
  char compiler[128];
  char sanitizers[64]; /* "address undefined", "" for none */
  /* cpu */
  zt__isa_t isa, isa_best;
  long cores_online;
  int cores_usable;
  int numa, numa_nodes;
  /* memory */
  char thp[32];                          /* "" when the kernel has none */
  long long hp_total, hp_free, hp_bytes; /* -1: not in /proc/meminfo    */
  long long mem_total;                   /* MemTotal in bytes, -1: unknown */
  int memlock_unlimited;
  unsigned long long memlock_bytes;
  int cap_ipc_lock; /* mlock past the rlimit is allowed */
  int mlock_ok;
  char mlock_error[SMALL];
  /* io */
  char kernel[128];
  int uring_ok;
  char uring_error[SMALL];
  char path[PATH_MAX];
  char fs[64];
  unsigned long fs_magic;
  int direct_ok;
  char direct_error[SMALL];
  /* mpi */
  char mpi_version[SMALL]; /* "" when not built in */
  /* cuda */
  zt__cuda_probe_t cuda;
  /* works here */
  feature_t cpu_optimizer, nvme_tier, io_uring, pinned, mpi_comm, cuda_backend, nccl_comm;
} env_t;

/* ---- build ------------------------------------------------------------------------ */

static void probe_build(env_t *e) {
#if defined(__clang__)
  snprintf(e->compiler, sizeof e->compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
  snprintf(e->compiler, sizeof e->compiler, "gcc %s", __VERSION__);
#else
  snprintf(e->compiler, sizeof e->compiler, "unknown");
#endif
  char *s = e->sanitizers;
  size_t n = sizeof e->sanitizers;
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
  snprintf(s + strlen(s), n - strlen(s), "%saddress", s[0] ? " " : "");
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
  snprintf(s + strlen(s), n - strlen(s), "%sthread", s[0] ? " " : "");
#endif
#if defined(__clang__)
  int ubsan = __has_feature(undefined_behavior_sanitizer);
#else
  int ubsan = __ubsan_handle_add_overflow != NULL;
#endif
  if (ubsan) snprintf(s + strlen(s), n - strlen(s), "%sundefined", s[0] ? " " : "");
}

/* ---- cpu -------------------------------------------------------------------------- */

static void probe_cpu(env_t *e) {
  /* The ISA the engine's optimizer runs (ZT_CPU_ISA may lower it), and the
   * widest this CPU and build could run. */
  e->isa = zt__isa_detect();
  e->isa_best = ZT_ISA_SCALAR;
  if (zt__isa_supported(ZT_ISA_AVX2)) e->isa_best = ZT_ISA_AVX2;
  if (zt__isa_supported(ZT_ISA_AVX512)) e->isa_best = ZT_ISA_AVX512;
  e->cores_online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  e->cores_usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
  e->numa = numa_available() >= 0;
  e->numa_nodes = e->numa ? numa_num_configured_nodes() : 1;

  feature_t *f = &e->cpu_optimizer;
  f->ok = 1;
  if (e->isa == ZT_ISA_SCALAR && e->isa_best == ZT_ISA_SCALAR)
    snprintf(f->detail, sizeof f->detail,
             "scalar kernels: this CPU lacks AVX2, FMA or F16C, so the update runs several "
             "times slower");
  else if (e->isa < e->isa_best)
    snprintf(f->detail, sizeof f->detail, "%s kernels (ZT_CPU_ISA lowers them from %s)",
             zt__isa_name(e->isa), zt__isa_name(e->isa_best));
  else
    snprintf(f->detail, sizeof f->detail, "%s kernels", zt__isa_name(e->isa));
}

/* ---- memory ----------------------------------------------------------------------- */

/* The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled:
 * "always [madvise] never" is madvise. */
static void read_thp(char *out, size_t n) {
  out[0] = '\0';
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == NULL) return;
  char line[256];
  if (fgets(line, sizeof line, f)) {
    char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
    if (a && b) snprintf(out, n, "%.*s", (int)(b - a - 1), a + 1);
  }
  fclose(f);
}

/* The value of `key` ("HugePages_Total:") in /proc/meminfo, times 1024 when
 * it is given in kB; -1 when absent. */
static long long meminfo(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f == NULL) return -1;
  char line[256];
  long long v = -1;
  size_t k = strlen(key);
  while (v < 0 && fgets(line, sizeof line, f))
    if (strncmp(line, key, k) == 0) {
      char unit[8] = "";
      if (sscanf(line + k, "%lld %7s", &v, unit) < 1) v = -1;
      else if (strcmp(unit, "kB") == 0) v *= 1024;
    }
  fclose(f);
  return v;
}

/* CAP_IPC_LOCK (bit 14) in this process's effective capabilities: mlock
 * then ignores RLIMIT_MEMLOCK. */
static int has_cap_ipc_lock(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return 0;
  char line[256];
  unsigned long long caps = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "CapEff: %llx", &caps) == 1) break;
  fclose(f);
  return (int)((caps >> 14) & 1);
}

/* "8 MiB", "64 GiB", "512 bytes": a size for people. */
static const char *show_bytes(unsigned long long b, char *buf, size_t n) {
  static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = (double)b;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0) snprintf(buf, n, "%llu bytes", b);
  else snprintf(buf, n, v == (double)(long long)v ? "%.0f %s" : "%.1f %s", v, unit[u]);
  return buf;
}

static void probe_memory(env_t *e) {
  read_thp(e->thp, sizeof e->thp);
  e->hp_total = meminfo("HugePages_Total:");
  e->hp_free = meminfo("HugePages_Free:");
  e->hp_bytes = meminfo("Hugepagesize:");
  e->mem_total = meminfo("MemTotal:");
  struct rlimit rl = {0, 0};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  e->memlock_unlimited = rl.rlim_cur == RLIM_INFINITY;
  e->memlock_bytes = e->memlock_unlimited ? 0 : (unsigned long long)rl.rlim_cur;
  e->cap_ipc_lock = has_cap_ipc_lock();
  /* One page, as pinned.c locks its regions: some sandboxes refuse mlock
   * whatever the limit says. */
  long page = sysconf(_SC_PAGESIZE);
  void *p = aligned_alloc((size_t)page, (size_t)page);
  e->mlock_ok = p && mlock(p, (size_t)page) == 0;
  if (!e->mlock_ok) snprintf(e->mlock_error, sizeof e->mlock_error, "%s", strerror(errno));
  if (p && e->mlock_ok) munlock(p, (size_t)page);
  free(p);

  /* Pinned memory works everywhere; what the limit decides is whether it
   * stays in RAM. All of memory lockable counts as "works". */
  feature_t *f = &e->pinned;
  char a[32], b[32];
  if (!e->mlock_ok) {
    snprintf(f->detail, sizeof f->detail,
             "mlock of one page fails here (%s): pinned memory works but is never locked in "
             "RAM",
             e->mlock_error);
  } else if (e->memlock_unlimited || e->cap_ipc_lock) {
    f->ok = 1;
    snprintf(f->detail, sizeof f->detail, "locked in RAM without limit (%s)",
             e->memlock_unlimited ? "RLIMIT_MEMLOCK unlimited" : "CAP_IPC_LOCK");
  } else if (e->mem_total > 0 && e->memlock_bytes >= (unsigned long long)e->mem_total) {
    f->ok = 1;
    snprintf(f->detail, sizeof f->detail, "RLIMIT_MEMLOCK %s covers all %s of memory",
             show_bytes(e->memlock_bytes, a, sizeof a),
             show_bytes((unsigned long long)e->mem_total, b, sizeof b));
  } else {
    snprintf(f->detail, sizeof f->detail,
             "RLIMIT_MEMLOCK is %s: pinned memory past it works but is not locked and may "
             "be swapped out; raise it (ulimit -l unlimited, or memlock in "
             "/etc/security/limits.conf)",
             show_bytes(e->memlock_bytes, a, sizeof a));
  }
}

/* ---- io --------------------------------------------------------------------------- */

/* statfs's f_type for the filesystems swap files land on (linux/magic.h,
 * and the few it lacks). ext2 and ext3 share ext4's magic and are served by
 * its driver. */
static const char *fs_name(unsigned long magic) {
  static const struct {
    unsigned long magic;
    const char *name;
  } fs[] = {
      {0xEF53, "ext4"},       {0x58465342, "xfs"},      {0x9123683E, "btrfs"},
      {0x01021994, "tmpfs"},  {0x858458F6, "ramfs"},    {0x794C7630, "overlay"},
      {0x6969, "nfs"},        {0x2FC12FC1, "zfs"},      {0xF2F52010, "f2fs"},
      {0x65735546, "fuse"},   {0xFF534D42, "cifs"},     {0xFE534D42, "smb2"},
      {0x0BD00BD0, "lustre"}, {0x47504653, "gpfs"},     {0x00C36400, "ceph"},
      {0x01021997, "9p"},     {0x73717368, "squashfs"}, {0x4D44, "vfat"},
  };
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
    if (fs[i].magic == magic) return fs[i].name;
  return NULL;
}

static void probe_uring(env_t *e) {
  struct utsname u;
  if (uname(&u) == 0) snprintf(e->kernel, sizeof e->kernel, "%s", u.release);
  struct io_uring ring;
  int rc = io_uring_queue_init(8, &ring, 0);
  e->uring_ok = rc == 0;
  if (rc == 0) io_uring_queue_exit(&ring);
  feature_t *f = &e->io_uring;
  f->ok = e->uring_ok;
  if (rc == 0) {
    snprintf(f->detail, sizeof f->detail, "a ring of 8 entries set up");
    return;
  }
  const char *hint = "";
  if (rc == -ENOSYS)
    hint = "; this kernel has no io_uring (it came in Linux 5.1)";
  else if (rc == -EPERM || rc == -EACCES)
    hint = "; io_uring is disabled (sysctl kernel.io_uring_disabled) or blocked by a "
           "seccomp profile (containers)";
  else if (rc == -ENOMEM)
    hint = "; RLIMIT_MEMLOCK is too low for a ring on kernels before 5.12";
  snprintf(e->uring_error, sizeof e->uring_error, "io_uring_queue_init: %s%s", strerror(-rc),
           hint);
  snprintf(f->detail, sizeof f->detail, "%s", e->uring_error);
}

/* One aligned 4 KiB block written and read back with O_DIRECT in a file of
 * its own under `dir`, set the way the swap engine sets it (F_SETFL after
 * the open, so "cannot create" and "refuses O_DIRECT" read apart). The file
 * is unlinked as soon as it is open. 0, or a sentence in `why`. */
static int try_direct(const char *dir, char *why, size_t n) {
  enum { BLOCK = 4096 };
  char name[PATH_MAX + 32];
  snprintf(name, sizeof name, "%s/.ztier-report-XXXXXX", dir);
  int fd = mkostemp(name, O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, n, "cannot create a file in %s: %s", dir, strerror(errno));
    return -1;
  }
  unlink(name);
  int rc = -1, fl = fcntl(fd, F_GETFL);
  unsigned char *w = NULL, *r = NULL;
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) {
    snprintf(why, n, "the filesystem refuses O_DIRECT (%s): swap files there run buffered",
             strerror(errno));
    goto out;
  }
  if (posix_memalign((void **)&w, BLOCK, BLOCK) != 0 ||
      posix_memalign((void **)&r, BLOCK, BLOCK) != 0) {
    snprintf(why, n, "out of memory for the test block");
    goto out;
  }
  for (int i = 0; i < BLOCK; i++) w[i] = (unsigned char)(i * 7 + 1);
  memset(r, 0, BLOCK);
  ssize_t k = pwrite(fd, w, BLOCK, 0);
  if (k != BLOCK) {
    snprintf(why, n, "an aligned 4 KiB O_DIRECT write failed: %s",
             k < 0 ? strerror(errno) : "short write");
    goto out;
  }
  k = pread(fd, r, BLOCK, 0);
  if (k != BLOCK) {
    snprintf(why, n, "an aligned 4 KiB O_DIRECT read failed: %s",
             k < 0 ? strerror(errno) : "short read");
    goto out;
  }
  if (memcmp(w, r, BLOCK) != 0) {
    snprintf(why, n, "an O_DIRECT read returned other bytes than were written");
    goto out;
  }
  rc = 0;
out:
  free(w);
  free(r);
  close(fd);
  return rc;
}

static void probe_path(env_t *e) {
  struct statfs s;
  const char *name = NULL;
  if (statfs(e->path, &s) == 0) {
    e->fs_magic = (unsigned long)s.f_type;
    name = fs_name(e->fs_magic);
  }
  if (name) snprintf(e->fs, sizeof e->fs, "%s", name);
  else snprintf(e->fs, sizeof e->fs, "unknown (magic 0x%lx)", e->fs_magic);
  e->direct_ok = try_direct(e->path, e->direct_error, sizeof e->direct_error) == 0;

  feature_t *f = &e->nvme_tier;
  f->ok = e->direct_ok && e->uring_ok;
  if (!e->uring_ok)
    snprintf(f->detail, sizeof f->detail, "no io_uring: %s", e->uring_error);
  else if (!e->direct_ok)
    snprintf(f->detail, sizeof f->detail, "%s (%s, %s)", e->direct_error, e->fs, e->path);
  else
    snprintf(f->detail, sizeof f->detail, "O_DIRECT on %s (%s)", e->fs, e->path);
}

/* ---- mpi and cuda ----------------------------------------------------------------- */

static void probe_mpi(env_t *e) {
  feature_t *f = &e->mpi_comm;
#if ZT_HAVE_MPI
  /* MPI_MAX_LIBRARY_VERSION_STRING is 256 in Open MPI, 8192 in MPICH. */
  char *v = malloc(MPI_MAX_LIBRARY_VERSION_STRING);
  int len = 0;
  if (v && MPI_Get_library_version(v, &len) == MPI_SUCCESS) {
    v[len > 0 && len < MPI_MAX_LIBRARY_VERSION_STRING ? len : 0] = '\0';
    /* Open MPI's is one line; MPICH's many: the first says which. */
    v[strcspn(v, "\r\n")] = '\0';
    snprintf(e->mpi_version, sizeof e->mpi_version, "%s", v);
  }
  free(v);
  f->ok = 1;
  snprintf(f->detail, sizeof f->detail, "comm \"mpi\" built in; ranks come from mpirun");
#else
  snprintf(f->detail, sizeof f->detail,
           "this libztier was built without MPI (MPI=0, or no mpi.h at build time)");
#endif
}

static void probe_cuda(env_t *e) {
  zt__cuda_probe(&e->cuda);
  const zt__cuda_probe_t *c = &e->cuda;
  feature_t *f = &e->cuda_backend, *g = &e->nccl_comm;
  if (c->device_count > 0) {
    f->ok = 1;
    snprintf(f->detail, sizeof f->detail, "%d device%s", c->device_count,
             c->device_count == 1 ? "" : "s");
  } else {
    snprintf(f->detail, sizeof f->detail, "%s", c->error);
  }
  if (!c->built)
    snprintf(g->detail, sizeof g->detail, "%s", c->error);
  else if (c->device_count <= 0)
    snprintf(g->detail, sizeof g->detail, "NCCL needs a GPU: %s", c->error);
  else if (c->nccl_version <= 0)
    snprintf(g->detail, sizeof g->detail, "ncclGetVersion failed: NCCL is not usable");
  else
    g->ok = 1, snprintf(g->detail, sizeof g->detail, "comm \"nccl\" on the devices above");
}

/* "12.4" from the runtime's 12040; NULL for 0. */
static const char *cuda_ver(int v, char *buf, size_t n) {
  if (v <= 0) return NULL;
  snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10);
  return buf;
}

/* "2.21.5" from NCCL's code: major*10000 + minor*100 + patch since 2.9,
 * major*1000 + minor*100 + patch before. NULL for 0. */
static const char *nccl_ver(int v, char *buf, size_t n) {
  if (v <= 0) return NULL;
  if (v >= 10000) snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  else snprintf(buf, n, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
  return buf;
}

/* ---- printing --------------------------------------------------------------------- */

/* liburing states its version in its headers from 2.2 on; older ones do
 * not (NULL). `ztier version` prints it too. */
#if defined(IO_URING_VERSION_MAJOR) && defined(IO_URING_VERSION_MINOR)
#define STR2(x) #x
#define STR(x) STR2(x)
#define LIBURING_VERSION STR(IO_URING_VERSION_MAJOR) "." STR(IO_URING_VERSION_MINOR)
#else
#define LIBURING_VERSION NULL
#endif

const char *tool_liburing_version(void) { return LIBURING_VERSION; }

static cJSON *feature_json(const feature_t *f) {
  cJSON *o = tool_report_new();
  tool_report_bool(o, "ok", f->ok);
  tool_report_str(o, "detail", f->detail);
  return o;
}

/* Adds `item` under `key`; a NULL item (out of memory) fails the print. */
static void put_obj(cJSON *o, const char *key, cJSON *item) {
  if (o && (item == NULL || !cJSON_AddItemToObject(o, key, item))) {
    cJSON_Delete(item);
    cJSON_AddItemToObject(o, key, cJSON_CreateNull());
  }
}

static int print_json(const env_t *e, const char *prog) {
  char a[32];
  cJSON *j = tool_report_new(), *o;
  tool_report_str(j, "version", zt_version());

  o = tool_report_new();
  tool_report_str(o, "compiler", e->compiler);
  tool_report_bool(o, "cuda", ZT_HAVE_CUDA);
  tool_report_bool(o, "mpi", ZT_HAVE_MPI);
  cJSON *san = cJSON_CreateArray();
  char words[sizeof e->sanitizers];
  snprintf(words, sizeof words, "%s", e->sanitizers);
  for (char *w = strtok(words, " "); san && w; w = strtok(NULL, " "))
    cJSON_AddItemToArray(san, cJSON_CreateString(w));
  put_obj(o, "sanitizers", san);
  tool_report_str(o, "liburing_version", LIBURING_VERSION);
  put_obj(j, "build", o);

  o = tool_report_new();
  tool_report_str(o, "isa", zt__isa_name(e->isa));
  tool_report_str(o, "isa_best", zt__isa_name(e->isa_best));
  tool_report_int(o, "cores_online", e->cores_online);
  tool_report_int(o, "cores_usable", e->cores_usable);
  tool_report_bool(o, "numa", e->numa);
  tool_report_int(o, "numa_nodes", e->numa_nodes);
  put_obj(j, "cpu", o);

  o = tool_report_new();
  tool_report_str(o, "thp", e->thp[0] ? e->thp : NULL);
  if (e->hp_total >= 0) tool_report_int(o, "hugepages_total", e->hp_total);
  else tool_report_null(o, "hugepages_total");
  if (e->hp_free >= 0) tool_report_int(o, "hugepages_free", e->hp_free);
  else tool_report_null(o, "hugepages_free");
  if (e->hp_bytes >= 0) tool_report_int(o, "hugepage_bytes", e->hp_bytes);
  else tool_report_null(o, "hugepage_bytes");
  if (e->memlock_unlimited) tool_report_null(o, "memlock_limit_bytes");
  else tool_report_uint(o, "memlock_limit_bytes", e->memlock_bytes);
  tool_report_bool(o, "cap_ipc_lock", e->cap_ipc_lock);
  tool_report_bool(o, "mlock", e->mlock_ok);
  if (e->mem_total >= 0) tool_report_int(o, "mem_total_bytes", e->mem_total);
  else tool_report_null(o, "mem_total_bytes");
  put_obj(j, "memory", o);

  o = tool_report_new();
  tool_report_str(o, "kernel", e->kernel);
  tool_report_bool(o, "io_uring", e->uring_ok);
  tool_report_str(o, "io_uring_error", e->uring_ok ? NULL : e->uring_error);
  tool_report_str(o, "path", e->path);
  tool_report_str(o, "fs_type", e->fs);
  snprintf(a, sizeof a, "0x%lx", e->fs_magic);
  tool_report_str(o, "fs_magic", a);
  tool_report_bool(o, "o_direct", e->direct_ok);
  tool_report_str(o, "o_direct_error", e->direct_ok ? NULL : e->direct_error);
  put_obj(j, "io", o);

  o = tool_report_new();
  tool_report_bool(o, "built", ZT_HAVE_MPI);
  tool_report_str(o, "library_version", e->mpi_version[0] ? e->mpi_version : NULL);
  put_obj(j, "mpi", o);

  const zt__cuda_probe_t *c = &e->cuda;
  o = tool_report_new();
  tool_report_bool(o, "built", c->built);
  tool_report_str(o, "runtime_version", cuda_ver(c->runtime_version, a, sizeof a));
  tool_report_str(o, "driver_version", cuda_ver(c->driver_version, a, sizeof a));
  tool_report_int(o, "device_count", c->device_count);
  cJSON *devs = cJSON_CreateArray();
  for (int i = 0; devs && i < c->n_devices; i++) {
    cJSON *d = tool_report_new();
    tool_report_str(d, "name", c->devices[i].name);
    snprintf(a, sizeof a, "%d.%d", c->devices[i].major, c->devices[i].minor);
    tool_report_str(d, "compute_capability", a);
    tool_report_uint(d, "bytes", c->devices[i].bytes);
    if (d == NULL || !cJSON_AddItemToArray(devs, d)) cJSON_Delete(d);
  }
  put_obj(o, "devices", devs);
  tool_report_str(o, "error", c->error[0] ? c->error : NULL);
  tool_report_str(o, "nccl_version", nccl_ver(c->nccl_version, a, sizeof a));
  put_obj(j, "cuda", o);

  o = tool_report_new();
  put_obj(o, "cpu_optimizer", feature_json(&e->cpu_optimizer));
  put_obj(o, "nvme_tier", feature_json(&e->nvme_tier));
  put_obj(o, "io_uring", feature_json(&e->io_uring));
  put_obj(o, "pinned_memory", feature_json(&e->pinned));
  put_obj(o, "mpi_comm", feature_json(&e->mpi_comm));
  put_obj(o, "cuda_backend", feature_json(&e->cuda_backend));
  put_obj(o, "nccl_comm", feature_json(&e->nccl_comm));
  put_obj(j, "works", o);
  return tool_report_print(stdout, j, prog) < 0;
}

static void works_row(tool_table_t *t, const char *what, const feature_t *f) {
  tool_table_row(t, "  %s\t%s\t%s", what, f->ok ? "yes" : "no", f->detail);
}

static int print_text(const env_t *e) {
  char a[32], b[32];
  const zt__cuda_probe_t *c = &e->cuda;
  printf("ztier %s\n\n", zt_version());
  tool_table_t *t = tool_table_new("lll");
  tool_table_row(t, "build");
  tool_table_row(t, "  compiler\t%s", e->compiler);
  tool_table_row(t, "  cuda\t%s", ZT_HAVE_CUDA ? "built in" : "not built in (CUDA=0)");
  tool_table_row(t, "  mpi\t%s", ZT_HAVE_MPI ? "built in" : "not built in (MPI=0)");
  tool_table_row(t, "  sanitizers\t%s", e->sanitizers[0] ? e->sanitizers : "none");
  tool_table_row(t, "  liburing\t%s",
                 LIBURING_VERSION ? LIBURING_VERSION : "version not stated in its headers");
  tool_table_row(t, "cpu");
  tool_table_row(t, "  kernels (ISA)\t%s%s%s%s", zt__isa_name(e->isa),
                 e->isa < e->isa_best ? " (ZT_CPU_ISA; this CPU runs " : "",
                 e->isa < e->isa_best ? zt__isa_name(e->isa_best) : "",
                 e->isa < e->isa_best ? ")" : "");
  tool_table_row(t, "  cores\t%ld online, %d usable by this process", e->cores_online,
                 e->cores_usable);
  tool_table_row(t, "  NUMA nodes\t%d%s", e->numa_nodes, e->numa ? "" : " (no NUMA support)");
  tool_table_row(t, "memory");
  tool_table_row(t, "  transparent huge pages\t%s", e->thp[0] ? e->thp : "not in this kernel");
  if (e->hp_total >= 0)
    tool_table_row(t, "  huge pages (hugetlbfs)\t%lld free of %lld, %s each", e->hp_free,
                   e->hp_total, show_bytes((unsigned long long)e->hp_bytes, a, sizeof a));
  tool_table_row(t, "  RLIMIT_MEMLOCK\t%s%s",
                 e->memlock_unlimited ? "unlimited" : show_bytes(e->memlock_bytes, b, sizeof b),
                 e->cap_ipc_lock ? " (CAP_IPC_LOCK: mlock ignores it)" : "");
  tool_table_row(t, "io");
  tool_table_row(t, "  kernel\t%s", e->kernel);
  tool_table_row(t, "  io_uring\t%s", e->uring_ok ? "yes" : e->uring_error);
  tool_table_row(t, "  --path\t%s (%s)", e->path, e->fs);
  tool_table_row(t, "  O_DIRECT\t%s", e->direct_ok ? "yes" : e->direct_error);
  tool_table_row(t, "mpi");
  tool_table_row(t, "  library\t%s",
                 e->mpi_version[0] ? e->mpi_version : ZT_HAVE_MPI ? "unknown" : "not built in");
  tool_table_row(t, "cuda");
  if (!c->built) {
    tool_table_row(t, "  runtime\tnot built in");
  } else {
    tool_table_row(t, "  runtime\t%s", cuda_ver(c->runtime_version, a, sizeof a)
                                           ? a : "unknown");
    tool_table_row(t, "  driver\t%s", cuda_ver(c->driver_version, a, sizeof a) ? a : "no driver");
    tool_table_row(t, "  devices\t%d%s%s", c->device_count, c->error[0] ? ": " : "", c->error);
    for (int i = 0; i < c->n_devices; i++)
      tool_table_row(t, "  device %d\t%s, sm_%d%d, %s", i, c->devices[i].name,
                     c->devices[i].major, c->devices[i].minor,
                     show_bytes(c->devices[i].bytes, a, sizeof a));
    tool_table_row(t, "  nccl\t%s", nccl_ver(c->nccl_version, a, sizeof a) ? a : "unknown");
  }
  tool_table_print(t, stdout, 0, NULL);

  printf("\nworks here:\n");
  t = tool_table_new("lll");
  works_row(t, "cpu optimizer", &e->cpu_optimizer);
  works_row(t, "nvme tier (O_DIRECT)", &e->nvme_tier);
  works_row(t, "io_uring", &e->io_uring);
  works_row(t, "pinned memory (locked)", &e->pinned);
  works_row(t, "mpi comm", &e->mpi_comm);
  works_row(t, "cuda backend", &e->cuda_backend);
  works_row(t, "nccl comm", &e->nccl_comm);
  tool_table_print(t, stdout, 0, NULL);
  return fflush(stdout) != 0 || ferror(stdout);
}

/* ---- the command ------------------------------------------------------------------ */

#define ABOUT                                                                                 \
  "What this build of ztier is and what this machine offers it: the version\n"               \
  "and build options; the CPU kernels' ISA, cores and NUMA nodes; huge pages\n"               \
  "and RLIMIT_MEMLOCK; io_uring, and O_DIRECT on --path with its filesystem\n"                \
  "(one 4 KiB block written and read in a temporary file, removed at once);\n"                \
  "the MPI library; the CUDA runtime, driver, devices and NCCL. Then, for each\n"             \
  "feature, whether it works here and why not. A machine without a GPU says\n"               \
  "so; it is not an error. --json prints one object (docs/dependencies.md)."

int tool_report_main(int argc, char **argv) {
  int json = 0;
  const char *path = ".";
  const tool_flag_t flags[] = {
      {"path", TOOL_FLAG_STRING, &path, "DIR",
       "where to try O_DIRECT, as swap files would use it (default: .)", 0, 0, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the table", 0, 0, NULL},
  };
  const tool_cmd_t cmd = {"ztier report", "ztier report [--path DIR] [--json]", ABOUT, flags,
                          sizeof flags / sizeof flags[0], 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;

  env_t *e = calloc(1, sizeof *e);
  if (e == NULL) {
    fprintf(stderr, "ztier report: out of memory\n");
    return 1;
  }
  struct stat st;
  const char *bad = stat(path, &st) != 0 ? strerror(errno)
                    : !S_ISDIR(st.st_mode) ? "not a directory"
                                           : NULL;
  if (bad) {
    free(e);
    return tool_args_fail(&cmd, "--path %s: %s; expected a directory to try O_DIRECT in", path,
                          bad);
  }
  if (realpath(path, e->path) == NULL) snprintf(e->path, sizeof e->path, "%s", path);

  probe_build(e);
  probe_cpu(e);
  probe_memory(e);
  probe_uring(e);
  probe_path(e);
  probe_mpi(e);
  probe_cuda(e);
  rc = json ? print_json(e, cmd.prog) : print_text(e);
  free(e);
  return rc;
}

/*
 * config.c — zt_config_t from JSON files, JSON strings and "key" = "text"
 * pairs; its validation; its JSON form; and the key table of docs/config.md.
 *
 * One table, `keys` below, holds every fact about a key: its name (the field
 * name), type, field offset, range, enum names and meaning. The JSON loader,
 * zt_config_set, zt_config_validate, zt_config_to_json and zt__config_doc
 * (which writes the table in docs/config.md) all read it, so they cannot
 * disagree about a key. Rules that involve two keys are in check_combos().
 *
 * Invariants:
 *   - a call that fails leaves the caller's zt_config_t byte-identical: every
 *     change is made on a copy, checked (the whole copy for a load or parse,
 *     the one key for zt_config_set), then copied back;
 *   - what zt_config_to_json writes, zt_config_parse reads back into the
 *     identical struct: doubles with the fewest digits that read back to the
 *     same bits, and integers of 2^53 and above as decimal strings, because
 *     cJSON holds every JSON number as a double; a string field is read back
 *     with the rest of its char array zeroed (bytes past the NUL mean nothing);
 *   - every failure leaves a sentence in zt_last_error(NULL) that names the
 *     key (or argument), the value given and what was expected.
 */
#define _GNU_SOURCE // defines: the GNU strerror_r (returns the message)
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "base/abi.h"      // defines: zt__abi_size, ZT__CONFIG_SIZE_0_1
#include "base/ckjson.h"   // defines: zt__ckjson_parse_text, zt__ckjson_fmt_num
#include "engine/config.h"   // defines: zt__config_doc
#include "engine/engine.h"   // defines: ZT_STAGING_SLOTS (the host tier's staging ring)
#include "base/internal.h" // defines: zt__errf, zt__err_thread, ZT_INTERNAL
#include "offload/swap.h"     // defines: ZT__SWAP_MAX_PATHS, ZT__SWAP_MAX_RINGS
#include "base/units.h"    // defines: zt__parse_bytes

#define KiB ((uint64_t)1 << 10)
#define MiB (KiB << 10)
#define GiB (MiB << 10)
#define TiB (GiB << 10)

/* A config file is a small object; anything bigger is a wrong path. */
#define MAX_FILE_BYTES MiB

/* cJSON keeps numbers as doubles: integers below 2^53 survive exactly, and
 * above it "9007199254740993" would silently become ...992. */
#define EXACT_LIMIT 9007199254740992.0

/* Bytes of pinned memory the host tier's staging ring needs per chunk_bytes:
 * ZT_STAGING_SLOTS slots, each a gradient chunk and a parameter chunk of up
 * to 4 bytes per element (see alloc_host_states in register.c). */
#define RING_CHUNKS (ZT_STAGING_SLOTS * 2)

/* The enum fields are read and written as int. */
_Static_assert(sizeof(zt_backend_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_tier_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_optimizer_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_rounding_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_loss_scaling_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_comm_kind_t) == sizeof(int), "enum size");
_Static_assert(sizeof(zt_log_level_t) == sizeof(int), "enum size");
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "sizes are 64-bit");

/* ---- the key table ---------------------------------------------------------- */

typedef enum ktype {
  T_ENUM, /* JSON string, one of names[]; an int-sized enum field          */
  T_INT,  /* JSON integer (or true/false when `boolean`); an int field     */
  T_NUM,  /* JSON number; a double field, always finite                    */
  T_SIZE, /* JSON integer or "64MiB"; a size_t field                       */
  T_SEED, /* JSON integer or decimal string; a uint64_t field              */
  T_PATHS /* JSON string "a:b" or array ["a", "b"]; a char[cap] field      */
} ktype_t;

typedef struct key {
  const char *name; /* = the field name */
  ktype_t type;
  size_t off;
  const char *doc; /* one line for docs/config.md */
  /* T_ENUM: the names, index = enum value; bit i of `supported` set when
   * this version implements names[i]. */
  const char *const *names;
  int n_names;
  unsigned supported;
  /* T_INT: [lo, hi] have a meaning; values above `sup` are not supported by
   * this version; `boolean`: [0, 1], and JSON false/true and the words
   * "false"/"true" mean 0/1. T_NUM: the bounds, open or closed; hi =
   * INFINITY: none. T_SIZE: [lo, hi], a multiple of `align` (a power of two
   * when pow2), unless at_least_chunk: then 0 (no limit) or >= chunk_bytes. */
  double lo, hi;
  long long sup;
  unsigned char lo_open, hi_open, at_least_chunk, pow2, boolean;
  uint64_t align;
  /* T_PATHS: bytes of the char array, NUL included; most ':'-separated
   * elements, or 0 for a single path (which may hold ':'). An empty string
   * is none. */
  size_t cap;
  unsigned max_paths;
  const char *unsup; /* what is supported, after "not supported by this version" */
  const char *also;  /* a rule involving another key, for docs and messages */
} keydef_t;

static const char *const backend_names[] = {"host", "cuda"};
static const char *const comm_names[] = {"single", "mpi", "nccl", "auto"};
static const char *const optimizer_names[] = {"adamw", "adam"};
static const char *const tier_names[] = {"device", "host", "nvme"};
static const char *const rounding_names[] = {"nearest", "stochastic"};
static const char *const scaling_names[] = {"auto", "none", "static", "dynamic"};
static const char *const level_names[] = {"error", "warn", "info", "debug"};

#define FIELD(f) .name = #f, .off = offsetof(zt_config_t, f)
#define CAP(f) .cap = sizeof(((zt_config_t *)0)->f)
#define NAMES(a) .names = (a), .n_names = (int)(sizeof(a) / sizeof((a)[0]))

static const keydef_t keys[] = {
    {FIELD(backend), .type = T_ENUM, NAMES(backend_names), .supported = 0x3,
     .doc = "where the engine's memory and kernels are: `host` (host memory, C "
            "kernels) or `cuda` (a GPU)"},
    {FIELD(device), .type = T_INT, .lo = 0, .hi = 1023, .sup = 1023,
     .also = "0 with backend \"host\"",
     .doc = "CUDA device ordinal; only meaningful with backend `cuda`"},
    {FIELD(stage), .type = T_INT, .lo = 0, .hi = 3, .sup = 3,
     .doc = "ZeRO stage: 0 replicates everything (one rank), 1 partitions the "
            "optimizer states across ranks, 2 the gradients too, 3 the parameters "
            "too (zt_fetch())"},
    {FIELD(comm), .type = T_ENUM, NAMES(comm_names), .supported = 0xf,
     .also = "`nccl` with backend \"cuda\"",
     .doc = "how ranks talk: `auto` (`mpi` when launched by mpirun, else `single`), "
            "`single` (world size 1), `mpi` (MPI_COMM_WORLD, host buffers) or `nccl` "
            "(NCCL on the GPU; its id from MPI under mpirun, else from nccl_id_file)"},
    {FIELD(nccl_id_file), .type = T_PATHS, CAP(nccl_id_file), .max_paths = 0,
     .also = "only with comm \"nccl\", rank and world_size",
     .doc = "comm `nccl` without MPI: the file in which rank 0 leaves NCCL's unique id "
            "for the other ranks, on a file system they all see. It must not exist at "
            "launch; rank 0 removes it once every rank has joined"},
    {FIELD(rank), .type = T_INT, .lo = -1, .hi = 65535, .sup = 65535,
     .also = "< world_size; set with nccl_id_file and only then",
     .doc = "this process's rank in the file bootstrap of comm `nccl`; -1 = unset"},
    {FIELD(world_size), .type = T_INT, .lo = 0, .hi = 65536, .sup = 65536,
     .also = "set with nccl_id_file and only then",
     .doc = "how many ranks the file bootstrap of comm `nccl` joins; 0 = unset"},
    {FIELD(nccl_id_timeout_s), .type = T_NUM, .lo = 0, .lo_open = 1, .hi = 86400,
     .doc = "seconds a rank other than 0 waits for nccl_id_file to appear"},
    {FIELD(comm_timeout_s), .type = T_NUM, .lo = 0, .lo_open = 1, .hi = 86400,
     .doc = "seconds a rank waits in a collective (comm `mpi`) for the other ranks; "
            "then the call fails with ETIMEDOUT naming the ranks that did not come. "
            "It must exceed the longest time one rank works alone between two "
            "collectives (a checkpoint write, a slow first step)"},
    {FIELD(optimizer), .type = T_ENUM, NAMES(optimizer_names), .supported = 0x3,
     .doc = "`adamw` (torch.optim.AdamW: decay applied to the weight) or `adam` "
            "(torch.optim.Adam: decay added to the gradient)"},
    {FIELD(optimizer_tier), .type = T_ENUM, NAMES(tier_names), .supported = 0x7,
     .also = "\"nvme\" needs swap_path",
     .doc = "where the fp32 master weights and Adam moments live: `device`, `host` "
            "(pinned host memory updated by the CPU, as ZeRO-Offload does) or `nvme` "
            "(swap files in swap_path, streamed through pinned slots by each step, as "
            "ZeRO-Infinity does)"},
    {FIELD(param_tier), .type = T_ENUM, NAMES(tier_names), .supported = 0x7,
     .also = "\"host\" and \"nvme\" need stage 3; \"nvme\" needs swap_path",
     .doc = "where this rank's shard of the parameters lives between uses at stage 3: "
            "`device`, `host` (pinned host memory) or `nvme` (a swap file in "
            "swap_path, read by zt_fetch() and ahead of it, written by each step)"},
    {FIELD(prefetch_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0, .align = 1,
     .doc = "stage 3: bytes of the coming groups' parameter shards read ahead of "
            "zt_fetch() (in flight or landed) at most, in pinned memory; a released "
            "group the recorded order uses again within this many bytes of fetches is "
            "kept gathered. 0: no reading ahead, nothing kept"},
    {FIELD(max_live_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0, .align = 1,
     .doc = "stage 3: gathered parameters that the prefetch scheduler keeps after their "
            "release, at most, counting the fetched groups; the loop's own fetches are "
            "never refused"},
    {FIELD(stage_min_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0,
     .align = 1,
     .doc = "stage 3: the smallest part of a group (this rank's bytes of it) that is "
            "staged ahead of its zt_fetch() on the prefetch stream; a smaller part is "
            "copied inside the fetch, where a hand-over to another thread costs more "
            "than the copy. 0: every group that can be"},
    {FIELD(rounding), .type = T_ENUM, NAMES(rounding_names), .supported = 0x3,
     .doc = "how the fp32 master weights are rounded to bf16 parameters: `nearest` "
            "(ties to even) or `stochastic` (unbiased; from `seed` and the step)"},
    {FIELD(seed), .type = T_SEED,
     .doc = "seed of stochastic rounding: the same seed gives the same bits"},
    {FIELD(threads), .type = T_INT, .lo = 0, .hi = 4096, .sup = 4096,
     .doc = "CPU optimizer threads; 0 = every CPU this process may run on"},
    {FIELD(clip_grad_norm), .type = T_NUM, .lo = 0, .hi = INFINITY,
     .doc = "clip the gradients to this global L2 norm; 0 = no clipping"},
    {FIELD(loss_scaling), .type = T_ENUM, NAMES(scaling_names), .supported = 0xf,
     .doc = "`auto` (dynamic for fp16 parameters, none otherwise), `none`, `static` "
            "(always initial_loss_scale) or `dynamic` (back off on inf/nan, grow "
            "when stable)"},
    {FIELD(initial_loss_scale), .type = T_NUM, .lo = 0, .lo_open = 1, .hi = INFINITY,
     .doc = "the loss scale to start from, or the static scale (DeepSpeed's "
            "2^initial_scale_power)"},
    {FIELD(loss_scale_growth), .type = T_NUM, .lo = 1, .lo_open = 1, .hi = INFINITY,
     .doc = "factor the dynamic scale grows by after loss_scale_window good steps"},
    {FIELD(loss_scale_backoff), .type = T_NUM, .lo = 0, .lo_open = 1, .hi = 1,
     .hi_open = 1,
     .doc = "factor the dynamic scale shrinks by after a step with inf/nan gradients"},
    {FIELD(loss_scale_window), .type = T_INT, .lo = 1, .hi = 1e9, .sup = 1000000000,
     .doc = "good steps in a row before the dynamic scale grows"},
    {FIELD(min_loss_scale), .type = T_NUM, .lo = 0, .lo_open = 1, .hi = INFINITY,
     .also = "<= initial_loss_scale",
     .doc = "the dynamic scale never backs off below this"},
    {FIELD(chunk_bytes), .type = T_SIZE, .lo = 4096, .hi = 4.0 * GiB, .align = 4096,
     .doc = "staging chunk of the host and nvme tiers: gradients go down to the CPU, "
            "parameters come back and (nvme) states are read and written in pieces of "
            "this many bytes per fp32 array"},
    {FIELD(device_budget_bytes), .type = T_SIZE, .at_least_chunk = 1,
     .doc = "most backend memory the engine may allocate for its own states; "
            "0 = no limit"},
    {FIELD(pinned_budget_bytes), .type = T_SIZE, .at_least_chunk = 1,
     .also = "with optimizer_tier \"host\": >= 6 * chunk_bytes (the staging ring)",
     .doc = "most pinned host memory the engine may hold, in 4 KiB pages (host-tier "
            "states and the staging ring; the nvme tier's slots, whose chunk shrinks "
            "to fit; at stages 1-3 with either, the shard's gradient sums, parameters "
            "and buckets); 0 = no limit"},
    {FIELD(numa_node), .type = T_INT, .lo = -1, .hi = 1023, .sup = 1023,
     .doc = "NUMA node of the pinned host memory (with pinned_budget_bytes set): -1 "
            "places it on the node hwloc reports next to the GPU (cuda backend), or "
            "nowhere in particular"},
    {FIELD(log_level), .type = T_ENUM, NAMES(level_names), .supported = 0xf,
     .doc = "messages above this level are not passed to log_fn"},
    {FIELD(bucket_bytes), .type = T_SIZE, .lo = 4096, .hi = 4.0 * GiB, .align = 4096,
     .doc = "bytes of gradients reduced (and parameters gathered) per collective at "
            "stages 1-3; larger buckets mean fewer, larger messages"},
    {FIELD(swap_path), .type = T_PATHS, CAP(swap_path), .max_paths = ZT__SWAP_MAX_PATHS,
     .doc = "directories of the nvme tier's swap space, one file in each, striped; "
            "':'-separated or a JSON array. Whether they exist is checked when the "
            "nvme tier opens them, not here"},
    {FIELD(swap_block_bytes), .type = T_SIZE, .lo = 4096, .hi = 64.0 * MiB,
     .align = 4096, .pow2 = 1,
     .doc = "bytes per swap I/O request (what `ztier bench nvme` prints as "
            "swap_block_bytes)"},
    {FIELD(swap_queue_depth), .type = T_INT, .lo = 1, .hi = 4096, .sup = 4096,
     .doc = "swap requests in flight per ring"},
    {FIELD(swap_rings), .type = T_INT, .lo = 1, .hi = ZT__SWAP_MAX_RINGS,
     .sup = ZT__SWAP_MAX_RINGS,
     .doc = "io_uring rings of the swap engine. 1: reaped and checksummed on the "
            "loop's thread, inside ztier's calls; 2 or more: a thread each, so that "
            "the checksums of reads ahead are checked beside the loop"},
    {FIELD(swap_sqpoll), .type = T_INT, .lo = 0, .hi = 1, .sup = 1, .boolean = 1,
     .doc = "1: kernel-side submission threads (IORING_SETUP_SQPOLL); when the kernel "
            "refuses them, plain submission, and the stats say so"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

/* Fields that only code can set, with why. */
static const struct {
  const char *name, *why;
} code_only[] = {
    {"size", "ZT_CONFIG_INIT sets it to sizeof(zt_config_t)"},
    {"version", "ZT_CONFIG_INIT sets it to ZT_CONFIG_VERSION"},
    {"log_fn", "it is a function pointer that only code can set (cfg.log_fn = fn)"},
    {"log_user", "it is a pointer passed to log_fn that only code can set"},
};

/* Names from a DeepSpeed config, and what ztier calls the same thing; a key
 * ending in '*' stands for a family of keys. */
static const struct {
  const char *name, *key, *note;
} aliases[] = {
    {"gradient_clipping", "clip_grad_norm", ""},
    {"offload_optimizer", "optimizer_tier", " (\"host\" is ZeRO-Offload)"},
    {"offload_param", "param_tier", ""},
    {"initial_scale_power", "initial_loss_scale", " (the scale itself: 2^power)"},
    {"loss_scale", "loss_scaling",
     " (\"static\" with initial_loss_scale, or \"dynamic\")"},
    {"zero_optimization", "stage", " (the ZeRO settings are top-level keys here)"},
    {"zero_stage", "stage", ""},
    {"fp16", "loss_scaling", " (the parameter dtype is given to zt_register_flat())"},
    {"bf16", "rounding", " (the parameter dtype is given to zt_register_flat())"},
    {"num_threads", "threads", ""},
    {"chunk_size", "chunk_bytes", ""},
    {"reduce_bucket_size", "bucket_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"allgather_bucket_size", "bucket_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"aio", "swap_*",
     " (block_size is swap_block_bytes, queue_depth is swap_queue_depth, "
     "thread_count is swap_rings)"},
    {"block_size", "swap_block_bytes", " (DeepSpeed's aio.block_size)"},
    {"queue_depth", "swap_queue_depth", " (DeepSpeed's aio.queue_depth)"},
    {"thread_count", "swap_rings", " (DeepSpeed's aio.thread_count)"},
    {"nvme_path", "swap_path", " (one or more directories here)"},
    {"stage3_prefetch_bucket_size", "prefetch_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"stage3_max_live_parameters", "max_live_bytes",
     " (DeepSpeed counts elements, ztier counts bytes)"},
    {"stage3_max_reuse_distance", "prefetch_bytes",
     " (a released group used again within prefetch_bytes of fetches is kept)"},
};

/* ---- field access ------------------------------------------------------------ */

static int get_int(const zt_config_t *c, const keydef_t *k) {
  int v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static void put_int(zt_config_t *c, const keydef_t *k, int v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}
static double get_num(const zt_config_t *c, const keydef_t *k) {
  double v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static void put_num(zt_config_t *c, const keydef_t *k, double v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}
/* T_SIZE (size_t) and T_SEED (uint64_t) are both 64-bit unsigned. */
static uint64_t get_u64(const zt_config_t *c, const keydef_t *k) {
  uint64_t v;
  memcpy(&v, (const char *)c + k->off, sizeof v);
  return v;
}
static void put_u64(zt_config_t *c, const keydef_t *k, uint64_t v) {
  memcpy((char *)c + k->off, &v, sizeof v);
}

/* T_PATHS: the char array, which holds a NUL when valid. */
static const char *get_str(const zt_config_t *c, const keydef_t *k) {
  return (const char *)c + k->off;
}
/* s fits (strlen(s) < k->cap); the rest of the array is zeroed, so equal
 * strings give equal bytes. */
static void put_str(zt_config_t *c, const keydef_t *k, const char *s) {
  char *dst = (char *)c + k->off;
  memset(dst, 0, k->cap);
  memcpy(dst, s, strlen(s));
}

static const keydef_t *find_key(const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].name, name) == 0) return &keys[i];
  return NULL;
}

/* ---- text forms -------------------------------------------------------------- */

/* The locale's decimal point, when it is one character other than '.'. */
static char locale_point(void) {
  const char *dp = localeconv()->decimal_point;
  return (dp && dp[0] && dp[0] != '.' && dp[1] == '\0') ? dp[0] : '.';
}

/* "16MiB" for an exact power-of-1024 multiple, else "". */
static void fmt_human(uint64_t v, char *b, size_t n) {
  static const struct {
    uint64_t unit;
    const char *name;
  } u[] = {{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}};
  b[0] = '\0';
  if (v == 0) return;
  for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
    if (v % u[i].unit == 0) {
      snprintf(b, n, "%llu%s", (unsigned long long)(v / u[i].unit), u[i].name);
      return;
    }
}

/* A bound of a size key: "64MiB" where it is a whole number of them, else
 * in digits; the top of the range (2^64 - 1, as a double) by name. */
static void fmt_bound(double v, char *b, size_t n) {
  if (v >= 18446744073709551615.0) {
    snprintf(b, n, "2^64 - 1");
    return;
  }
  fmt_human((uint64_t)v, b, n);
  if (b[0] == '\0') snprintf(b, n, "%llu", (unsigned long long)v);
}

/* A string as a quoted, escaped, shortened literal for a message. */
static void quote(const char *s, char *b, size_t n) {
  size_t o = 0;
  const size_t max_chars = 40;
  if (n < 8) {
    if (n) b[0] = '\0';
    return;
  }
  b[o++] = '"';
  size_t i = 0;
  for (; s[i] && i < max_chars && o + 6 < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      b[o++] = '\\';
      b[o++] = (char)ch;
    } else if (ch < 0x20 || ch == 0x7f) {
      o += (size_t)snprintf(b + o, n - o, "\\x%02x", ch);
    } else {
      b[o++] = (char)ch;
    }
  }
  if (s[i] && o + 5 < n) {
    memcpy(b + o, "...", 3);
    o += 3;
  }
  b[o++] = '"';
  b[o] = '\0';
}

/* A key name for a message, inside '...': like quote() without the quotes. */
static void key_text(const char *s, char *b, size_t n) {
  char q[128];
  quote(s ? s : "", q, sizeof q);
  size_t len = strlen(q);
  snprintf(b, n, "%.*s", (int)(len - 2), q + 1);
}

/* What a key accepts, as the end of "expected ...". */
static void range_text(const keydef_t *k, char *b, size_t n) {
  size_t o = 0;
  b[0] = '\0';
#define PUT(...) (o += (size_t)snprintf(b + o, o < n ? n - o : 0, __VA_ARGS__))
  switch (k->type) {
  case T_ENUM: {
    int count = 0, seen = 0;
    for (int i = 0; i < k->n_names; i++) count += (k->supported >> i) & 1;
    PUT("%s", count == 1 ? "" : "one of ");
    for (int i = 0; i < k->n_names; i++) {
      if (!((k->supported >> i) & 1)) continue;
      PUT("%s\"%s\"", seen++ ? ", " : "", k->names[i]);
    }
    break;
  }
  case T_INT:
    if (k->boolean)
      PUT("0 or 1, or false / true");
    else
      PUT("an integer in %lld..%lld", (long long)k->lo, k->sup);
    break;
  case T_NUM: {
    char lo[32], hi[32];
    zt__ckjson_fmt_num(k->lo, lo, sizeof lo);
    zt__ckjson_fmt_num(k->hi, hi, sizeof hi);
    if (isinf(k->hi))
      PUT("a finite number %s %s", k->lo_open ? ">" : ">=", lo);
    else
      PUT("a number in %s%s, %s%s", k->lo_open ? "(" : "[", lo, hi,
          k->hi_open ? ")" : "]");
    break;
  }
  case T_SIZE:
    if (k->at_least_chunk) {
      PUT("0 (no limit) or a byte count >= chunk_bytes");
    } else {
      char lo[32], hi[32], al[32];
      fmt_bound(k->lo, lo, sizeof lo);
      fmt_bound(k->hi, hi, sizeof hi);
      fmt_bound((double)k->align, al, sizeof al);
      if (k->pow2)
        PUT("a power of two in [%s, %s]", lo, hi);
      else if (k->align <= 1)
        PUT("a byte count in [%s, %s]", lo, hi);
      else
        PUT("a byte count in [%s, %s], a multiple of %s", lo, hi, al);
    }
    break;
  case T_SEED:
    PUT("an integer in 0..%llu", (unsigned long long)UINT64_MAX);
    break;
  case T_PATHS:
    if (k->max_paths == 0) {
      PUT("\"\" (none), or one path of at most %zu bytes", k->cap - 1);
      break;
    }
    PUT("\"\" (none), or directories separated by ':' (or a JSON array of them): at "
        "most %u directories and %zu bytes",
        k->max_paths, k->cap - 1);
    break;
  }
  if (k->also) PUT(", %s", k->also);
#undef PUT
}

/* The field's value for a message: "\"host\"", "2.5", "16777216 (16MiB)". */
static void value_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n) {
  switch (k->type) {
  case T_ENUM: {
    int v = get_int(c, k);
    if (v >= 0 && v < k->n_names)
      snprintf(b, n, "\"%s\"", k->names[v]);
    else
      snprintf(b, n, "%d", v);
    break;
  }
  case T_INT:
    snprintf(b, n, "%d", get_int(c, k));
    break;
  case T_NUM:
    zt__ckjson_fmt_num(get_num(c, k), b, n);
    break;
  case T_SIZE: {
    char h[32];
    uint64_t v = get_u64(c, k);
    fmt_human(v, h, sizeof h);
    if (h[0])
      snprintf(b, n, "%llu (%s)", (unsigned long long)v, h);
    else
      snprintf(b, n, "%llu", (unsigned long long)v);
    break;
  }
  case T_SEED:
    snprintf(b, n, "%llu", (unsigned long long)get_u64(c, k));
    break;
  case T_PATHS: {
    /* A field filled in code may lack its NUL; show what fits. */
    char s[64];
    size_t len = strnlen(get_str(c, k), k->cap);
    if (len >= sizeof s) len = sizeof s - 1;
    memcpy(s, get_str(c, k), len);
    s[len] = '\0';
    quote(s, b, n);
    break;
  }
  }
}

/* Appends to a buffer the way snprintf counts: `need` grows past `len`. */
typedef struct out {
  char *buf;
  size_t len, need;
} out_t;

__attribute__((format(printf, 2, 3)))
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = o->need < o->len ? o->buf + o->need : NULL;
  size_t room = o->need < o->len ? o->len - o->need : 0;
  int n = vsnprintf(dst, room, fmt, ap);
  va_end(ap);
  if (n > 0) o->need += (size_t)n;
}

/* The field's value as JSON: what zt_config_to_json writes. A value that is
 * not valid (an out-of-range enum, a non-finite double, a char array with no
 * NUL) is still written as valid JSON, which the parser then refuses with a
 * sentence. */
static void json_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n);

static void put_value(out_t *o, const zt_config_t *c, const keydef_t *k) {
  if (k->type != T_PATHS) {
    char v[64];
    json_text(c, k, v, sizeof v);
    put(o, "%s", v);
    return;
  }
  /* Bytes are written as they are (a path is bytes, not necessarily UTF-8;
   * cJSON gives them back unchanged); only what JSON forbids is escaped. */
  const char *s = get_str(c, k);
  size_t len = strnlen(s, k->cap);
  put(o, "\"");
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      put(o, "\\%c", ch);
    else if (ch < 0x20)
      put(o, "\\u%04x", ch);
    else
      put(o, "%c", ch);
  }
  put(o, "\"");
}

static void json_text(const zt_config_t *c, const keydef_t *k, char *b, size_t n) {
  switch (k->type) {
  case T_PATHS: {
    out_t o = {b, n, 0};
    if (n) b[0] = '\0';
    put_value(&o, c, k);
    break;
  }
  case T_ENUM:
  case T_INT:
    value_text(c, k, b, n);
    break;
  case T_NUM: {
    double v = get_num(c, k);
    if (isfinite(v))
      zt__ckjson_fmt_num(v, b, n);
    else
      snprintf(b, n, "null");
    break;
  }
  case T_SIZE:
  case T_SEED: {
    uint64_t v = get_u64(c, k);
    snprintf(b, n, (double)v < EXACT_LIMIT ? "%llu" : "\"%llu\"", (unsigned long long)v);
    break;
  }
  }
}

/* ---- errors -------------------------------------------------------------------- */

/* Where a failure happened: the public function, the file (load only) and
 * the JSON text (to find the line a key is on). */
typedef struct ctx {
  const char *fn;
  const char *path;
  const char *text;
} ctx_t;

/* "fn: path:line: message", with the parts that are known. */
static int vfail(const ctx_t *c, int line, int code, const char *fmt, va_list ap) {
  char msg[ZT_ERRMSG_LEN];
  vsnprintf(msg, sizeof msg, fmt, ap);
  zt__err_t *e = zt__err_thread();
  if (c->path && line > 0)
    return zt__errf(e, code, "%s: %s:%d: %s", c->fn, c->path, line, msg);
  if (c->path) return zt__errf(e, code, "%s: %s: %s", c->fn, c->path, msg);
  if (line > 0) return zt__errf(e, code, "%s: line %d: %s", c->fn, line, msg);
  return zt__errf(e, code, "%s: %s", c->fn, msg);
}

__attribute__((format(printf, 4, 5)))
static int fail_at(const ctx_t *c, int line, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(c, line, code, fmt, ap);
  va_end(ap);
  return rc;
}

#define fail(c, code, ...) fail_at((c), 0, (code), __VA_ARGS__)

/* The line of the nth `"name":` in the JSON text, or 0 when it is not there
 * verbatim (a name written with escapes). Only a hint for the reader. */
static int key_line(const ctx_t *c, const char *name, int nth) {
  if (c->text == NULL || name == NULL) return 0;
  size_t len = strlen(name);
  int line = 1;
  for (const char *p = c->text; *p; p++) {
    if (*p == '\n') line++;
    if (*p != '"' || strncmp(p + 1, name, len) != 0 || p[1 + len] != '"') continue;
    const char *q = p + 2 + len;
    while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
    if (*q == ':' && --nth == 0) return line;
  }
  return 0;
}

/* A failure about key `k` (and `k2`, for a rule on two keys), placed at the
 * line of the first of them that the JSON text gives. */
__attribute__((format(printf, 5, 6)))
static int kfail(const ctx_t *c, const keydef_t *k, const keydef_t *k2, int code,
                 const char *fmt, ...) {
  int line = key_line(c, k->name, 1);
  if (line == 0 && k2) line = key_line(c, k2->name, 1);
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(c, line, code, fmt, ap);
  va_end(ap);
  return rc;
}

/* "key 'threads' is 2.5; expected an integer in 0..4096". */
static int bad_value(const ctx_t *c, const keydef_t *k, const char *given,
                     const char *expected) {
  char r[256];
  if (expected == NULL) {
    range_text(k, r, sizeof r);
    expected = r;
  }
  return kfail(c, k, NULL, ZT_ECONFIG, "key '%s' is %s; expected %s", k->name, given,
               expected);
}

static const char size_syntax[] =
    "a byte count: an integer, or a string such as \"64MiB\" (K, M, G, T, Ki .. Ti and "
    "KiB .. TiB count powers of 1024; KB, MB, GB, TB powers of 1000; B is bytes)";
static const char seed_syntax[] =
    "an integer in 0..18446744073709551615: a JSON integer below 2^53, or a "
    "decimal string";

/* ---- suggestions for unknown keys ------------------------------------------ */

/* Optimal string alignment distance (edits and swaps of neighbours), case
 * folded; names longer than 63 bytes are far from every key. */
static int distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 1000;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
      int best = d[i - 1][j - 1] + (ca != cb);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

static int unknown_key(const ctx_t *c, const char *name, int line) {
  char shown[128];
  key_text(name, shown, sizeof shown);
  for (size_t i = 0; i < sizeof code_only / sizeof code_only[0]; i++)
    if (strcmp(name, code_only[i].name) == 0)
      return fail_at(c, line, ZT_ECONFIG,
                     "key '%s' cannot be set from JSON or text: %s", shown,
                     code_only[i].why);
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    if (strcasecmp(name, aliases[i].name) != 0) continue;
    const char *key = aliases[i].key;
    if (key[strlen(key) - 1] == '*')
      return fail_at(c, line, ZT_ECONFIG, "unknown key '%s'; did you mean the %s keys%s?",
                     shown, key, aliases[i].note);
    return fail_at(c, line, ZT_ECONFIG, "unknown key '%s'; did you mean '%s'%s?", shown,
                   key, aliases[i].note);
  }
  const keydef_t *best = NULL;
  int best_d = 1000;
  for (size_t i = 0; i < N_KEYS; i++) {
    int d = distance(name, keys[i].name);
    if (d < best_d) best_d = d, best = &keys[i];
  }
  /* Close means a typo or two, and not most of a short word rewritten. A
   * name too long to compare has no best. */
  int len = best ? (int)strlen(best->name) : 0;
  int limit = len >= 10 ? 3 : 2;
  if (best_d <= limit && 2 * best_d < len)
    return fail_at(c, line, ZT_ECONFIG, "unknown key '%s'; did you mean '%s'?", shown,
                   best->name);
  return fail_at(c, line, ZT_ECONFIG,
                 "unknown key '%s'; docs/config.md lists the keys (backend, stage, "
                 "optimizer_tier, threads, ...)",
                 shown);
}

/* ---- values from text ------------------------------------------------------- */

/* Digits only, <= UINT64_MAX. */
static int parse_u64(const char *s, uint64_t *out) {
  if (!isdigit((unsigned char)*s)) return -1;
  uint64_t v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (*s) return -1;
  *out = v;
  return 0;
}

/* "4096", "64MiB", "64 MiB", "16M", "1.5GiB", "1GB": units.c's reading, the
 * one the tool, the benchmarks and the example share. */
static int parse_size(const char *s, uint64_t *out) { return zt__parse_bytes(s, out); }

/* The enum value named `s`, stored into w. */
static int set_enum(const ctx_t *c, const keydef_t *k, const char *s, const char *given,
                    zt_config_t *w) {
  for (int i = 0; i < k->n_names; i++)
    if (strcmp(s, k->names[i]) == 0) {
      put_int(w, k, i);
      return 0;
    }
  char r[256];
  range_text(k, r, sizeof r);
  for (int i = 0; i < k->n_names; i++)
    if (strcasecmp(s, k->names[i]) == 0)
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s' is %s; expected %s (lowercase: did you mean \"%s\"?)",
                   k->name, given, r, k->names[i]);
  return bad_value(c, k, given, r);
}

/* A JSON value in a few words, for a message. */
static void json_given(const cJSON *v, char *b, size_t n) {
  if (cJSON_IsNumber(v))
    zt__ckjson_fmt_num(v->valuedouble, b, n);
  else if (cJSON_IsString(v))
    quote(v->valuestring ? v->valuestring : "", b, n);
  else if (cJSON_IsBool(v))
    snprintf(b, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNull(v))
    snprintf(b, n, "null");
  else if (cJSON_IsArray(v))
    snprintf(b, n, "an array");
  else if (cJSON_IsObject(v))
    snprintf(b, n, "an object");
  else
    snprintf(b, n, "an invalid value");
}

static int integral(double d) { return isfinite(d) && d == floor(d); }

/* A T_PATHS string into the working copy. Only what the field can hold is
 * checked here; the directories themselves are check()'s. */
static int set_paths(const ctx_t *c, const keydef_t *k, const char *s, const char *given,
                     zt_config_t *w) {
  size_t len = strlen(s);
  if (len >= k->cap)
    return kfail(c, k, NULL, ZT_ECONFIG,
                 "key '%s' is %s, %zu bytes long; expected at most %zu bytes (the field "
                 "is char[%zu], its NUL included)",
                 k->name, given, len, k->cap - 1, k->cap);
  put_str(w, k, s);
  return 0;
}

/* A JSON array of directories, joined with ':' into the working copy. An
 * element is one directory, so it may hold no ':' and may not be empty. */
static int set_paths_array(const ctx_t *c, const keydef_t *k, const cJSON *v,
                           zt_config_t *w) {
  size_t total = 0;
  int n = 0;
  for (const cJSON *e = v->child; e; e = e->next) {
    char given[96];
    json_given(e, given, sizeof given);
    n++;
    if (!cJSON_IsString(e) || e->valuestring == NULL)
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s': element %d of its array is %s; expected an array of "
                   "strings, each one directory",
                   k->name, n, given);
    if (e->valuestring[0] == '\0')
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s': element %d of its array is \"\"; expected a directory "
                   "(leave the element out, or give [] for no swap space)",
                   k->name, n);
    if (strchr(e->valuestring, ':'))
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s': element %d of its array is %s, which holds ':', the "
                   "separator of directories; expected one directory per element",
                   k->name, n, given);
    total += strlen(e->valuestring) + (n > 1);
  }
  if (total >= k->cap)
    return kfail(c, k, NULL, ZT_ECONFIG,
                 "key '%s' is an array of %d directories, %zu bytes when joined with "
                 "':'; expected at most %zu bytes (the field is char[%zu], its NUL "
                 "included)",
                 k->name, n, total, k->cap - 1, k->cap);
  char *dst = (char *)w + k->off;
  size_t o = 0;
  memset(dst, 0, k->cap);
  for (const cJSON *e = v->child; e; e = e->next) {
    size_t len = strlen(e->valuestring);
    if (o) dst[o++] = ':';
    memcpy(dst + o, e->valuestring, len);
    o += len;
  }
  return 0;
}

/* One JSON member into the working copy. Ranges are checked afterwards, on
 * the whole copy, by check(): here only what the field can hold. */
static int from_json(const ctx_t *c, const keydef_t *k, const cJSON *v, zt_config_t *w) {
  char given[96];
  json_given(v, given, sizeof given);
  switch (k->type) {
  case T_ENUM:
    if (cJSON_IsString(v) && v->valuestring)
      return set_enum(c, k, v->valuestring, given, w);
    return bad_value(c, k, given, NULL);
  case T_INT:
    if (k->boolean && cJSON_IsBool(v)) {
      put_int(w, k, cJSON_IsTrue(v) ? 1 : 0);
      return 0;
    }
    if (cJSON_IsNumber(v) && integral(v->valuedouble) && v->valuedouble >= INT_MIN &&
        v->valuedouble <= INT_MAX) {
      put_int(w, k, (int)v->valuedouble);
      return 0;
    }
    return bad_value(c, k, given, NULL);
  case T_NUM:
    if (cJSON_IsNumber(v)) {
      put_num(w, k, v->valuedouble);
      return 0;
    }
    return bad_value(c, k, given, NULL);
  case T_SIZE:
  case T_SEED: {
    const char *syntax = k->type == T_SIZE ? size_syntax : seed_syntax;
    uint64_t u;
    if (cJSON_IsNumber(v)) {
      double d = v->valuedouble;
      if (integral(d) && d >= 0 && d < EXACT_LIMIT) {
        put_u64(w, k, (uint64_t)d);
        return 0;
      }
      if (integral(d) && d >= EXACT_LIMIT && d < 18446744073709551616.0)
        return kfail(c, k, NULL, ZT_ECONFIG,
                     "key '%s' is %s, a JSON number of 2^53 or more, which cannot be "
                     "read exactly; expected it as a decimal string, e.g. \"%llu\"",
                     k->name, given, (unsigned long long)d);
      return bad_value(c, k, given, syntax);
    }
    if (cJSON_IsString(v) && v->valuestring) {
      int rc = k->type == T_SIZE ? parse_size(v->valuestring, &u)
                                 : parse_u64(v->valuestring, &u);
      if (rc == 0) {
        put_u64(w, k, u);
        return 0;
      }
    }
    return bad_value(c, k, given, syntax);
  }
  case T_PATHS:
    if (cJSON_IsString(v) && v->valuestring)
      return set_paths(c, k, v->valuestring, given, w);
    /* max_paths 0: one path, which may hold ':'; no array form. */
    if (cJSON_IsArray(v) && k->max_paths) return set_paths_array(c, k, v, w);
    return bad_value(c, k, given, NULL);
  }
  return bad_value(c, k, given, NULL);
}

/* One text value (zt_config_set) into the working copy. */
static int from_text(const ctx_t *c, const keydef_t *k, const char *s, zt_config_t *w) {
  char given[96];
  quote(s, given, sizeof given);
  switch (k->type) {
  case T_ENUM:
    return set_enum(c, k, s, given, w);
  case T_INT: {
    if (k->boolean && (!strcmp(s, "false") || !strcmp(s, "true"))) {
      put_int(w, k, s[0] == 't');
      return 0;
    }
    /* strtol would skip leading spaces and take "12abc"; a value is the
     * whole string. */
    const char *p = s + (*s == '-' || *s == '+');
    if (!isdigit((unsigned char)*p)) return bad_value(c, k, given, NULL);
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || v < INT_MIN || v > INT_MAX)
      return bad_value(c, k, given, NULL);
    put_int(w, k, (int)v);
    return 0;
  }
  case T_NUM: {
    /* strtod reads the locale's decimal point; the text uses '.'. */
    char buf[128];
    size_t len = strlen(s);
    if (len == 0 || len >= sizeof buf || isspace((unsigned char)s[0]))
      return bad_value(c, k, given, NULL);
    memcpy(buf, s, len + 1);
    char p = locale_point();
    if (p != '.') {
      if (strchr(buf, p)) return bad_value(c, k, given, NULL);
      for (char *q = buf; *q; q++)
        if (*q == '.') *q = p;
    }
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf) return bad_value(c, k, given, NULL);
    put_num(w, k, v); /* check() refuses inf and nan with the range */
    return 0;
  }
  case T_SIZE:
  case T_SEED: {
    uint64_t u;
    int rc = k->type == T_SIZE ? parse_size(s, &u) : parse_u64(s, &u);
    if (rc != 0)
      return bad_value(c, k, given, k->type == T_SIZE ? size_syntax : seed_syntax);
    put_u64(w, k, u);
    return 0;
  }
  case T_PATHS:
    return set_paths(c, k, s, given, w);
  }
  return bad_value(c, k, given, NULL);
}

/* ---- validation --------------------------------------------------------------- */

/* The defaults of this library, for the fields an older caller's struct
 * lacks and for zt_config_init_size. */
static const zt_config_t defaults = ZT_CONFIG_INIT;

/* The caller's config as a whole one of this library: its first *have bytes
 * (the size rule of abi.h) over the defaults, size set to this library's.
 * With c NULL it writes no sentence (engine create's question whether the
 * config can be read at all). */
static int import(const ctx_t *c, const zt_config_t *cfg, zt_config_t *full, size_t *have) {
  ZT_TRY(zt__abi_size(c ? zt__err_thread() : NULL, c ? c->fn : "", "cfg", "zt_config_t",
                      cfg, cfg->size, ZT__CONFIG_SIZE_0_1, sizeof(zt_config_t),
                      "ZT_CONFIG_INIT or zt_config_init()", have));
  if (cfg->version != ZT_CONFIG_VERSION) {
    if (c == NULL) return -EINVAL;
    return fail(c, -EINVAL,
                "cfg->version is %u; expected ZT_CONFIG_VERSION = %u (fill the config "
                "with ZT_CONFIG_INIT or zt_config_init())",
                cfg->version, ZT_CONFIG_VERSION);
  }
  memcpy(full, &defaults, sizeof *full);
  memcpy(full, cfg, *have);
  full->size = sizeof *full;
  return 0;
}

/* Writes a changed config back: only the caller's first `have` bytes, and
 * never its size. */
static void export(zt_config_t *cfg, const zt_config_t *full, size_t have) {
  size_t skip = offsetof(zt_config_t, version);
  memcpy((char *)cfg + skip, (const char *)full + skip, have - skip);
}

/* Whether key k's field is inside the caller's first `have` bytes: a
 * program built against an older ztier.h has no room for a later key. */
static size_t key_end(const keydef_t *k) {
  switch (k->type) {
  case T_ENUM:
  case T_INT:
    return k->off + sizeof(int);
  case T_NUM:
    return k->off + sizeof(double);
  case T_SIZE:
  case T_SEED:
    return k->off + sizeof(uint64_t);
  case T_PATHS:
    return k->off + k->cap;
  }
  return k->off;
}

static int key_missing(const ctx_t *c, const keydef_t *k, size_t have) {
  return kfail(c, k, NULL, ZT_ECONFIG,
               "key '%s' is not in this config: cfg->size is %zu, which ends before the "
               "field (the program was built against an older ztier.h, without it); "
               "expected a key of that version, or a program built against this one",
               k->name, have);
}

int zt__config_import(const zt_config_t *cfg, zt_config_t *full) {
  size_t have;
  return cfg ? import(NULL, cfg, full, &have) : -EINVAL;
}

/* A T_PATHS field: NUL-terminated in its array, and either "" or 1 ..
 * max_paths non-empty directories between single ':'. Whether they exist is
 * for the nvme tier to find when it opens them. */
static int check_paths(const ctx_t *c, const zt_config_t *cfg, const keydef_t *k,
                       const char *given) {
  const char *s = get_str(cfg, k);
  if (memchr(s, '\0', k->cap) == NULL)
    return kfail(c, k, NULL, ZT_ECONFIG,
                 "key '%s' is %s with no NUL in its %zu bytes; expected a string of at "
                 "most %zu bytes",
                 k->name, given, k->cap, k->cap - 1);
  if (s[0] == '\0' || k->max_paths == 0) return 0;
  unsigned n = 0;
  for (const char *p = s;; p++) {
    const char *e = strchr(p, ':');
    n++;
    if (e == p || *p == '\0') {
      const char *where = n == 1 ? "a ':' at the start" : *p ? "two ':' in a row"
                                                             : "a ':' at the end";
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s' is %s: directory %u is empty (%s); expected directories "
                   "separated by single ':', none empty, or \"\" for no swap space",
                   k->name, given, n, where);
    }
    if (e == NULL) break;
    p = e;
  }
  if (n > k->max_paths)
    return kfail(c, k, NULL, ZT_ECONFIG,
                 "key '%s' is %s, %u directories; expected at most %u (the swap space "
                 "stripes over at most %u)",
                 k->name, given, n, k->max_paths, k->max_paths);
  return 0;
}

static int check_key(const ctx_t *c, const zt_config_t *cfg, const keydef_t *k) {
  char given[96];
  value_text(cfg, k, given, sizeof given);
  switch (k->type) {
  case T_ENUM: {
    int v = get_int(cfg, k);
    if (v < 0 || v >= k->n_names) {
      char r[256];
      range_text(k, r, sizeof r);
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s' is %d, which is not a value of its enum; expected %s",
                   k->name, v, r);
    }
    if (!((k->supported >> v) & 1))
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s' is \"%s\", which is not supported by this version (%s)",
                   k->name, k->names[v], k->unsup);
    return 0;
  }
  case T_INT: {
    int v = get_int(cfg, k);
    if (v >= k->lo && v <= k->sup) return 0;
    if (v > k->sup && v <= k->hi)
      return kfail(c, k, NULL, ZT_ECONFIG,
                   "key '%s' is %d: %s %d is not supported by this version (%s)", k->name,
                   v, k->name, v, k->unsup);
    return bad_value(c, k, given, NULL);
  }
  case T_NUM: {
    double v = get_num(cfg, k);
    int ok = isfinite(v) && (k->lo_open ? v > k->lo : v >= k->lo) &&
             (k->hi_open ? v < k->hi : v <= k->hi);
    return ok ? 0 : bad_value(c, k, given, NULL);
  }
  case T_SIZE: {
    uint64_t v = get_u64(cfg, k);
    /* A budget holds any count alone; how it compares with chunk_bytes is
     * a rule between keys, in check_combos. */
    if (k->at_least_chunk) return 0;
    if (v >= k->lo && v <= k->hi && v % k->align == 0 && (!k->pow2 || !(v & (v - 1))))
      return 0;
    return bad_value(c, k, given, NULL);
  }
  case T_SEED:
    return 0;
  case T_PATHS:
    return check_paths(c, cfg, k, given);
  }
  return 0;
}

/* The file bootstrap of comm "nccl": nccl_id_file, rank and world_size
 * come together or not at all, so a rank never guesses its place. */
static int check_nccl_boot(const ctx_t *c, const zt_config_t *cfg) {
  const keydef_t *file = find_key("nccl_id_file"), *rank = find_key("rank"),
                 *world = find_key("world_size");
  int has_file = cfg->nccl_id_file[0] != '\0';
  if (has_file && cfg->comm != ZT_COMM_NCCL)
    return kfail(c, file, find_key("comm"), ZT_ECONFIG,
                 "key 'nccl_id_file' is set but comm is \"%s\": the id file is only "
                 "read by comm \"nccl\"; set comm \"nccl\" or remove nccl_id_file",
                 comm_names[cfg->comm]);
  if (!has_file && (cfg->rank != -1 || cfg->world_size != 0))
    return kfail(c, cfg->rank != -1 ? rank : world, file, ZT_ECONFIG,
                 "key '%s' is %d but nccl_id_file is \"\": rank and world_size are "
                 "only used by the file bootstrap of comm \"nccl\" (under mpirun they "
                 "come from MPI); set nccl_id_file too, or remove them",
                 cfg->rank != -1 ? "rank" : "world_size",
                 cfg->rank != -1 ? cfg->rank : cfg->world_size);
  if (has_file && (cfg->rank < 0 || cfg->world_size < 1))
    return kfail(c, cfg->world_size < 1 ? world : rank, file, ZT_ECONFIG,
                 "key '%s' is %d but nccl_id_file is set: the file bootstrap needs this "
                 "process's rank (>= 0) and world_size (>= 1)",
                 cfg->world_size < 1 ? "world_size" : "rank",
                 cfg->world_size < 1 ? cfg->world_size : cfg->rank);
  if (has_file && cfg->rank >= cfg->world_size)
    return kfail(c, rank, world, ZT_ECONFIG,
                 "key 'rank' is %d but world_size is %d; expected a rank in [0, %d)",
                 cfg->rank, cfg->world_size, cfg->world_size);
  return 0;
}

/* Rules on two keys. Each names both, and what would fix it. They are
 * checked on a whole config only (validate, engine create, the end of a load
 * or parse), never by zt_config_set: a rule between two keys cannot hold
 * while a caller sets them one at a time, whichever goes first. */
static int check_combos(const ctx_t *c, const zt_config_t *cfg) {
  const keydef_t *backend = find_key("backend"), *device = find_key("device");
  if (cfg->backend == ZT_BACKEND_HOST && cfg->device != 0)
    return kfail(c, device, backend, ZT_ECONFIG,
                 "key 'device' is %d but backend is \"host\": device is only meaningful "
                 "for backend \"cuda\"; remove device or set it to 0",
                 cfg->device);

  /* NCCL moves device memory; with backend "host" there is none. */
  if (cfg->comm == ZT_COMM_NCCL && cfg->backend != ZT_BACKEND_CUDA)
    return kfail(c, find_key("comm"), backend, ZT_ECONFIG,
                 "key 'comm' is \"nccl\" but backend is \"%s\": NCCL needs backend "
                 "\"cuda\"; set backend \"cuda\", or comm \"mpi\" for host buffers",
                 backend_names[cfg->backend]);
  ZT_TRY(check_nccl_boot(c, cfg));

  /* The nvme tier's files go in swap_path; without one the first
   * registration would fail long after the config was written. */
  if (cfg->optimizer_tier == ZT_TIER_NVME && cfg->swap_path[strspn(cfg->swap_path, ":")] == 0)
    return kfail(c, find_key("optimizer_tier"), find_key("swap_path"), ZT_ECONFIG,
                 "key 'optimizer_tier' is \"nvme\" but swap_path is empty; expected "
                 "swap_path to name one or more directories for the swap files "
                 "(':'-separated), e.g. \"/nvme0/ztier\"");

  /* Parameters are partitioned, and so can live elsewhere, at stage 3. */
  if (cfg->param_tier != ZT_TIER_DEVICE && cfg->stage != 3)
    return kfail(c, find_key("param_tier"), find_key("stage"), ZT_ECONFIG,
                 "key 'param_tier' is \"%s\" but stage is %d; expected stage 3 (the "
                 "parameters are partitioned, and offloaded, at stage 3 only) or "
                 "param_tier \"device\"",
                 tier_names[cfg->param_tier], cfg->stage);
  if (cfg->param_tier == ZT_TIER_NVME && cfg->swap_path[strspn(cfg->swap_path, ":")] == 0)
    return kfail(c, find_key("param_tier"), find_key("swap_path"), ZT_ECONFIG,
                 "key 'param_tier' is \"nvme\" but swap_path is empty; expected "
                 "swap_path to name one or more directories for the swap files "
                 "(':'-separated), e.g. \"/nvme0/ztier\"");

  /* The dynamic scale starts at initial_loss_scale and backs off no lower
   * than min_loss_scale; a floor above the start is a typo, whatever the
   * mode now ("auto" turns dynamic for fp16 parameters). */
  if (cfg->min_loss_scale > cfg->initial_loss_scale) {
    char mn[32], in[32];
    zt__ckjson_fmt_num(cfg->min_loss_scale, mn, sizeof mn);
    zt__ckjson_fmt_num(cfg->initial_loss_scale, in, sizeof in);
    return kfail(c, find_key("min_loss_scale"), find_key("initial_loss_scale"),
                 ZT_ECONFIG,
                 "key 'min_loss_scale' is %s, above initial_loss_scale (%s), with "
                 "loss_scaling \"%s\"; expected min_loss_scale <= initial_loss_scale: "
                 "the scale starts at initial_loss_scale and backs off no lower than "
                 "min_loss_scale",
                 mn, in, scaling_names[cfg->loss_scaling]);
  }

  /* A budget smaller than one chunk cannot hold anything the engine moves. */
  for (size_t i = 0; i < N_KEYS; i++) {
    const keydef_t *k = &keys[i], *chunk = find_key("chunk_bytes");
    uint64_t v = k->at_least_chunk ? get_u64(cfg, k) : 0;
    if (v == 0 || v >= cfg->chunk_bytes) continue;
    char given[96], ch[64];
    value_text(cfg, k, given, sizeof given);
    value_text(cfg, chunk, ch, sizeof ch);
    return kfail(c, k, chunk, ZT_ECONFIG,
                 "key '%s' is %s; expected 0 (no limit) or at least chunk_bytes, "
                 "which is %s",
                 k->name, given, ch);
  }

  /* The host tier stages gradients and parameters through a ring of pinned
   * chunks; a budget that cannot hold the ring fails at the first
   * registration, long after the config was written. */
  if (cfg->optimizer_tier == ZT_TIER_HOST && cfg->pinned_budget_bytes != 0 &&
      cfg->pinned_budget_bytes / RING_CHUNKS < cfg->chunk_bytes) {
    const keydef_t *pinned = find_key("pinned_budget_bytes"),
                   *chunk = find_key("chunk_bytes");
    char pb[64], ring[64];
    zt_config_t tmp = *cfg;
    tmp.pinned_budget_bytes = (size_t)RING_CHUNKS * cfg->chunk_bytes;
    value_text(cfg, pinned, pb, sizeof pb);
    value_text(&tmp, pinned, ring, sizeof ring);
    return kfail(c, pinned, chunk, ZT_ECONFIG,
                 "key 'pinned_budget_bytes' is %s, but optimizer_tier \"host\" needs "
                 "%d * chunk_bytes = %s for its staging ring (%d slots, each a gradient "
                 "and a parameter chunk); expected 0 (no limit) or at least that, or a "
                 "smaller chunk_bytes",
                 pb, RING_CHUNKS, ring, ZT_STAGING_SLOTS);
  }
  return 0;
}

/* Every key, then the combinations; the first failure is reported. */
static int check(const ctx_t *c, const zt_config_t *cfg) {
  for (size_t i = 0; i < N_KEYS; i++) ZT_TRY(check_key(c, cfg, &keys[i]));
  return check_combos(c, cfg);
}

/* ---- JSON text ----------------------------------------------------------------- */

static void line_col(const char *text, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && text[i]; i++) {
    if (text[i] == '\n') {
      ++*line;
      *col = 1;
    } else {
      ++*col;
    }
  }
}

static const char *json_kind(const cJSON *v) {
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "not an object";
}

/* The first comma that only whitespace separates from a closing } or ],
 * outside strings: the most common reason cJSON refuses a hand-edited file,
 * which it reports at the closing bracket or the end. */
static const char *trailing_comma(const char *text) {
  int in_str = 0;
  for (const char *p = text; *p; p++) {
    if (in_str) {
      if (*p == '\\' && p[1]) p++;
      else if (*p == '"') in_str = 0;
    } else if (*p == '"') {
      in_str = 1;
    } else if (*p == ',') {
      const char *q = p + 1 + strspn(p + 1, " \t\r\n");
      if (*q == '}' || *q == ']') return p;
    }
  }
  return NULL;
}

static int syntax_error(const ctx_t *c, const char *text, size_t off) {
  int line, col;
  size_t len = strlen(text);
  if (text[strspn(text, " \t\r\n")] == '\0') {
    line_col(text, len, &line, &col);
    return fail(c, ZT_EJSON,
                "JSON syntax error at line %d, column %d: the input is empty; expected "
                "a JSON object such as {\"stage\": 1}",
                line, col);
  }
  const char *comma = trailing_comma(text);
  if (comma && (size_t)(comma - text) < off) {
    line_col(text, (size_t)(comma - text), &line, &col);
    return fail(c, ZT_EJSON,
                "JSON syntax error at line %d, column %d: a trailing comma; JSON allows "
                "no comma before a closing } or ]",
                line, col);
  }
  line_col(text, off, &line, &col);
  if (off >= len)
    return fail(c, ZT_EJSON,
                "JSON syntax error at line %d, column %d: the input ends early; an "
                "object, array or string is not closed",
                line, col);
  if (off > 0 && text[off - 1] == '"' && strchr(text + off, '"') == NULL)
    return fail(c, ZT_EJSON,
                "JSON syntax error at line %d, column %d: a string that is not closed",
                line, col);
  /* cJSON stops at the comment's first or second character. */
  if (off > 0 && text[off - 1] == '/' && (text[off] == '/' || text[off] == '*'))
    line_col(text, --off, &line, &col);
  if (text[off] == '/' && (text[off + 1] == '/' || text[off + 1] == '*'))
    return fail(
        c, ZT_EJSON,
        "JSON syntax error at line %d, column %d: a comment; JSON has no comments", line,
        col);
  char near[24], shown[64];
  size_t n = strcspn(text + off, "\r\n");
  if (n > 16) n = 16;
  memcpy(near, text + off, n);
  near[n] = '\0';
  quote(near, shown, sizeof shown);
  return fail(c, ZT_EJSON,
              "JSON syntax error at line %d, column %d, at %s; expected a JSON object "
              "of config keys, such as {\"stage\": 1}",
              line, col, shown);
}

/* ---- \u0000 in strings ---------------------------------------------------------- */

/* cJSON decodes "\u0000" into a NUL and so cuts the string there: "a\u0000b"
 * would silently read as "a". It does not say so, so the text that cJSON
 * accepted is walked again, member by member (cJSON keeps their order), to
 * find the strings that held one. */

static const char *skip_ws(const char *p) {
  while (*p && (unsigned char)*p <= ' ') p++; /* what cJSON skips */
  return p;
}

/* Past the string whose opening quote is at p; *nul set when it holds \u0000. */
static const char *skip_string(const char *p, int *nul) {
  for (p++; *p && *p != '"'; p++) {
    if (*p != '\\') continue;
    if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0) *nul = 1;
    if (p[1]) p++;
  }
  return *p ? p + 1 : p;
}

/* Past one value (a string, a number or word, or a nested object or array). */
static const char *skip_value(const char *p, int *nul) {
  int depth = 0;
  do {
    p = skip_ws(p);
    if (*p == '\0') break;
    if (*p == '"') {
      p = skip_string(p, nul);
    } else if (*p == '{' || *p == '[') {
      depth++, p++;
    } else if (*p == '}' || *p == ']') {
      depth--, p++;
    } else if (*p == ',' || *p == ':') {
      p++;
    } else {
      do p++;
      while (*p && (unsigned char)*p > ' ' && !strchr(",:]}\"", *p));
    }
  } while (depth > 0);
  return p;
}

/* Of the nth member (from 0) of the top-level object: 1 when its name holds
 * \u0000, 2 when its value does, else 0. */
static int member_nul(const char *text, int nth) {
  const char *p = text;
  if (strncmp(p, "\xef\xbb\xbf", 3) == 0) p += 3; /* cJSON skips a BOM too */
  p = skip_ws(p);
  if (*p++ != '{') return 0;
  for (int i = 0;; i++) {
    int in_name = 0, in_value = 0;
    p = skip_ws(p);
    if (*p != '"') return 0;
    p = skip_ws(skip_string(p, &in_name));
    if (*p++ != ':') return 0;
    p = skip_ws(skip_value(p, &in_value));
    if (i == nth) return in_name ? 1 : in_value ? 2 : 0;
    if (*p++ != ',') return 0;
  }
}

/* Reads the JSON object in `text` over *cfg (a whole one, of which the
 * caller has the first `have` bytes), all or nothing. */
static int parse_text(const ctx_t *c, zt_config_t *cfg, size_t have, const char *text) {
  const char *end = NULL;
  cJSON *root = zt__ckjson_parse_text(text, &end);
  if (root == NULL) return syntax_error(c, text, end ? (size_t)(end - text) : 0);

  int rc = 0;
  if (!cJSON_IsObject(root)) {
    int line, col;
    line_col(text, strspn(text, " \t\r\n"), &line, &col);
    rc = fail_at(c, line, ZT_EJSON,
                 "the top level is %s; expected a JSON object of config keys, such as "
                 "{\"stage\": 1}",
                 json_kind(root));
    goto out;
  }
  zt_config_t w;
  memcpy(&w, cfg, sizeof w);
  int seen[N_KEYS] = {0};
  int maybe_nul = strstr(text, "\\u0000") != NULL, nth = 0;
  for (const cJSON *it = root->child; it; it = it->next, nth++) {
    const char *name = it->string ? it->string : "";
    int nul = maybe_nul ? member_nul(text, nth) : 0;
    if (nul == 1) {
      char shown[128];
      key_text(name, shown, sizeof shown);
      rc = fail_at(c, key_line(c, name, 1), ZT_ECONFIG,
                   "a key name holds \\u0000 (a NUL byte), which would cut it to '%s'; "
                   "expected a key name such as \"threads\"",
                   shown);
      goto out;
    }
    const keydef_t *k = find_key(name);
    if (k == NULL) {
      rc = unknown_key(c, name, key_line(c, name, 1));
      goto out;
    }
    if (key_end(k) > have) {
      rc = key_missing(c, k, have);
      goto out;
    }
    size_t i = (size_t)(k - keys);
    if (seen[i]++) {
      int first = key_line(c, name, 1), again = key_line(c, name, 2);
      if (first && again && first != again)
        rc = fail_at(c, again, ZT_ECONFIG,
                     "duplicate key '%s' (first at line %d); give each key once",
                     k->name, first);
      else
        rc = fail_at(c, again, ZT_ECONFIG, "duplicate key '%s'; give each key once",
                     k->name);
      goto out;
    }
    if (nul == 2) {
      char r[256];
      range_text(k, r, sizeof r);
      rc = kfail(c, k, NULL, ZT_ECONFIG,
                 "key '%s' holds a string with \\u0000 (a NUL byte), which would cut it "
                 "short; expected %s",
                 k->name, r);
      goto out;
    }
    rc = from_json(c, k, it, &w);
    if (rc < 0) goto out;
  }
  rc = check(c, &w);
  if (rc == 0) memcpy(cfg, &w, sizeof w);
out:
  cJSON_Delete(root);
  return rc;
}

/* ---- public API ------------------------------------------------------------------ */

int zt_config_parse(zt_config_t *cfg, const char *json) {
  ctx_t c = {.fn = "zt_config_parse"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (json == NULL)
    return fail(&c, -EINVAL, "json is NULL; expected a NUL-terminated JSON object");
  zt_config_t full;
  size_t have;
  ZT_TRY(import(&c, cfg, &full, &have));
  c.text = json;
  ZT_TRY(parse_text(&c, &full, have, json));
  export(cfg, &full, have);
  return 0;
}

/* The whole file into a NUL-terminated buffer, up to MAX_FILE_BYTES. */
static int read_file(const ctx_t *c, const char *path, char **out) {
  char eb[128];
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return fail(c, -e, "cannot open the config file: %s", strerror_r(e, eb, sizeof eb));
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return fail(c, -EISDIR, "is a directory; expected a JSON config file");
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  int rc = 0;
  if (buf == NULL) {
    rc = fail(c, -ENOMEM, "out of memory reading the config file");
    goto done;
  }
  for (;;) {
    if (len + 1 >= cap) {
      /* One byte past the limit is enough to know the file is too big. */
      if (len > MAX_FILE_BYTES) break;
      size_t ncap = cap * 2 > MAX_FILE_BYTES + 2 ? MAX_FILE_BYTES + 2 : cap * 2;
      char *nb = realloc(buf, ncap);
      if (nb == NULL) {
        rc = fail(c, -ENOMEM, "out of memory reading the config file");
        goto done;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      rc = fail(c, -e, "cannot read the config file: %s", strerror_r(e, eb, sizeof eb));
      goto done;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  if (len > MAX_FILE_BYTES) {
    rc = fail(c, ZT_ECONFIG,
              "the file is larger than 1 MiB (%llu bytes or more); a config file is a "
              "small JSON object: is this the right path?",
              (unsigned long long)len);
    goto done;
  }
  buf[len] = '\0';
  const char *nul = memchr(buf, '\0', len);
  if (nul) {
    int line, col;
    line_col(buf, (size_t)(nul - buf), &line, &col);
    rc = fail(c, ZT_EJSON,
              "JSON syntax error at line %d, column %d: a NUL byte; expected "
              "UTF-8 text",
              line, col);
    goto done;
  }
done:
  close(fd);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

int zt_config_load(zt_config_t *cfg, const char *path) {
  ctx_t c = {.fn = "zt_config_load"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (path == NULL) return fail(&c, -EINVAL, "path is NULL; expected a JSON file's path");
  zt_config_t full;
  size_t have;
  ZT_TRY(import(&c, cfg, &full, &have));
  c.path = path;
  char *text;
  ZT_TRY(read_file(&c, path, &text));
  c.text = text;
  int rc = parse_text(&c, &full, have, text);
  free(text);
  if (rc == 0) export(cfg, &full, have);
  return rc;
}

int zt_config_set(zt_config_t *cfg, const char *key, const char *value) {
  ctx_t c = {.fn = "zt_config_set"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (key == NULL)
    return fail(&c, -EINVAL, "key is NULL; expected a key name such as \"threads\"");
  if (value == NULL) {
    char shown[128];
    key_text(key, shown, sizeof shown);
    return fail(&c, -EINVAL,
                "value is NULL for key '%s'; expected its text, such as \"2\"", shown);
  }
  zt_config_t w;
  size_t have;
  ZT_TRY(import(&c, cfg, &w, &have));
  const keydef_t *k = find_key(key);
  if (k == NULL) return unknown_key(&c, key, 0);
  if (key_end(k) > have) return key_missing(&c, k, have);
  ZT_TRY(from_text(&c, k, value, &w));
  /* This key's own type and range only: the rules between keys wait for
   * the whole config (check_combos). */
  ZT_TRY(check_key(&c, &w, k));
  export(cfg, &w, have);
  return 0;
}

int zt_config_validate(const zt_config_t *cfg) {
  ctx_t c = {.fn = "zt_config_validate"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  zt_config_t full;
  size_t have;
  ZT_TRY(import(&c, cfg, &full, &have));
  return check(&c, &full);
}

int zt_config_to_json(const zt_config_t *cfg, char *buf, size_t len) {
  ctx_t c = {.fn = "zt_config_to_json"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  if (buf == NULL && len > 0)
    return fail(&c, -EINVAL,
                "buf is NULL with len %zu; expected a buffer of len bytes, or len 0 to "
                "ask for the length",
                len);
  zt_config_t full;
  size_t have;
  ZT_TRY(import(&c, cfg, &full, &have));
  out_t o = {buf, len, 0};
  if (len) buf[0] = '\0';
  put(&o, "{\n");
  /* Only the keys the caller's struct has: the text reads back into it. */
  int first = 1;
  for (size_t i = 0; i < N_KEYS; i++) {
    if (key_end(&keys[i]) > have) continue;
    put(&o, "%s  \"%s\": ", first ? "" : ",\n", keys[i].name);
    put_value(&o, &full, &keys[i]);
    first = 0;
  }
  put(&o, "\n");
  put(&o, "}");
  return o.need > INT_MAX ? INT_MAX : (int)o.need;
}

int zt_config_init_size(zt_config_t *cfg, size_t size) {
  ctx_t c = {.fn = "zt_config_init_size"};
  if (cfg == NULL)
    return fail(&c, -EINVAL, "cfg is NULL; expected a zt_config_t to fill");
  if (size < ZT__CONFIG_SIZE_0_1 || size > ZT__ABI_MAX_SIZE)
    return fail(&c, -EINVAL,
                "size is %zu; expected sizeof(zt_config_t) (at least %zu, at most %zu; use "
                "zt_config_init())",
                size, ZT__CONFIG_SIZE_0_1, ZT__ABI_MAX_SIZE);
  /* Fields past this library's struct are a newer header's, whose zero is
   * their default. */
  memset(cfg, 0, size);
  memcpy(cfg, &defaults, size < sizeof defaults ? size : sizeof defaults);
  cfg->size = size;
  return 0;
}

/* ---- docs/config.md ------------------------------------------------------------- */

/*
 * Writes the key table of docs/config.md (markdown, one row per key: type,
 * default, what it accepts, meaning) from the same table the loader uses;
 * tests/test_config.c checks that the page holds exactly this text.
 * snprintf-style result.
 */

int zt__config_doc(char *buf, size_t len) {
  static const char *const type_names[] = {"string", "integer", "number",
                                           "size",   "integer", "path list"};
  _Static_assert(sizeof type_names / sizeof type_names[0] == T_PATHS + 1, "type names");
  out_t o = {buf, len, 0};
  if (len) buf[0] = '\0';
  put(&o, "| key | type | default | accepts | meaning |\n");
  put(&o, "|---|---|---|---|---|\n");
  for (size_t i = 0; i < N_KEYS; i++) {
    const keydef_t *k = &keys[i];
    char def[64], human[32], r[256];
    json_text(&defaults, k, def, sizeof def);
    human[0] = '\0';
    if (k->type == T_SIZE) fmt_human(get_u64(&defaults, k), human, sizeof human);
    range_text(k, r, sizeof r);
    if (k->type == T_ENUM) {
      /* Code spans read better in a table than quoted strings. */
      size_t o2 = 0;
      int seen = 0;
      r[0] = '\0';
      for (int j = 0; j < k->n_names; j++) {
        if (!((k->supported >> j) & 1)) continue;
        o2 += (size_t)snprintf(r + o2, sizeof r - o2, "%s`%s`", seen++ ? ", " : "",
                               k->names[j]);
      }
    }
    const char *type = k->type == T_PATHS && k->max_paths == 0 ? "path" : type_names[k->type];
    put(&o, "| `%s` | %s | `%s`%s%s%s | %s | %s |\n", k->name, type, def,
        human[0] ? " (" : "", human, human[0] ? ")" : "", r, k->doc);
  }
  return o.need > INT_MAX ? INT_MAX : (int)o.need;
}

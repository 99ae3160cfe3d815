/*
 * config.c — the config's key table and its checks: every fact about a key
 * (its name, which is the field name, type, field offset, range, enum names
 * and meaning) in one table, `zt__config_keys`; the check of one key and the
 * rules between keys (check_combos); zt_config_validate, zt_config_init_size
 * and the size rule of abi.h for a caller's struct. The text forms of
 * values are config_text.c's, whole JSON documents config_json.c's; all
 * three read this table, so they cannot disagree about a key.
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
 *   - rules between keys run in zt_config_validate and at engine create,
 *     never in zt_config_set, so keys may be set in any order.
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

#include "base/abi.h"         // defines: zt__abi_size, ZT__CONFIG_SIZE_0_1
#include "base/ckjson.h"      // defines: zt__ckjson_parse_text, zt__ckjson_fmt_num
#include "engine/config.h"    // defines: zt__config_import, zt__config_doc
#include "engine/config_impl.h"
#include "offload/swap.h"     // defines: ZT__SWAP_MAX_PATHS, ZT__SWAP_MAX_RINGS
#include "offload/tier.h"     // defines: ZT_STAGING_SLOTS (the host tier's staging ring)

static const char *const backend_names[] = {"host", "cuda", "sim"};
static const char *const comm_names[] = {"single", "mpi", "nccl", "auto"};
static const char *const optimizer_names[] = {"adamw", "adam"};
static const char *const tier_names[] = {"device", "host", "nvme"};
static const char *const rounding_names[] = {"nearest", "stochastic"};
static const char *const scaling_names[] = {"auto", "none", "static", "dynamic"};
static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const nonfinite_names[] = {"skip", "apply"};
static const char *const states_names[] = {"fp32", "bf16", "int8"};
static const char *const grad_sums_names[] = {"auto", "memory", "disk"};

#define FIELD(f) .name = #f, .off = offsetof(zt_config_t, f)
#define CAP(f) .cap = sizeof(((zt_config_t *)0)->f)
#define NAMES(a) .names = (a), .n_names = (int)(sizeof(a) / sizeof((a)[0]))

const keydef_t zt__config_keys[] = {
    {FIELD(backend), .type = T_ENUM, NAMES(backend_names), .supported = 0x7,
     .doc = "where the engine's memory and kernels are: `host` (host memory, C "
            "kernels), `cuda` (a GPU), or `sim` (a GPU modelled on the CPU, for "
            "tests and benchmarks; docs/gpu.md)"},
    {FIELD(device), .type = T_INT, .lo = -1, .hi = 1023, .sup = 1023,
     .also = "-1 or 0 with backend \"host\"",
     .doc = "CUDA device ordinal; -1 = local_rank % device_count, the local rank from "
            "MPI or the launcher (docs/gpu.md, \"Which GPU each rank uses\"); only "
            "meaningful with backend `cuda`"},
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
     .doc = "seconds a rank waits in a collective (comm `mpi`, and comm `nccl` with "
            "its init) for the other ranks; then the call fails with ETIMEDOUT (comm "
            "`mpi` names the ranks that did not come; comm `nccl` is aborted). "
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
    {FIELD(optimizer_states), .type = T_ENUM, NAMES(states_names), .supported = 0x3,
     .also = "\"bf16\" with optimizer_tier \"host\" or \"nvme\"",
     .doc = "how the optimizer tier stores Adam's m and v: `fp32` (4 bytes each), or "
            "`bf16` (2 bytes each, rounded stochastically from `seed` and the step; "
            "docs/states.md). Checkpoints hold them as fp32 either way, so a run may "
            "resume in the other format"},
    {FIELD(grads_once), .type = T_INT, .lo = 0, .hi = 1, .sup = 1, .boolean = 1,
     .doc = "1: each group's gradients are handed over at most once between two steps "
            "(no accumulation over micro-steps; a second zt_grads_ready() of a group "
            "before the step is refused, nothing moved), and one rank with bf16 or fp16 "
            "gradients keeps them as they are at stages 2 and 3, as at stage 1: no fp32 "
            "sums (docs/design.md). 0: any number of hand-overs, summed in fp32"},
    {FIELD(grads_in_place), .type = T_INT, .lo = 0, .hi = 1, .sup = 1, .boolean = 1,
     .doc = "1 (with grads_once 1): the loop leaves each handed-over group's gradients "
            "in its registered buffer, untouched, until a zt_step() that takes the step "
            "(applied or skipped; not one refused), a zt_load() or a zt_import_safetensors() "
            "returns, and writes "
            "them next on the stream given to zt_set_stream(); one rank at stage 2 or 3 "
            "with bf16 or fp16 gradients, optimizer_tier \"device\" and units end to end "
            "then reads them there at the step, as stage 1 does, with no copy at the "
            "hand-over, and zeroes them after the step (docs/design.md); no effect "
            "otherwise, nor with params_in_place. 0: a hand-over at stages 2 and 3 "
            "copies them out and zeroes them"},
    {FIELD(grad_sums), .type = T_ENUM, NAMES(grad_sums_names), .supported = 0x7,
     .also = "\"disk\" needs stage 1-3 and optimizer_tier \"nvme\"",
     .doc = "stages 1-3: where the shard's fp32 gradient sums (4 bytes a parameter; "
            "one rank at stage 1 with 16-bit gradients: the gradients as they landed, "
            "2) live from the hand-over to the update: `memory` (pinned host memory, or "
            "device memory with optimizer_tier `device`), `disk` (an unlinked file in "
            "swap_path's first directory, each pass giving back the pages it read; "
            "docs/offload.md) or `auto` (`disk` at stage 3 with optimizer_tier `nvme`, "
            "`memory` otherwise). `memory` can be faster, `disk` holds no RAM for them. A "
            "shard reduced in device memory (more than one rank on a GPU backend) keeps "
            "them there, with a warning for `disk`"},
    {FIELD(param_tier), .type = T_ENUM, NAMES(tier_names), .supported = 0x7,
     .also = "\"host\" and \"nvme\" need stage 3; \"nvme\" needs swap_path",
     .doc = "where this rank's shard of the parameters lives between uses at stage 3: "
            "`device`, `host` (pinned host memory) or `nvme` (a swap file in "
            "swap_path, read by zt_fetch() and ahead of it, written by each step)"},
    {FIELD(prefetch_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0,
     .align = 1,
     .doc = "stage 3: bytes of the coming groups' parameter shards read ahead of "
            "zt_fetch() (in flight or landed) at most, in pinned memory; a released "
            "group the recorded order uses again within this many bytes of fetches is "
            "kept gathered. 0: no reading ahead, nothing kept"},
    {FIELD(max_live_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0,
     .align = 1,
     .doc = "stage 3: gathered parameters that the prefetch scheduler keeps after their "
            "release, at most, counting the fetched groups; the loop's own fetches are "
            "never refused"},
    {FIELD(stage_min_bytes), .type = T_SIZE, .lo = 0, .hi = 18446744073709551615.0,
     .align = 1,
     .doc = "stage 3: the smallest part of a group (this rank's bytes of it) that is "
            "staged ahead of its zt_fetch() on the prefetch stream; a smaller part is "
            "copied inside the fetch, where a hand-over to another thread costs more "
            "than the copy. 0: every group that can be"},
    {FIELD(params_in_place), .type = T_INT, .lo = 0, .hi = 1, .sup = 1, .boolean = 1,
     .also = "backend \"host\"",
     .doc = "stage 3: 1 gathers each fetched group into its own place in the registered "
            "parameter buffer, so the loop computes on its own pointers, and gives the "
            "pages of a released group's parameters, and of handed-over gradients, back "
            "to the system (the buffers must be anonymous memory: malloc, calloc or "
            "anonymous mmap). 0: fetched groups live in ztier's buffers. No effect at "
            "stages 0-2, which update the registered buffer in place"},
    {FIELD(rounding), .type = T_ENUM, NAMES(rounding_names), .supported = 0x3,
     .doc = "how the fp32 master weights are rounded to bf16 parameters: `nearest` "
            "(ties to even) or `stochastic` (unbiased; from `seed` and the step)"},
    {FIELD(seed), .type = T_SEED,
     .doc = "seed of stochastic rounding: the same seed gives the same bits"},
    {FIELD(threads), .type = T_INT, .lo = 0, .hi = 4096, .sup = 4096,
     .doc = "CPU optimizer threads; 0 = every CPU this process may run on, but "
            "its share of the node's CPUs when the node's ranks may each run on all "
            "of them (not bound by the launcher)"},
    {FIELD(clip_grad_norm), .type = T_NUM, .lo = 0, .hi = INFINITY,
     .doc = "clip the gradients to this global L2 norm; 0 = no clipping"},
    {FIELD(loss_scaling), .type = T_ENUM, NAMES(scaling_names), .supported = 0xf,
     .doc = "`auto` (dynamic for fp16 parameters, none otherwise), `none`, `static` "
            "(always initial_loss_scale) or `dynamic` (back off on inf/nan, grow "
            "when stable)"},
    {FIELD(nonfinite), .type = T_ENUM, NAMES(nonfinite_names), .supported = 0x3,
     .doc = "a step whose gradients hold inf or nan: `skip` skips it (nothing is "
            "written); `apply` applies it as torch.optim.AdamW does (skipped all the "
            "same with loss scaling on), which lets a step with no loss scaling and no "
            "clipping take the gradient norm in the update's own pass"},
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
            "and buckets, but the sums at stage 3 with \"nvme\", unless a GPU reduces "
            "them in device memory: docs/gpu.md); 0 = no limit"},
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
    {FIELD(swap_block_bytes), .type = T_SIZE, .lo = 4096, .hi = 64.0 * MiB, .align = 4096,
     .pow2 = 1,
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
const size_t zt__config_n_keys = sizeof zt__config_keys / sizeof zt__config_keys[0];
_Static_assert(sizeof zt__config_keys / sizeof zt__config_keys[0] <= ZT__CONFIG_MAX_KEYS,
               "raise ZT__CONFIG_MAX_KEYS");

const keydef_t *zt__config_find_key(const char *name) {
  for (size_t i = 0; i < zt__config_n_keys; i++)
    if (strcmp(zt__config_keys[i].name, name) == 0) return &zt__config_keys[i];
  return NULL;
}

/* ---- errors -------------------------------------------------------------------- */


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

__attribute__((format(printf, 4, 5))) int
zt__config_fail_at(const ctx_t *c, int line, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(c, line, code, fmt, ap);
  va_end(ap);
  return rc;
}

/* The line of the nth `"name":` in the JSON text, or 0 when it is not there
 * verbatim (a name written with escapes). Only a hint for the reader. */
int zt__config_key_line(const ctx_t *c, const char *name, int nth) {
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
__attribute__((format(printf, 5, 6))) int zt__config_kfail(const ctx_t *c,
                                                           const keydef_t *k,
                                                           const keydef_t *k2, int code,
                                                           const char *fmt, ...) {
  int line = zt__config_key_line(c, k->name, 1);
  if (line == 0 && k2) line = zt__config_key_line(c, k2->name, 1);
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(c, line, code, fmt, ap);
  va_end(ap);
  return rc;
}

/* "key 'threads' is 2.5; expected an integer in 0..4096". */
int zt__config_bad_value(const ctx_t *c, const keydef_t *k, const char *given,
                         const char *expected) {
  char r[256];
  if (expected == NULL) {
    zt__config_range_text(k, r, sizeof r);
    expected = r;
  }
  return zt__config_kfail(c, k, NULL, ZT_ECONFIG, "key '%s' is %s; expected %s", k->name,
                          given, expected);
}

const char zt__config_size_syntax[] =
    "a byte count: an integer, or a string such as \"64MiB\" (K, M, G, T, Ki .. Ti and "
    "KiB .. TiB count powers of 1024; KB, MB, GB, TB powers of 1000; B is bytes)";
const char zt__config_seed_syntax[] =
    "an integer in 0..18446744073709551615: a JSON integer below 2^53, or a "
    "decimal string";

/* ---- validation --------------------------------------------------------------- */

/* The defaults of this library, for the fields an older caller's struct
 * lacks and for zt_config_init_size. */
const zt_config_t zt__config_defaults = ZT_CONFIG_INIT;

/* The caller's config as a whole one of this library: its first *have bytes
 * (the size rule of abi.h) over the defaults, size set to this library's.
 * With c NULL it writes no sentence (engine create's question whether the
 * config can be read at all). */
int zt__config_import_whole(const ctx_t *c, const zt_config_t *cfg, zt_config_t *full,
                            size_t *have) {
  ZT_TRY(zt__abi_size(c ? zt__err_thread() : NULL, c ? c->fn : "", "cfg", "zt_config_t",
                      cfg, cfg->size, ZT__CONFIG_SIZE_0_1, sizeof(zt_config_t),
                      "ZT_CONFIG_INIT or zt_config_init()", have));
  if (cfg->version != ZT_CONFIG_VERSION) {
    if (c == NULL) return -EINVAL;
    return zt__config_fail(
        c, -EINVAL,
        "cfg->version is %u; expected ZT_CONFIG_VERSION = %u (fill the config "
        "with ZT_CONFIG_INIT or zt_config_init())",
        cfg->version, ZT_CONFIG_VERSION);
  }
  memcpy(full, &zt__config_defaults, sizeof *full);
  memcpy(full, cfg, *have);
  full->size = sizeof *full;
  return 0;
}

/* Writes a changed config back: only the caller's first `have` bytes, and
 * never its size. */
void zt__config_export_back(zt_config_t *cfg, const zt_config_t *full, size_t have) {
  size_t skip = offsetof(zt_config_t, version);
  memcpy((char *)cfg + skip, (const char *)full + skip, have - skip);
}

/* Whether key k's field is inside the caller's first `have` bytes: a
 * program built against an older ztier.h has no room for a later key. */
size_t zt__config_key_end(const keydef_t *k) {
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

int zt__config_key_missing(const ctx_t *c, const keydef_t *k, size_t have) {
  return zt__config_kfail(
      c, k, NULL, ZT_ECONFIG,
      "key '%s' is not in this config: cfg->size is %zu, which ends before the "
      "field (the program was built against an older ztier.h, without it); "
      "expected a key of that version, or a program built against this one",
      k->name, have);
}

int zt__config_import(const zt_config_t *cfg, zt_config_t *full) {
  size_t have;
  return cfg ? zt__config_import_whole(NULL, cfg, full, &have) : -EINVAL;
}

/* A T_PATHS field: NUL-terminated in its array, and either "" or 1 ..
 * max_paths non-empty directories between single ':'. Whether they exist is
 * for the nvme tier to find when it opens them. */
static int check_paths(const ctx_t *c, const zt_config_t *cfg, const keydef_t *k,
                       const char *given) {
  const char *s = get_str(cfg, k);
  if (memchr(s, '\0', k->cap) == NULL)
    return zt__config_kfail(
        c, k, NULL, ZT_ECONFIG,
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
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' is %s: directory %u is empty (%s); expected directories "
          "separated by single ':', none empty, or \"\" for no swap space",
          k->name, given, n, where);
    }
    if (e == NULL) break;
    p = e;
  }
  if (n > k->max_paths)
    return zt__config_kfail(
        c, k, NULL, ZT_ECONFIG,
        "key '%s' is %s, %u directories; expected at most %u (the swap space "
        "stripes over at most %u)",
        k->name, given, n, k->max_paths, k->max_paths);
  return 0;
}

int zt__config_check_key(const ctx_t *c, const zt_config_t *cfg, const keydef_t *k) {
  char given[96];
  zt__config_value_text(cfg, k, given, sizeof given);
  switch (k->type) {
  case T_ENUM: {
    int v = get_int(cfg, k);
    if (v < 0 || v >= k->n_names) {
      char r[256];
      zt__config_range_text(k, r, sizeof r);
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' is %d, which is not a value of its enum; expected %s", k->name, v, r);
    }
    if (!((k->supported >> v) & 1))
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' is \"%s\", which is not supported by this version (%s)", k->name,
          k->names[v], k->unsup);
    return 0;
  }
  case T_INT: {
    int v = get_int(cfg, k);
    if (v >= k->lo && v <= k->sup) return 0;
    if (v > k->sup && v <= k->hi)
      return zt__config_kfail(
          c, k, NULL, ZT_ECONFIG,
          "key '%s' is %d: %s %d is not supported by this version (%s)", k->name, v,
          k->name, v, k->unsup);
    return zt__config_bad_value(c, k, given, NULL);
  }
  case T_NUM: {
    double v = get_num(cfg, k);
    int ok = isfinite(v) && (k->lo_open ? v > k->lo : v >= k->lo) &&
             (k->hi_open ? v < k->hi : v <= k->hi);
    return ok ? 0 : zt__config_bad_value(c, k, given, NULL);
  }
  case T_SIZE: {
    uint64_t v = get_u64(cfg, k);
    /* A budget holds any count alone; how it compares with chunk_bytes is
     * a rule between keys, in check_combos. */
    if (k->at_least_chunk) return 0;
    if (v >= k->lo && v <= k->hi && v % k->align == 0 && (!k->pow2 || !(v & (v - 1))))
      return 0;
    return zt__config_bad_value(c, k, given, NULL);
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
  const keydef_t *file = zt__config_find_key("nccl_id_file"),
                 *rank = zt__config_find_key("rank"),
                 *world = zt__config_find_key("world_size");
  int has_file = cfg->nccl_id_file[0] != '\0';
  if (has_file && cfg->comm != ZT_COMM_NCCL)
    return zt__config_kfail(
        c, file, zt__config_find_key("comm"), ZT_ECONFIG,
        "key 'nccl_id_file' is set but comm is \"%s\": the id file is only "
        "read by comm \"nccl\"; set comm \"nccl\" or remove nccl_id_file",
        comm_names[cfg->comm]);
  if (!has_file && (cfg->rank != -1 || cfg->world_size != 0))
    return zt__config_kfail(
        c, cfg->rank != -1 ? rank : world, file, ZT_ECONFIG,
        "key '%s' is %d but nccl_id_file is \"\": rank and world_size are "
        "only used by the file bootstrap of comm \"nccl\" (under mpirun they "
        "come from MPI); set nccl_id_file too, or remove them",
        cfg->rank != -1 ? "rank" : "world_size",
        cfg->rank != -1 ? cfg->rank : cfg->world_size);
  if (has_file && (cfg->rank < 0 || cfg->world_size < 1))
    return zt__config_kfail(
        c, cfg->world_size < 1 ? world : rank, file, ZT_ECONFIG,
        "key '%s' is %d but nccl_id_file is set: the file bootstrap needs this "
        "process's rank (>= 0) and world_size (>= 1)",
        cfg->world_size < 1 ? "world_size" : "rank",
        cfg->world_size < 1 ? cfg->world_size : cfg->rank);
  if (has_file && cfg->rank >= cfg->world_size)
    return zt__config_kfail(
        c, rank, world, ZT_ECONFIG,
        "key 'rank' is %d but world_size is %d; expected a rank in [0, %d)", cfg->rank,
        cfg->world_size, cfg->world_size);
  return 0;
}

/* Rules on two keys. Each names both, and what would fix it. They are
 * checked on a whole config only (validate, engine create, the end of a load
 * or parse), never by zt_config_set: a rule between two keys cannot hold
 * while a caller sets them one at a time, whichever goes first. */
static int check_combos(const ctx_t *c, const zt_config_t *cfg) {
  const keydef_t *backend = zt__config_find_key("backend"),
                 *device = zt__config_find_key("device");
  if (cfg->backend == ZT_BACKEND_HOST && cfg->device != 0 && cfg->device != -1)
    return zt__config_kfail(
        c, device, backend, ZT_ECONFIG,
        "key 'device' is %d but backend is \"host\": device is only meaningful "
        "for backend \"cuda\"; remove device or set it to -1 (or 0)",
        cfg->device);

  /* NCCL moves device memory; with backend "host" there is none. */
  if (cfg->comm == ZT_COMM_NCCL && cfg->backend != ZT_BACKEND_CUDA)
    return zt__config_kfail(
        c, zt__config_find_key("comm"), backend, ZT_ECONFIG,
        "key 'comm' is \"nccl\" but backend is \"%s\": NCCL needs backend "
        "\"cuda\"; set backend \"cuda\", or comm \"mpi\" for host buffers",
        backend_names[cfg->backend]);
  ZT_TRY(check_nccl_boot(c, cfg));

  /* The nvme tier's files go in swap_path; without one the first
   * registration would fail long after the config was written. */
  if (cfg->optimizer_tier == ZT_TIER_NVME && cfg->swap_path[strspn(cfg->swap_path, ":")] == 0)
    return zt__config_kfail(
        c, zt__config_find_key("optimizer_tier"), zt__config_find_key("swap_path"),
        ZT_ECONFIG,
        "key 'optimizer_tier' is \"nvme\" but swap_path is empty; expected "
        "swap_path to name one or more directories for the swap files "
        "(':'-separated), e.g. \"/nvme0/ztier\"");

  /* Parameters are partitioned, and so can live elsewhere, at stage 3. */
  if (cfg->param_tier != ZT_TIER_DEVICE && cfg->stage != 3)
    return zt__config_kfail(
        c, zt__config_find_key("param_tier"), zt__config_find_key("stage"), ZT_ECONFIG,
        "key 'param_tier' is \"%s\" but stage is %d; expected stage 3 (the "
        "parameters are partitioned, and offloaded, at stage 3 only) or "
        "param_tier \"device\"",
        tier_names[cfg->param_tier], cfg->stage);
  if (cfg->param_tier == ZT_TIER_NVME && cfg->swap_path[strspn(cfg->swap_path, ":")] == 0)
    return zt__config_kfail(
        c, zt__config_find_key("param_tier"), zt__config_find_key("swap_path"),
        ZT_ECONFIG,
        "key 'param_tier' is \"nvme\" but swap_path is empty; expected "
        "swap_path to name one or more directories for the swap files "
        "(':'-separated), e.g. \"/nvme0/ztier\"");

  /* Compressed states are updated on the CPU: the device tier has no kernel
   * for them yet. */
  if (cfg->optimizer_states != ZT_STATES_FP32 && cfg->optimizer_tier == ZT_TIER_DEVICE)
    return zt__config_kfail(
        c, zt__config_find_key("optimizer_states"), zt__config_find_key("optimizer_tier"),
        ZT_ECONFIG,
        "key 'optimizer_states' is \"%s\" but optimizer_tier is \"%s\"; expected "
        "optimizer_tier \"host\" or \"nvme\" (compressed states are not yet in the "
        "device tier) or optimizer_states \"fp32\"",
        states_names[cfg->optimizer_states], tier_names[cfg->optimizer_tier]);

  /* The sums' file is read and given back window by window by the nvme
   * tier's update; another tier would read it whole. */
  if (cfg->grad_sums == ZT_GRAD_SUMS_DISK &&
      (cfg->stage == 0 || cfg->optimizer_tier != ZT_TIER_NVME))
    return zt__config_kfail(
        c, zt__config_find_key("grad_sums"),
        zt__config_find_key(cfg->stage == 0 ? "stage" : "optimizer_tier"), ZT_ECONFIG,
        "key 'grad_sums' is \"disk\" but %s; expected stage 1, 2 or 3 with "
        "optimizer_tier \"nvme\" (the shard's sums are summed, read and updated a "
        "window at a time there), or grad_sums \"auto\" or \"memory\"",
        cfg->stage == 0 ? "stage is 0 (no shard, no sums)"
                        : (cfg->optimizer_tier == ZT_TIER_HOST ? "optimizer_tier is \"host\""
                                                               : "optimizer_tier is \"device\""));

  /* Gradients read at the step are each group's one hand-over: a second
   * would have to be summed, and could only be added where they are. */
  if (cfg->grads_in_place && !cfg->grads_once)
    return zt__config_kfail(
        c, zt__config_find_key("grads_in_place"), zt__config_find_key("grads_once"),
        ZT_ECONFIG,
        "key 'grads_in_place' is 1 but grads_once is 0; expected grads_once 1 (the "
        "gradients read where the loop wrote them are each group's one hand-over a "
        "step) or grads_in_place 0");

  /* On a GPU the registered buffers are device memory, which would need
   * virtual memory management to be backed a group at a time. */
  if (cfg->params_in_place && cfg->backend != ZT_BACKEND_HOST)
    return zt__config_kfail(
        c, zt__config_find_key("params_in_place"), backend, ZT_ECONFIG,
        "key 'params_in_place' is 1 but backend is \"%s\"; expected backend \"host\" "
        "(device buffers backed a group at a time need CUDA's virtual memory "
        "management, which ztier does not do yet) or params_in_place 0",
        backend_names[cfg->backend]);

  /* The dynamic scale starts at initial_loss_scale and backs off no lower
   * than min_loss_scale; a floor above the start is a typo, whatever the
   * mode now ("auto" turns dynamic for fp16 parameters). */
  if (cfg->min_loss_scale > cfg->initial_loss_scale) {
    char mn[32], in[32];
    zt__ckjson_fmt_num(cfg->min_loss_scale, mn, sizeof mn);
    zt__ckjson_fmt_num(cfg->initial_loss_scale, in, sizeof in);
    return zt__config_kfail(
        c, zt__config_find_key("min_loss_scale"),
        zt__config_find_key("initial_loss_scale"), ZT_ECONFIG,
        "key 'min_loss_scale' is %s, above initial_loss_scale (%s), with "
        "loss_scaling \"%s\"; expected min_loss_scale <= initial_loss_scale: "
        "the scale starts at initial_loss_scale and backs off no lower than "
        "min_loss_scale",
        mn, in, scaling_names[cfg->loss_scaling]);
  }

  /* A budget smaller than one chunk cannot hold anything the engine moves. */
  for (size_t i = 0; i < zt__config_n_keys; i++) {
    const keydef_t *k = &zt__config_keys[i], *chunk = zt__config_find_key("chunk_bytes");
    uint64_t v = k->at_least_chunk ? get_u64(cfg, k) : 0;
    if (v == 0 || v >= cfg->chunk_bytes) continue;
    char given[96], ch[64];
    zt__config_value_text(cfg, k, given, sizeof given);
    zt__config_value_text(cfg, chunk, ch, sizeof ch);
    return zt__config_kfail(
        c, k, chunk, ZT_ECONFIG,
        "key '%s' is %s; expected 0 (no limit) or at least chunk_bytes, "
        "which is %s",
        k->name, given, ch);
  }

  /* The host tier stages gradients and parameters through a ring of pinned
   * chunks; a budget that cannot hold the ring fails at the first
   * registration, long after the config was written. */
  if (cfg->optimizer_tier == ZT_TIER_HOST && cfg->pinned_budget_bytes != 0 &&
      cfg->pinned_budget_bytes / RING_CHUNKS < cfg->chunk_bytes) {
    const keydef_t *pinned = zt__config_find_key("pinned_budget_bytes"),
                   *chunk = zt__config_find_key("chunk_bytes");
    char pb[64], ring[64];
    zt_config_t tmp = *cfg;
    tmp.pinned_budget_bytes = (size_t)RING_CHUNKS * cfg->chunk_bytes;
    zt__config_value_text(cfg, pinned, pb, sizeof pb);
    zt__config_value_text(&tmp, pinned, ring, sizeof ring);
    return zt__config_kfail(
        c, pinned, chunk, ZT_ECONFIG,
        "key 'pinned_budget_bytes' is %s, but optimizer_tier \"host\" needs "
        "%d * chunk_bytes = %s for its staging ring (%d slots, each a gradient "
        "and a parameter chunk); expected 0 (no limit) or at least that, or a "
        "smaller chunk_bytes",
        pb, RING_CHUNKS, ring, ZT_STAGING_SLOTS);
  }
  return 0;
}

/* Every key, then the combinations; the first failure is reported. */
int zt__config_check_all(const ctx_t *c, const zt_config_t *cfg) {
  for (size_t i = 0; i < zt__config_n_keys; i++)
    ZT_TRY(zt__config_check_key(c, cfg, &zt__config_keys[i]));
  return check_combos(c, cfg);
}

int zt_config_validate(const zt_config_t *cfg) {
  ctx_t c = {.fn = "zt_config_validate"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL,
                           "cfg is NULL; expected a config filled with ZT_CONFIG_INIT");
  zt_config_t full;
  size_t have;
  ZT_TRY(zt__config_import_whole(&c, cfg, &full, &have));
  return zt__config_check_all(&c, &full);
}

int zt_config_init_size(zt_config_t *cfg, size_t size) {
  ctx_t c = {.fn = "zt_config_init_size"};
  if (cfg == NULL)
    return zt__config_fail(&c, -EINVAL, "cfg is NULL; expected a zt_config_t to fill");
  if (size < ZT__CONFIG_SIZE_0_1 || size > ZT__ABI_MAX_SIZE)
    return zt__config_fail(
        &c, -EINVAL,
        "size is %zu; expected sizeof(zt_config_t) (at least %zu, at most %zu; use "
        "zt_config_init())",
        size, ZT__CONFIG_SIZE_0_1, ZT__ABI_MAX_SIZE);
  /* Fields past this library's struct are a newer header's, whose zero is
   * their default. */
  memset(cfg, 0, size);
  memcpy(cfg, &zt__config_defaults,
         size < sizeof zt__config_defaults ? size : sizeof zt__config_defaults);
  cfg->size = size;
  return 0;
}

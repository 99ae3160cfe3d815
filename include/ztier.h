/*
 * ztier.h — the one public header of libztier.
 *
 * ztier makes the model states of data-parallel training (optimizer states,
 * gradients, parameters) take as little accelerator memory as the caller asks
 * for. A C training loop registers its flat parameter and gradient buffers
 * once, then replaces the body of its hand-written AdamW with zt_step().
 *
 * Conventions, for every function below:
 *   - An `int` result >= 0 is success; a negative value is -errno or one of
 *     ztier's own codes (ZT_E*). zt_strerror() turns it into a sentence;
 *     zt_last_error() says which argument was wrong and what was expected.
 *   - Nothing here aborts or exits the process, and nothing prints unless a
 *     log callback is set in the config.
 *   - A call that fails leaves the caller's buffers and files as they were,
 *     with one exception: a zt_step() that fails part-way through the
 *     update (a device or copy error, not a bad argument) may have written
 *     some parameters; it returns the error and the engine then refuses
 *     every step with ZT_EBROKEN. A stage-3 zt_fetch() that fails after
 *     agreeing with the other ranks (an I/O error reading the parameter
 *     shard) does the same: the ranks may no longer agree on what is
 *     gathered, so every later call is refused.
 *   - "synchronous": the work is done when the call returns.
 *     "stream-ordered": the work is enqueued after the caller's stream.
 *     "completion-based": a later call reports completion.
 *
 * This header is C99 and needs neither CUDA nor any other header of ztier.
 */
#ifndef ZTIER_H
#define ZTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ZT_API __attribute__((visibility("default")))
#else
#define ZT_API
#endif

#define ZT_VERSION_MAJOR 0
#define ZT_VERSION_MINOR 1
#define ZT_VERSION_PATCH 0
#define ZT_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * ztier's own error codes, in a range below errno values (libuv's way). Each
 * row is (name, value, what it means and what to do next). Functions also
 * return plain -errno values: -EINVAL for a bad argument, -ENOMEM when an
 * allocation or a memory budget fails, -EBUSY for a call at the wrong time.
 */
#define ZT_ERRNO_MAP(X)                                                        \
  X(ECUDA, -4001, "CUDA runtime error; zt_last_error() has the CUDA message")  \
  X(ENOGPU, -4002, "no usable GPU: the CUDA driver or device is missing; use " \
                   "backend \"host\" or run on a machine with a GPU")          \
  X(ENOCUDA, -4003, "this libztier was built without CUDA; rebuild with nvcc " \
                    "present (make CUDA=1) or use backend \"host\"")           \
  X(ECUBLAS, -4004, "cuBLAS error; zt_last_error() has the status")            \
  X(ENCCL, -4005, "NCCL error; zt_last_error() has the NCCL message")          \
  X(ECONFIG, -4006, "invalid configuration; zt_last_error() names the key")    \
  X(EJSON, -4007, "malformed JSON; zt_last_error() gives the position")        \
  X(ENOTREG, -4008, "no model is registered yet; call zt_register_flat() or "  \
                    "zt_register_units() before this")                         \
  X(ENOTSUP, -4009, "this combination is not supported by this version; "      \
                    "see docs/ for what works today")                          \
  X(ECHECKSUM, -4010, "data failed its checksum: a torn, stale or corrupt "    \
                      "block; zt_last_error() names the file and offset")      \
  X(EBROKEN, -4011, "the engine is in a failed state after an earlier error; " \
                    "load a checkpoint into it (zt_load) or re-create it")     \
  X(ECKPT, -4012, "not a checkpoint this engine can load: malformed, of "       \
                  "another model, or of an unknown format version; "           \
                  "zt_last_error() names the file and what is wrong")          \
  X(EPEER, -4013, "another rank failed or exited with its engine alive; "      \
                  "zt_last_error() names it and its error; destroy the "       \
                  "engine: its comm is unusable")

enum {
#define ZT_ERR_ENUM_(name, value, msg) ZT_##name = (value),
  ZT_ERRNO_MAP(ZT_ERR_ENUM_)
#undef ZT_ERR_ENUM_
  ZT_OK = 0
};

/* A sentence saying what `err` means and what to do next. Never NULL; works
 * for ztier's codes and for -errno values. Synchronous, thread-safe. */
ZT_API const char *zt_strerror(int err);

/* The symbolic name of `err` ("ZT_ECONFIG", "EINVAL"), or "UNKNOWN". */
ZT_API const char *zt_err_name(int err);

/* ------------------------------------------------------------------------ */
/* Types                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum zt_dtype {
  ZT_FP32 = 0,
  ZT_BF16 = 1,
  ZT_FP16 = 2
} zt_dtype_t;

typedef enum zt_backend {
  ZT_BACKEND_HOST = 0, /* "device memory" is host memory; kernels are C */
  ZT_BACKEND_CUDA = 1, /* cudaMalloc'd memory, CUDA streams and kernels  */
  ZT_BACKEND_SIM = 2   /* a GPU modelled on the CPU, for tests and
                          benchmarks, not for training (docs/gpu.md)   */
} zt_backend_t;

/* Where a model state lives between uses. */
typedef enum zt_tier {
  ZT_TIER_DEVICE = 0, /* the backend's memory                     */
  ZT_TIER_HOST = 1,   /* pinned host memory, updated by the CPU    */
  ZT_TIER_NVME = 2    /* swap files, streamed through pinned slots   */
} zt_tier_t;

typedef enum zt_optimizer {
  ZT_ADAMW = 0,  /* torch.optim.AdamW: decay applied to the old weight */
  ZT_ADAM_L2 = 1 /* torch.optim.Adam: decay added to the gradient       */
} zt_optimizer_t;

typedef enum zt_rounding {
  ZT_ROUND_NEAREST = 0,   /* round to nearest, ties to even              */
  ZT_ROUND_STOCHASTIC = 1 /* bf16 only: unbiased, seeded, reproducible  */
} zt_rounding_t;

typedef enum zt_loss_scaling {
  ZT_LOSS_SCALE_AUTO = 0,    /* dynamic for fp16 params, none otherwise  */
  ZT_LOSS_SCALE_NONE = 1,    /* the loop's loss is not scaled            */
  ZT_LOSS_SCALE_STATIC = 2,  /* a fixed scale: initial_loss_scale        */
  ZT_LOSS_SCALE_DYNAMIC = 3  /* back off on inf/nan, grow when stable    */
} zt_loss_scaling_t;

/* What a step does with inf/nan gradients (docs/api.md, "Non-finite
 * gradients"). Skipping needs the gradients' norm before the update, a pass
 * over them of its own; applying lets the update take the norm in its own
 * pass when nothing else needs it first. */
typedef enum zt_nonfinite {
  ZT_NONFINITE_SKIP = 0, /* skip such a step: nothing is written           */
  ZT_NONFINITE_APPLY = 1 /* apply it, as torch.optim.AdamW does, unless loss
                            scaling is on (then it is an overflow: skipped) */
} zt_nonfinite_t;

/* How the optimizer tier stores Adam's m and v (docs/states.md). */
typedef enum zt_states {
  ZT_STATES_FP32 = 0, /* 4 bytes each, as torch.optim.AdamW          */
  ZT_STATES_BF16 = 1, /* 2 bytes each, stochastic rounding            */
  ZT_STATES_INT8 = 2  /* 1 byte each + a scale per 256 (not yet wired) */
} zt_states_t;

/* Where a ZeRO shard's gradient sums live between the hand-over and the
 * update: fp32, or one rank's 16-bit gradients at stage 1 (docs/offload.md,
 * "The gradient sums and registration on disk"). */
typedef enum zt_grad_sums {
  ZT_GRAD_SUMS_AUTO = 0,   /* a file in swap_path at stage 3 with the nvme
                              optimizer tier, memory otherwise            */
  ZT_GRAD_SUMS_MEMORY = 1, /* pinned host memory, or the device's        */
  ZT_GRAD_SUMS_DISK = 2    /* a file in swap_path (optimizer_tier nvme)   */
} zt_grad_sums_t;

typedef enum zt_comm_kind {
  ZT_COMM_SINGLE = 0, /* world size 1, no dependency                      */
  ZT_COMM_MPI = 1,    /* MPI_COMM_WORLD of an mpirun launch; host buffers */
  ZT_COMM_NCCL = 2,   /* NCCL (backend cuda); id from MPI or a file       */
  ZT_COMM_AUTO = 3    /* mpi when launched by mpirun, else single         */
} zt_comm_kind_t;

typedef enum zt_log_level {
  ZT_LOG_ERROR = 0,
  ZT_LOG_WARN = 1,
  ZT_LOG_INFO = 2,
  ZT_LOG_DEBUG = 3
} zt_log_level_t;

typedef void (*zt_log_fn)(void *user, zt_log_level_t level, const char *msg);

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

#define ZT_CONFIG_VERSION 1u

/*
 * Everything an engine is created with. Fill it with zt_config_init() or
 * ZT_CONFIG_INIT (the defaults), then set fields in code, or load a JSON
 * file over it with zt_config_load(). The JSON keys are the field names
 * below; enums are strings ("host", "bf16", "stochastic"). docs/config.md
 * lists every key with its range.
 *
 * `size` lets later versions add fields at the end (docs/api.md, "ABI and
 * versions"), as for every struct here that has one: a library reads and
 * writes only the caller's `size` bytes, gives the fields a smaller
 * (older) struct lacks their defaults, and accepts a larger (newer) one
 * only when the bytes it does not know are zero (-E2BIG otherwise).
 */
typedef struct zt_config {
  size_t size;      /* sizeof(zt_config_t), set by ZT_CONFIG_INIT       */
  unsigned version; /* ZT_CONFIG_VERSION, set by ZT_CONFIG_INIT         */

  zt_backend_t backend; /* "host" | "cuda" | "sim"             */
  int device;           /* CUDA device ordinal; -1 = local rank */
  int stage;            /* ZeRO stage 0..3                     */
  zt_comm_kind_t comm;  /* "auto" | "single" | "mpi" | "nccl"  */

  zt_optimizer_t optimizer;  /* "adamw" | "adam"                   */
  zt_tier_t optimizer_tier;  /* "device" | "host" | "nvme"         */
  zt_tier_t param_tier;      /* "device" | "host" | "nvme" (stage 3) */
  zt_rounding_t rounding;    /* "nearest" | "stochastic"           */
  uint64_t seed;             /* stochastic rounding seed           */
  int threads;               /* CPU optimizer threads; 0 = all CPUs (shared
                                with the node's other ranks, docs/config.md) */

  double clip_grad_norm; /* clip by global norm when > 0; 0 = off     */

  zt_loss_scaling_t loss_scaling; /* "auto" | "none" | "static" | "dynamic" */
  double initial_loss_scale;      /* > 0; default 65536                   */
  double loss_scale_growth;       /* > 1; default 2                       */
  double loss_scale_backoff;      /* in (0, 1); default 0.5               */
  int loss_scale_window;          /* good steps before growing; >= 1      */
  double min_loss_scale;          /* > 0, <= initial_loss_scale           */

  size_t chunk_bytes;         /* staging chunk for the host tier     */
  size_t device_budget_bytes; /* 0 = no limit                        */
  size_t pinned_budget_bytes; /* 0 = no limit                        */

  zt_log_level_t log_level; /* messages above this level are dropped */
  zt_log_fn log_fn;         /* NULL = silent; not settable from JSON */
  void *log_user;           /* passed to log_fn                      */

  size_t bucket_bytes; /* gradient reduce / parameter gather piece        */

  /* The swap space of the nvme tier. */
  char swap_path[1024];    /* directories, ':'-separated; one file in each  */
  size_t swap_block_bytes; /* bytes per swap I/O request                    */
  int swap_queue_depth;    /* requests in flight per ring                   */
  int swap_rings;          /* io_uring rings; above 1, a thread each        */
  int swap_sqpoll;         /* 1: kernel submission threads (SQPOLL)         */

  int numa_node; /* pinned memory's NUMA node; -1: the GPU's, or none   */

  /* comm "nccl" without MPI: rank 0 writes NCCL's unique id to a file that
   * every rank can read, the others wait for it. Empty: the id comes from
   * MPI (an mpirun launch), or a lone process is world size 1. */
  char nccl_id_file[1024];  /* the id file's path; "" = no file bootstrap  */
  int rank;                 /* this rank with nccl_id_file; -1 = unset     */
  int world_size;           /* ranks with nccl_id_file; 0 = unset          */
  double nccl_id_timeout_s; /* how long a rank waits for the id file       */

  /* Stage 3's prefetch scheduler (docs/offload.md). */
  size_t prefetch_bytes; /* reads ahead in flight or landed, at most        */
  /* Gathered parameters ztier keeps, at most. Stage 3's gathered-groups
   * pool is reserved from it at registration: slots that share this one
   * budget, plus one slot of the largest group where a group exceeds it,
   * plus at most a slot per size class beyond it (zt_stats' pool_bytes). */
  size_t max_live_bytes;
  size_t stage_min_bytes; /* smallest part of a group staged ahead          */

  /* How long a rank waits in a collective for its peers before the call
   * fails with -ETIMEDOUT naming the ranks that did not come (docs/stages.md,
   * "When a rank fails"). */
  double comm_timeout_s; /* seconds; default 300                          */

  zt_nonfinite_t nonfinite; /* "skip" | "apply": steps with inf/nan gradients */

  /* Stage 3, host backend: zt_fetch() gathers each group into its own
   * place in the registered parameter buffer, and the pages of a group's
   * parameters (and, once handed over, its gradients) are given back to
   * the system when it is released, so a flat loop keeps its pointers
   * and holds only the groups in use (docs/stages.md, "Stage 3 in
   * place"). 0: stage 3 gathers into buffers of its own. */
  int params_in_place;

  zt_states_t optimizer_states; /* "fp32" | "bf16": how m and v are stored */

  zt_grad_sums_t grad_sums; /* "auto" | "memory" | "disk": the shard's sums */

  /* 1: the loop hands each group's gradients over at most once between two
   * steps (no accumulation over micro-steps), and at stages 2 and 3 a second
   * zt_grads_ready() of a group before the step (or after zt_grad_norm(),
   * which hands every group over) is refused; one rank with 16-bit gradients
   * then keeps them in its shard as they are at stages 2 and 3 too, as at
   * stage 1, with no fp32 sums (docs/design.md). 0 (the default): any
   * number of hand-overs, summed in fp32. */
  int grads_once;

  /* 1 (with grads_once 1): the loop leaves each handed-over group's
   * gradients in its registered buffer, untouched, until a zt_step() that
   * takes the step (applied or skipped; not one refused), a zt_load() or a
   * zt_import_safetensors() returns, and writes them next on the stream it gave zt_set_stream().
   * One rank at stage 2 or 3 with 16-bit gradients, the device tier and a
   * buffer of units end to end then reads them there at the step, as stage
   * 1 does, instead of copying them out at the hand-over, and zeroes them
   * after the step on that stream (docs/design.md). No effect otherwise
   * (nor with params_in_place, which gives their pages back at the
   * hand-over). 0 (the default): a hand-over at stages 2 and 3 copies them
   * out and zeroes them. */
  int grads_in_place;
} zt_config_t;

/* The defaults. Every engine field has a working default. The macro puts
 * this header's defaults into the program; zt_config_init() takes the
 * library's, so a program built against an older header gets the defaults
 * of the library it runs with. */
#define ZT_CONFIG_INIT                                                       \
  {                                                                          \
    sizeof(zt_config_t), ZT_CONFIG_VERSION, ZT_BACKEND_HOST, -1, 0,          \
        ZT_COMM_AUTO, ZT_ADAMW, ZT_TIER_DEVICE, ZT_TIER_DEVICE,            \
        ZT_ROUND_NEAREST, 0x5eed, 0, 0.0, ZT_LOSS_SCALE_AUTO, 65536.0, 2.0,  \
        0.5, 2000, 1.0, (size_t)16 << 20, 0, 0, ZT_LOG_WARN, NULL, NULL,     \
        (size_t)16 << 20, "", (size_t)8 << 20, 32, 2, 0, -1, "", -1, 0,      \
        300.0, (size_t)64 << 20, (size_t)1 << 30, (size_t)1 << 20, 300.0,    \
        ZT_NONFINITE_SKIP, 0, ZT_STATES_FP32, ZT_GRAD_SUMS_AUTO, 0, 0        \
  }

/*
 * Fills the `size` bytes at `cfg` with the library's defaults (what
 * ZT_CONFIG_INIT gives), cfg->size = size; bytes past the library's own
 * struct are zeroed. Returns 0, or -EINVAL for a NULL cfg or a size below
 * ztier 0.1's sizeof(zt_config_t). Synchronous; the caller owns `cfg`.
 * Call it as zt_config_init(cfg), which passes sizeof(zt_config_t) of the
 * header the program was built with.
 */
ZT_API int zt_config_init_size(zt_config_t *cfg, size_t size);
static inline int zt_config_init(zt_config_t *cfg) {
  return zt_config_init_size(cfg, sizeof(zt_config_t));
}

/*
 * Loads the JSON object in the file at `path` over `cfg`: keys present in the
 * file replace the fields, the others keep their values. Unknown keys, values
 * of the wrong type, out-of-range values and inconsistent combinations are
 * errors (ZT_ECONFIG, ZT_EJSON); on error `cfg` is left unchanged.
 * A DeepSpeed config (ds_config.json: a top-level "zero_optimization",
 * "train_batch_size", "train_micro_batch_size_per_gpu" or
 * "gradient_accumulation_steps") is read as the ztier keys it maps to; its
 * training-loop keys are ignored, each named at info level to log_fn, and a
 * key ztier cannot honour is an error naming it (docs/config.md, "DeepSpeed
 * configs"). Returns 0 or a negative code; zt_last_error(NULL) has the
 * sentence. Synchronous.
 */
ZT_API int zt_config_load(zt_config_t *cfg, const char *path);

/* Same as zt_config_load(), from a NUL-terminated JSON string. */
ZT_API int zt_config_parse(zt_config_t *cfg, const char *json);

/*
 * Sets one key from its text form, as on a command line: ("optimizer_tier",
 * "host"), ("threads", "2"). The key's own checks are the JSON loader's
 * (type, range, names); the rules between keys (param_tier "host" needs
 * stage 3, a pinned budget against the tier) are not checked here, so keys
 * can be set in any order: zt_config_validate() and zt_engine_create()
 * check them on the whole config. On error `cfg` is unchanged.
 */
ZT_API int zt_config_set(zt_config_t *cfg, const char *key, const char *value);

/*
 * Checks every field and the rules between keys. Returns 0 or ZT_ECONFIG
 * with zt_last_error(NULL) naming the key (both keys, for a rule between
 * two), the value and what was expected. zt_engine_create() runs it first.
 */
ZT_API int zt_config_validate(const zt_config_t *cfg);

/*
 * Writes `cfg` as a JSON object into `buf` (at most `len` bytes, NUL
 * included). Returns the length the full text needs, without the NUL, as
 * snprintf does; a result >= len means it was cut.
 */
ZT_API int zt_config_to_json(const zt_config_t *cfg, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct zt_engine zt_engine_t;

/*
 * Creates an engine: the backend (host or CUDA device), its streams, the
 * comm, the optimizer threads. The config is validated and copied.
 * On success *out is the engine; on failure *out = NULL, nothing is left to
 * clean up, and zt_last_error(NULL) says why. Synchronous.
 */
ZT_API int zt_engine_create(const zt_config_t *cfg, zt_engine_t **out);

/*
 * Frees everything the engine holds: optimizer states in every tier, streams,
 * threads. The user's buffers are not touched. zt_engine_destroy(NULL) does
 * nothing. Synchronous: waits for the engine's own work in flight.
 */
ZT_API void zt_engine_destroy(zt_engine_t *eng);

/*
 * The loop's compute stream (a cudaStream_t with backend "cuda"; NULL, the
 * default, is the legacy default stream there, and the only value backend
 * "host" takes). ztier orders its work after what the loop enqueued on it
 * before each call, and the loop's later work on it after what ztier's
 * call hands back (gradients read, parameters written). Changeable between
 * calls; what the previous stream holds is waited for first.
 */
ZT_API int zt_set_stream(zt_engine_t *eng, void *stream);

/*
 * The sentence describing the last failure of a call on `eng`: which
 * argument, its value, what was expected. With eng = NULL, the last failure
 * in this thread of a call that has no engine (config, engine create).
 * Returns "" when there was none. The string is owned by ztier and valid
 * until the next failing call on the same engine (or thread).
 */
ZT_API const char *zt_last_error(const zt_engine_t *eng);

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

/*
 * A unit: the smallest thing ztier moves. `offset` and `numel` count
 * elements of the registered buffers. `group` is what a loop fetches and
 * releases together (used from ZeRO stage 3 on; any value >= 0 here).
 * `dtype` must equal the registered parameter dtype. Units must not
 * overlap; elements that no unit covers are left untouched by zt_step()
 * (frozen).
 */
typedef struct zt_unit {
  const char *name;  /* copied; unique, not ""; NULL: "unit<i>"    */
  size_t offset;     /* first element                              */
  size_t numel;      /* > 0                                        */
  int group;         /* >= 0                                       */
  int weight_decay;  /* 1: weight_decay applies; 0: it does not    */
  zt_dtype_t dtype;  /* the parameter dtype                        */
} zt_unit_t;

/*
 * Registers one flat parameter buffer and its gradient buffer, `numel`
 * elements each, as one unit with weight decay: the unit "params", in group
 * 0, the group to name to zt_fetch(), zt_grads() and zt_grads_ready(). At
 * stages 0 to 2 a flat loop may call none of them: zt_step() hands group 0
 * over itself (docs/stages.md, "A flat loop at stage 2"). Both buffers live
 * in the backend's memory (host memory for the host backend, device memory
 * for CUDA) and stay owned by the caller; zt_step() updates `params` in
 * place and reads `grads`. `grad_dtype` may differ from `param_dtype` (e.g.
 * bf16 params with fp32 grads). The fp32 master weights are initialised
 * from `params` now. May be called lazily, e.g. inside the loop's first
 * update after its first backward; calling it twice gives -EBUSY.
 * Buffers must be aligned to their element size. Synchronous.
 */
ZT_API int zt_register_flat(zt_engine_t *eng, void *params, void *grads,
                            size_t numel, zt_dtype_t param_dtype,
                            zt_dtype_t grad_dtype);

/*
 * Same as zt_register_flat(), with a table of `n_units` units describing the
 * buffers. The table is copied. Per-unit weight-decay flags and groups come
 * from it. Synchronous.
 */
ZT_API int zt_register_units(zt_engine_t *eng, void *params, void *grads,
                             size_t numel, zt_dtype_t param_dtype,
                             zt_dtype_t grad_dtype, const zt_unit_t *units,
                             size_t n_units);

/* Dimensions a unit's shape may have. */
#define ZT_MAX_DIMS 8

/*
 * Gives the registered unit `unit` (its name) a shape: `ndim` dimensions,
 * 1 to ZT_MAX_DIMS, each >= 1, row-major, whose product is the unit's
 * numel; e.g. {768, 2304} for GPT-2's h.0.attn.c_attn.weight. Shapes change
 * nothing in training. Exports (zt_export_safetensors, `ztier ckpt
 * consolidate`) write each unit as a tensor of its shape, and a unit given
 * none as one of shape [numel]. zt_save keeps them in the checkpoint, and
 * zt_load gives a unit the checkpoint's shape where it has none (a shape
 * set here that differs from the checkpoint's is ZT_ECKPT). Any time after
 * registration, again to change it; local (no collective): with several
 * ranks, rank 0's shapes are the ones saved. Synchronous.
 */
ZT_API int zt_set_shape(zt_engine_t *eng, const char *unit, int ndim,
                        const size_t *dims);

/* ------------------------------------------------------------------------ */
/* The optimizer step                                                        */
/* ------------------------------------------------------------------------ */

/* Per-step inputs. Fill with zt_step_args_init() or ZT_STEP_ARGS_INIT, then
 * set what changes. `size` as in zt_config_t: an older, smaller struct gets
 * the defaults for what it lacks; a larger one needs zeros past what the
 * library knows. */
typedef struct zt_step_args {
  size_t size;         /* sizeof(zt_step_args_t)                          */
  float lr;            /* >= 0, finite                                    */
  float beta1;         /* in [0, 1)                                       */
  float beta2;         /* in [0, 1)                                       */
  float eps;           /* > 0, finite                                     */
  float weight_decay;  /* >= 0, finite                                    */
  uint64_t t;          /* step number, 1-based, for bias correction       */
  float grad_scale;    /* > 0: gradients are multiplied by it (the loop's
                          own clipping or averaging); default 1           */
  float clip_grad_norm; /* > 0: clip to this global norm; 0: none;
                           < 0 (default): the config's clip_grad_norm     */
} zt_step_args_t;

#define ZT_STEP_ARGS_INIT                                                    \
  { sizeof(zt_step_args_t), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f, -1.0f }

/* Fills the `size` bytes at `args` with the library's defaults (those of
 * ZT_STEP_ARGS_INIT), args->size = size, zeros past the library's struct.
 * 0, or -EINVAL for a NULL args or a size below ztier 0.1's. Synchronous;
 * the caller owns `args`. Call it as zt_step_args_init(args). */
ZT_API int zt_step_args_init_size(zt_step_args_t *args, size_t size);
static inline int zt_step_args_init(zt_step_args_t *args) {
  return zt_step_args_init_size(args, sizeof(zt_step_args_t));
}

/* What a step did. The library writes only the caller's `size` bytes (a
 * larger struct's unknown tail must be zero, and stays so). */
typedef struct zt_step_info {
  size_t size;       /* sizeof(zt_step_info_t), set by the caller          */
  double grad_norm;  /* global L2 norm of the gradients after unscaling
                        and grad_scale, before clipping; inf/nan on
                        overflow                                           */
  double clip_coef;  /* the factor clipping applied (1 when none)         */
  int skipped;       /* 1: inf/nan in the gradients, nothing was updated  */
  double loss_scale; /* the scale to multiply the next loss by            */
} zt_step_info_t;

#define ZT_STEP_INFO_INIT { sizeof(zt_step_info_t), 0.0, 1.0, 0, 1.0 }

/*
 * One optimizer step over every registered unit: reads the gradients,
 * unscales them (dynamic or static loss scale) and applies args->grad_scale,
 * computes the global norm, checks for inf/nan (then skips the whole step,
 * backs the loss scale off, and returns 0 with info->skipped = 1; with
 * config "nonfinite" "apply" and no loss scaling, the step is applied),
 * clips, runs AdamW (or Adam with L2) on the fp32 master weights and
 * moments in their tier, and writes the parameters back into the registered
 * buffer in place, cast to its dtype. When nothing needs the norm before the
 * update ("nonfinite" "apply", no loss scaling, no clipping, stage 0), the
 * host backend's device tier takes it in the update's own pass: the
 * gradients are read once. `info` may be NULL; otherwise info->size is
 * sizeof(zt_step_info_t) (use ZT_STEP_INFO_INIT), as the program's header
 * has it; the library fills info only when the step returns 0.
 * On the host backend the parameters are updated when it returns. On a GPU
 * backend (cuda, sim) their update is ordered on the loop's stream
 * (zt_set_stream): the loop's work enqueued on that stream afterwards sees
 * them, and the host or another stream sees them once that stream is
 * synchronized (docs/design.md, "The data path on a GPU").
 * On a bad argument nothing is read or written.
 */
ZT_API int zt_step(zt_engine_t *eng, const zt_step_args_t *args,
                   zt_step_info_t *info);

/*
 * The global L2 norm of the registered gradients as zt_step() would see them
 * now (unscaled by the loss scale, times `grad_scale`), without stepping.
 * For loops that clip themselves. inf/nan when a gradient is. Synchronous.
 * At stages 1 to 3 the norm needs the gradients summed over ranks, so this
 * hands every group's gradients over to their owners, as zt_step() would:
 * call it after the last micro-step's backward, just before zt_step(),
 * and leave the gradient buffer alone in between: gradients changed there
 * are not seen by a step that has them handed over (stage 1 cannot tell
 * that they changed), while stage 0, and one rank at stage 1 whose
 * gradients are read where the loop wrote them (docs/design.md), read the
 * buffer again at the step, norm included.
 */
ZT_API int zt_grad_norm(zt_engine_t *eng, float grad_scale, double *norm);

/*
 * Data parallelism (config `stage` >= 1 over several ranks, e.g. launched
 * with `mpirun -np N`): every rank computes gradients on its own micro-batch
 * into its registered gradient buffer; zt_step() averages them over ranks,
 * each rank updates the shard of the optimizer states it owns, and every
 * rank's parameter buffer receives every shard's update. Every rank must
 * register the same model and call zt_step() (and zt_grads_ready(), in the
 * same order) alike, as with any collective.
 *
 * zt_grads_ready() says that group `group`'s gradients are final for this
 * backward. At stage 2 ztier hands them to their owners at once, while the
 * backward goes on, adds them to the owners' sums, and zeroes them in the
 * caller's gradient buffer (so a backward that accumulates with += starts
 * the next micro-step from zero; call it again for gradients the group
 * receives later, e.g. tied weights used twice). Gradients of a group not
 * marked since the last zt_step() are handed over by zt_step() itself; so
 * gradient accumulation over micro-steps is: backward, zt_grads_ready()
 * per group, ..., and zt_step() at the boundary. At stages 0 and 1 it only
 * checks `group` (stage 1 reduces at the step, from the caller's buffer,
 * which it leaves as it is). Asynchronous: returns once the gradients are
 * copied out of the caller's buffer (with config grads_in_place the loop
 * leaves them there until the step instead, which may read them there and
 * zero them after). -EINVAL for a group no unit has, and
 * at stages 2 and 3 under config grads_once for a group handed over already
 * since the last zt_step(), zt_grad_norm() included, which hands every
 * group over (refused alike on every rank, nothing moved; the engine goes
 * on; gradients of the group's own buffer from zt_grads() are dropped at
 * the step).
 */
ZT_API int zt_grads_ready(zt_engine_t *eng, int group);

/*
 * Fetch, release, gradients: the calls that bracket a group's use, so that
 * one loop runs at every stage. `ptrs` receives one pointer per unit of the
 * group, in the order of the unit table; `n_units` is its room. Each returns
 * the group's unit count, or a negative code (-EINVAL for an unknown group
 * or too small a table).
 *
 * zt_fetch(): the group's parameters. Stages 0-2: pointers into the
 * registered buffer (the step updates it in place). Stage 3: every rank's
 * shards of the group gathered into a buffer ztier owns, valid until the
 * matching zt_release() (fetching a fetched group again returns the same
 * buffer and needs one more release). A collective at stage 3: every rank
 * fetches the same groups in the same order. It returns with the group
 * gathered; the prefetch scheduler reads the next groups ahead and keeps
 * groups used again soon (config prefetch_bytes, max_live_bytes).
 * zt_step() at stage 3 refuses (-EBUSY) while any group is fetched.
 *
 * zt_grads(): where the backward writes (accumulates) the group's
 * gradients: into the registered gradient buffer when there is one; at
 * stages 2 and 3 without one (grads NULL at registration), a zeroed buffer
 * ztier owns, handed to its owners and freed by zt_grads_ready().
 */
ZT_API int zt_fetch(zt_engine_t *eng, int group, void **ptrs, size_t n_units);
ZT_API int zt_release(zt_engine_t *eng, int group);
ZT_API int zt_grads(zt_engine_t *eng, int group, void **ptrs, size_t n_units);

/*
 * The loss scale the loop should multiply its next loss by (1 when loss
 * scaling is off, and before registration). The next zt_step() and
 * zt_grad_norm() unscale the gradients by the value this call returned last
 * (1 if it was never called), so call it for every backward whose loss you
 * scale. Synchronous.
 */
ZT_API double zt_loss_scale(zt_engine_t *eng);

/* ------------------------------------------------------------------------ */
/* Checkpoints (docs/checkpoints.md)                                         */
/* ------------------------------------------------------------------------ */

/*
 * Saves the model's states into directory `dir` (created if missing): every
 * rank writes the states it holds (fp32 master weights, Adam moments, the
 * parameters when not fp32) straight from their tier, NVMe ones streamed,
 * and rank 0 commits them with a manifest (JSON) naming every file with its
 * size and checksum, plus the step count, the loss scaler and the rounding
 * seed. Crash-safe: files go to temporary names, are fsynced and renamed,
 * and the manifest's rename is the commit, so a crash at any point leaves
 * the previous checkpoint in `dir` loadable; older files are removed after.
 * `dir` must be one directory shared by all ranks (checked: -EXDEV on every
 * rank otherwise, nothing committed); one save at a time into it (a lock
 * file: -EBUSY naming the holder's pid and host).
 * Collective: every rank calls it, between a zt_step() and the next
 * forward (no group fetched). Gradients are not saved. Synchronous; the
 * same result on every rank.
 */
ZT_API int zt_save(zt_engine_t *eng, const char *dir);

/*
 * Loads a checkpoint that zt_save() wrote for this model (the same unit
 * table and parameter dtype), saved with any number of ranks and any stage:
 * each rank reads the states of its own shard. Before any state changes,
 * every rank checks the manifest and the size and checksum of every file it
 * reads; a bad checkpoint gives ZT_ECKPT or ZT_ECHECKSUM naming the file,
 * with nothing loaded. The parameters are written into the registered
 * buffer (stages 0-2) or the shards (stage 3); gradients handed over since
 * the last step are dropped. An I/O error part-way leaves the engine broken
 * (ZT_EBROKEN) until a load succeeds; a successful load also clears an
 * earlier failure. Collective, synchronous.
 */
ZT_API int zt_load(zt_engine_t *eng, const char *dir);

/* How zt_export_safetensors() and zt_export_engine() write. */
typedef struct zt_export_args {
  size_t size;              /* sizeof(zt_export_args_t): ZT_EXPORT_ARGS_INIT */
  zt_dtype_t dtype;         /* ZT_FP32 (the master weights) or ZT_BF16
                               (rounded to nearest even)                   */
  uint64_t max_shard_bytes; /* 0: one file `out`; else Hugging Face's
                               shards of at most this many tensor bytes
                               and model.safetensors.index.json, in the
                               directory `out`                             */
  int force;                /* 1: replace what exists at `out`             */
} zt_export_args_t;

#define ZT_EXPORT_ARGS_INIT { sizeof(zt_export_args_t), ZT_FP32, 0, 0 }

/*
 * Writes the checkpoint that zt_save() committed in `dir` as safetensors,
 * the format the Hugging Face tools load: one tensor per unit, named as
 * registered, in unit order (`ztier ckpt consolidate` does the same). Every
 * rank file is verified first; each output file is written whole under a
 * temporary name, fsynced and renamed (shards first, the index last), so a
 * failure leaves no partial file under an output name. Memory stays at a
 * piece of a million elements whatever the model's size. An existing
 * output is refused (-EEXIST) unless args->force; a file the checkpoint
 * itself uses, always. Needs no engine: call it from any process, while
 * no save writes into `dir`. Returns 0 or a negative code;
 * zt_last_error(NULL) has the sentence. Synchronous.
 */
ZT_API int zt_export_safetensors(const char *dir, const char *out, const zt_export_args_t *args);

/*
 * Writes the engine's current weights as zt_export_safetensors() writes a
 * checkpoint's (the same files for the same weights, but for the metadata:
 * no ztier_generation), with no checkpoint in between: each unit's fp32
 * master read where the engine keeps it (device, pinned host memory or
 * swap files), a piece of 2^18 elements at a time, so memory
 * stays bounded whatever the model's size. Collective: every rank calls it
 * with the same arguments, between a zt_step() and the next forward (no
 * group fetched); each sends its shard to rank 0, which alone writes `out`
 * (a path rank 0 sees). Every rank returns the same: 0, or the first
 * failing rank's code (a bad argument on one rank included), with a
 * sentence in zt_last_error(eng). Synchronous.
 */
ZT_API int zt_export_engine(zt_engine_t *eng, const char *out, const zt_export_args_t *args);

/*
 * Reads weights from safetensors into the registered model: `path` is a
 * file, or a directory holding Hugging Face's model.safetensors.index.json
 * and its shards (or a model.safetensors). Each unit takes the tensor of
 * its name (F32, BF16 or F16; as many elements; the shape zt_set_shape()
 * gave it, where it gave one, else the unit takes the tensor's): its fp32
 * master and its parameters (rounded to nearest into the parameter dtype).
 * The moments m and v start from zero; the step count, the loss scale and
 * the loop's step numbers are the loop's to keep. Tensors no unit names
 * are left alone; as zt_load(), gradients handed over since the last step
 * are dropped. Nothing changes unless every rank found every unit
 * (ZT_ECKPT naming the file and tensor otherwise); a read that fails after
 * that leaves the engine broken, as zt_load() does. Collective: every rank
 * calls it and reads the files itself, between a zt_step() and the next
 * forward; memory stays a piece of 2^18 elements. Synchronous.
 */
ZT_API int zt_import_safetensors(zt_engine_t *eng, const char *path);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

/* (The tag differs from the function's name so C++ sees no shadowing.) */
typedef struct zt_stats_data {
  size_t size; /* sizeof(zt_stats_t), set by the caller */

  /* Bytes ztier holds now, per tier (its own allocations, not the user's). */
  uint64_t device_bytes; /* backend memory                               */
  uint64_t host_bytes;   /* pinned host memory                           */
  uint64_t nvme_bytes;   /* swap files                                   */
  uint64_t host_locked;  /* 1 when the pinned memory is mlock'ed          */

  /* Bytes copied between tiers since the engine was created. */
  uint64_t d2h_bytes;
  uint64_t h2d_bytes;

  /* Steps. */
  uint64_t steps;         /* zt_step() calls that updated              */
  uint64_t skipped_steps; /* zt_step() calls skipped on inf/nan        */

  /* Seconds since the engine was created, all steps together. */
  double step_seconds;      /* wall time inside zt_step()                */
  double optimizer_seconds; /* the AdamW update itself                   */
  double norm_seconds;      /* gradient norm and overflow check          */
  double copy_seconds;      /* waiting for copies between tiers          */

  uint64_t params;          /* registered elements updated by a step     */
  int threads;              /* CPU optimizer threads in use              */
  const char *cpu_isa;      /* "avx512", "avx2" or "scalar"              */

  /* Data parallelism. */
  int rank;                     /* this rank, 0-based                      */
  int world;                    /* ranks                                   */
  uint64_t shard_params;        /* elements whose optimizer states this
                                   rank owns (= params unpartitioned)      */
  uint64_t comm_bytes_sent;     /* bytes this rank sent to other ranks     */
  uint64_t comm_bytes_received; /* bytes it received from them             */

  int host_numa_node;   /* NUMA node of the pinned pool; -1: not placed  */
  const char *warnings; /* what did not go as asked (memory not locked,
                           not NUMA-placed), "" when all did; owned by
                           the engine, valid until it is destroyed       */

  /* The nvme tiers, since the engine was created. */
  uint64_t swap_read_bytes;  /* optimizer states read from swap files    */
  uint64_t swap_write_bytes; /* optimizer states written to them         */
  double swap_wait_seconds;  /* steps waiting for those reads and writes */
  uint64_t param_read_bytes;  /* param_tier nvme: parameters read         */
  uint64_t param_write_bytes; /* and written back by steps                */

  /* Stage 3's fetches and the prefetch scheduler. */
  uint64_t fetches;          /* zt_fetch() calls                          */
  uint64_t fetch_gathers;    /* of them, those that gathered a group      */
  uint64_t fetch_read_ahead; /* of those, with their read done ahead      */
  uint64_t fetch_kept;       /* fetches of a group kept since its release */
  uint64_t trace_changes;    /* fetch orders that differed from the trace */
  double fetch_stall_seconds; /* time spent inside zt_fetch()             */
  uint64_t live_bytes;       /* gathered parameters held now, with the
                                buffers kept for reuse (in device_bytes)  */
  uint64_t peak_live_bytes;  /* the most held at once                     */
  uint64_t read_ahead_bytes; /* pinned memory of parameter reads ahead
                                now, with the buffers kept for reuse (in
                                host_bytes)                               */
  uint64_t fetch_staged;     /* gathers whose own part was staged ahead
                                (copied beside the loop, prefetch.h)      */

  /* Calls that blocked the host on the device since the engine was
   * created: event and stream syncs, synchronous reductions, frees of
   * device memory (docs/design.md, "Sync points", says where a step has
   * them). */
  uint64_t host_syncs;

  /* Stages 2 and 3 without a registered gradient buffer: the groups'
   * engine-owned gradient buffers held now, with those kept for the next
   * backward (in device_bytes; at most what `ztier plan` says). */
  uint64_t grad_buffer_bytes;

  /* Stages 2 and 3: the device pools reserved at registration for the
   * gathered groups (a class of slots per range of group sizes, sharing
   * one budget of max_live_bytes from the largest class down: at most
   * max_live_bytes, plus one slot of the largest group where it exceeds
   * max_live_bytes, plus at most one slot a class beyond it) and the
   * engine-owned gradients (slots of the largest group's), as `ztier plan`
   * sizes them for groups of one size (in device_bytes; live_bytes and
   * grad_buffer_bytes are held in them), and the buffers they could not
   * hold, allocated one by one instead since the engine was created (0 for
   * a loop that holds one group's gradients at a time and fetches groups
   * of one size within max_live_bytes; a mix of sizes may take more of a
   * smaller class than the budget left it slots for, and miss). */
  uint64_t pool_bytes;
  uint64_t pool_misses;
} zt_stats_t;

#define ZT_STATS_INIT                                                        \
  { sizeof(zt_stats_t), 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, NULL, \
    0, 1, 0, 0, 0, -1, NULL, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* Fills *out: the caller's out->size bytes of it (sizeof(zt_stats_t) as the
 * program's header has it: use ZT_STATS_INIT; a larger struct's unknown
 * tail must be zero, and stays so). Synchronous. */
ZT_API int zt_stats(const zt_engine_t *eng, zt_stats_t *out);

/* The version string, "0.1.0". */
ZT_API const char *zt_version(void);

#ifdef __cplusplus
}
#endif

#endif /* ZTIER_H */

/*
 * export.c — zt_export_safetensors() and zt_export_engine(): the public
 * faces of the exports (a checkpoint's, consolidate.c; a live engine's,
 * export_live.c), their arguments checked as every entry point checks
 * them (abi.h's size rule, a sentence naming the argument).
 */
#include <string.h>

#include "base/abi.h"      // defines: zt__abi_size, ZT__SIZE_UPTO
#include "ckpt/ckpt.h"     // defines: zt__ckpt_consolidate*, zt__ckpt_export_engine
#include "engine/engine.h" // defines: zt__engine_check, struct zt_engine

#define ZT__EXPORT_ARGS_SIZE_0_2 ZT__SIZE_UPTO(zt_export_args_t, force)

/* `out` and *user into *a (the defaults for what an older struct lacks). */
static int check_args(zt__err_t *e, const char *fn, const char *out,
                      const zt_export_args_t *user, zt_export_args_t *a) {
  if (out == NULL)
    return zt__errf(e, -EINVAL, "%s: out is NULL; expected the file (or, with "
                                "max_shard_bytes, the directory) to write", fn);
  if (user == NULL)
    return zt__errf(e, -EINVAL, "%s: args is NULL; expected ZT_EXPORT_ARGS_INIT", fn);
  size_t have;
  ZT_TRY(zt__abi_size(e, fn, "args", "zt_export_args_t", user, user->size,
                      ZT__EXPORT_ARGS_SIZE_0_2, sizeof(zt_export_args_t), "ZT_EXPORT_ARGS_INIT",
                      &have));
  *a = (zt_export_args_t)ZT_EXPORT_ARGS_INIT;
  memcpy(a, user, have);
  if (a->dtype != ZT_FP32 && a->dtype != ZT_BF16)
    return zt__errf(e, -EINVAL, "%s: args->dtype is %d; expected ZT_FP32 or ZT_BF16", fn,
                    (int)a->dtype);
  if (a->force != 0 && a->force != 1)
    return zt__errf(e, -EINVAL, "%s: args->force is %d; expected 0 or 1", fn, a->force);
  return 0;
}

int zt_export_safetensors(const char *dir, const char *out, const zt_export_args_t *user) {
  static const char *fn = "zt_export_safetensors";
  zt__err_t *e = zt__err_thread();
  if (dir == NULL)
    return zt__errf(e, -EINVAL, "%s: dir is NULL; expected the checkpoint's directory", fn);
  zt_export_args_t a;
  ZT_TRY(check_args(e, fn, out, user, &a));
  uint64_t size;
  if (a.max_shard_bytes == 0)
    return zt__ckpt_consolidate(dir, out, a.dtype, a.force, NULL, &size, e);
  size_t n_shards;
  return zt__ckpt_consolidate_shards(dir, out, a.dtype, a.max_shard_bytes, a.force, NULL,
                                     &n_shards, &size, e);
}

int zt_export_engine(zt_engine_t *eng, const char *out, const zt_export_args_t *user) {
  static const char *fn = "zt_export_engine";
  ZT_TRY(zt__engine_check(eng, fn));
  /* A refusal here is this rank's; the export makes every rank return it
   * rather than leave them waiting for this one. */
  zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
  int local = check_args(&eng->err, fn, out, user, &a);
  for (size_t g = 0; local == 0 && eng->partitioned && g < eng->zero.part.n_groups; g++)
    if (eng->zero.part.groups[g].fetched)
      local = zt__errf(&eng->err, -EBUSY, "%s: group %d is fetched; release every group "
                       "first (export between zt_step() and the next forward)", fn,
                       eng->zero.part.groups[g].id);
  return zt__ckpt_export_engine(eng, local, out, a.dtype, a.max_shard_bytes, a.force);
}

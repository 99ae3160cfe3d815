/*
 * export.c — zt_export_safetensors(): the public face of consolidate.c's
 * writers, its arguments checked as every entry point checks them (abi.h's
 * size rule, a sentence naming the argument).
 */
#include <string.h>

#include "base/abi.h" // defines: zt__abi_size, ZT__SIZE_UPTO
#include "ckpt/ckpt.h" // defines: zt__ckpt_consolidate, zt__ckpt_consolidate_shards

#define ZT__EXPORT_ARGS_SIZE_0_2 ZT__SIZE_UPTO(zt_export_args_t, force)

int zt_export_safetensors(const char *dir, const char *out, const zt_export_args_t *user) {
  static const char *fn = "zt_export_safetensors";
  zt__err_t *e = zt__err_thread();
  if (dir == NULL)
    return zt__errf(e, -EINVAL, "%s: dir is NULL; expected the checkpoint's directory", fn);
  if (out == NULL)
    return zt__errf(e, -EINVAL, "%s: out is NULL; expected the file (or, with "
                                "max_shard_bytes, the directory) to write", fn);
  if (user == NULL)
    return zt__errf(e, -EINVAL, "%s: args is NULL; expected ZT_EXPORT_ARGS_INIT", fn);
  size_t have;
  ZT_TRY(zt__abi_size(e, fn, "args", "zt_export_args_t", user, user->size,
                      ZT__EXPORT_ARGS_SIZE_0_2, sizeof(zt_export_args_t), "ZT_EXPORT_ARGS_INIT",
                      &have));
  zt_export_args_t a = ZT_EXPORT_ARGS_INIT;
  memcpy(&a, user, have);
  if (a.dtype != ZT_FP32 && a.dtype != ZT_BF16)
    return zt__errf(e, -EINVAL, "%s: args->dtype is %d; expected ZT_FP32 or ZT_BF16", fn,
                    (int)a.dtype);
  if (a.force != 0 && a.force != 1)
    return zt__errf(e, -EINVAL, "%s: args->force is %d; expected 0 or 1", fn, a.force);
  uint64_t size;
  if (a.max_shard_bytes == 0)
    return zt__ckpt_consolidate(dir, out, a.dtype, a.force, NULL, &size, e);
  size_t n_shards;
  return zt__ckpt_consolidate_shards(dir, out, a.dtype, a.max_shard_bytes, a.force, NULL,
                                     &n_shards, &size, e);
}

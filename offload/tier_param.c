/*
 * tier_param.c — the parameter tiers, which hold stage 3's shard of the
 * parameters between steps: "device" and "host" keep it in the ZeRO room's
 * buffer (backend or pinned memory, the room's to allocate), "nvme" in a
 * swap file (param_nvme.c, its storage). Their ops: create, get and put of
 * a span (checkpoints, the step), done, footprint, and for the nvme tier
 * the reads ahead of a fetch. See tier.h.
 */
#include <string.h>

#include "offload/param_nvme.h" // defines: zt__param_nvme_*
#include "offload/tier.h"

/* ---- memory: the room's buffer ------------------------------------------------------- */

static int mem_create(zt__param_tier_t *t) { return 0; }
static void mem_destroy(zt__param_tier_t *t) {}
static int mem_done(zt__param_tier_t *t) { return 0; }

static int mem_get(zt__param_tier_t *t, size_t a, size_t b, void *dst) {
  const zt__ctx_t *c = t->ctx;
  size_t psz = zt__dtype_size(t->dtype);
  const char *src = (const char *)*t->mem + (a - t->first) * psz;
  if (t->mem_on_host) {
    memcpy(dst, src, (b - a) * psz);
    return 0;
  }
  ZT_TRY(c->be_ops->copy(c->be, dst, src, (b - a) * psz, ZT_COPY_D2H, ZT_STREAM_D2H));
  return c->be_ops->stream_sync(c->be, ZT_STREAM_D2H);
}

static int mem_put(zt__param_tier_t *t, size_t a, size_t b, const void *src) {
  const zt__ctx_t *c = t->ctx;
  size_t psz = zt__dtype_size(t->dtype);
  char *dst = (char *)*t->mem + (a - t->first) * psz;
  if (t->mem_on_host) {
    memcpy(dst, src, (b - a) * psz);
    return 0;
  }
  ZT_TRY(c->be_ops->copy(c->be, dst, src, (b - a) * psz, ZT_COPY_H2D, ZT_STREAM_H2D));
  return c->be_ops->stream_sync(c->be, ZT_STREAM_H2D);
}

/* The buffer is the ZeRO room's (partition.c), counted with its own. */
static void mem_footprint(const zt__tier_shape_t *s, zt__footprint_t *out) {
  *out = (zt__footprint_t){.fits = 1};
}

/* The shard stays in the room's buffer (on_medium 0): no reads ahead. */
const zt__param_tier_ops_t zt__param_tier_device = {
    "device", 0, mem_create, mem_destroy, mem_get, mem_put, mem_done, mem_footprint,
    NULL,     NULL,       NULL,        NULL,    NULL};
const zt__param_tier_ops_t zt__param_tier_host = {
    "host", 1, mem_create, mem_destroy, mem_get, mem_put, mem_done, mem_footprint,
    NULL,   NULL,       NULL,        NULL,    NULL};

/* ---- nvme: a swap file ----------------------------------------------------------------- */

static int nvme_create(zt__param_tier_t *t) {
  ZT_TRY(zt__param_nvme_create(t->ctx, t->pin, t->n, t->dtype, &t->nvme));
  t->on_medium = 1;
  return 0;
}

static void nvme_destroy(zt__param_tier_t *t) {
  zt__param_nvme_destroy(t->nvme);
  t->nvme = NULL;
  t->on_medium = 0;
}

/* An empty shard has no file (and no span to move). */
static int nvme_get(zt__param_tier_t *t, size_t a, size_t b, void *dst) {
  if (t->nvme == NULL) return 0;
  return zt__param_nvme_get(t->nvme, a - t->first, b - a, dst);
}

static int nvme_put(zt__param_tier_t *t, size_t a, size_t b, const void *src) {
  if (t->nvme == NULL) return 0;
  return zt__param_nvme_put(t->nvme, a - t->first, b - a, src);
}

static int nvme_done(zt__param_tier_t *t) {
  return t->nvme ? zt__param_nvme_flush(t->nvme) : 0;
}

/* The file, in 4 KiB blocks, and the two pinned pages the writes go
 * through (param_nvme.c); reads ahead are zt_stats' read_ahead_bytes. */
static void nvme_footprint(const zt__tier_shape_t *s, zt__footprint_t *out) {
  *out = (zt__footprint_t){.fits = 1};
  uint64_t psz = zt__dtype_size(s->param_dtype);
  uint64_t file = zt__page_round(s->n ? s->n * psz : 1);
  uint64_t page = zt__page_round(s->chunk_bytes);
  if (page > file) page = file;
  out->host = out->pinned_pages = 2 * page;
  out->nvme = file;
}

/* Reads ahead: the file's, at the shard's offsets. */
static int nvme_read(zt__param_tier_t *t, const zt__param_spans_t *spans, zt__param_read_t **out) {
  return zt__param_nvme_read(t->nvme, spans, t->first, out);
}

static int nvme_wait(zt__param_tier_t *t, zt__param_read_t *r) {
  return zt__param_nvme_wait(t->nvme, r);
}

static int nvme_landed(zt__param_tier_t *t, zt__param_read_t *r) {
  return zt__param_nvme_landed(t->nvme, r);
}

static void nvme_read_free(zt__param_tier_t *t, zt__param_read_t *r) {
  zt__param_nvme_read_free(t->nvme, r);
}

static void nvme_trim(zt__param_tier_t *t) { zt__param_nvme_trim(t->nvme); }

const zt__param_tier_ops_t zt__param_tier_nvme = {
    "nvme", 0, nvme_create, nvme_destroy, nvme_get,       nvme_put,  nvme_done,
    nvme_footprint, nvme_read,  nvme_wait,    nvme_landed,    nvme_read_free, nvme_trim};

/*
 * param_nvme.c — the storage of the parameter tier "nvme" (its ops table is
 * offload/tier_param.c): the shard's parameters in a swap file, read a
 * group at a time, written back a page at a time; see param_nvme.h.
 *
 * Tags: a read's tag is its zt__param_read_t (pointers are 8-aligned, so
 * bit 0 is free); a write's is page slot << 1 | 1.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "offload/param_nvme.h"
#include "offload/pinned.h"     // defines: zt__pinned_alloc, zt__pinned_free
#include "offload/spares.h"     // defines: zt__spares_t
#include "offload/swap.h"       // defines: zt__swap_*
#include "offload/swapspace.h"  // defines: zt__swapspace_open

/* The checksum block, and what a run is read in: O_DIRECT's alignment. */
#define BLOCK 4096u
#define PAGES 2

struct zt__param_nvme {
  const zt__ctx_t *ctx;
  zt__pinned_t *pin; /* where the pages and read buffers come from */
  zt__swap_t *sw;
  size_t numel, psz;
  size_t file_bytes;   /* numel * psz rounded up to a block */
  size_t page_bytes;   /* a multiple of BLOCK               */
  void *page[PAGES];   /* pinned                            */
  int writing[PAGES];  /* a write of the page is in flight  */
  unsigned cur;        /* the page being filled             */
  size_t fill;         /* bytes in it                       */
  size_t written;      /* bytes of the shard put so far     */
  int io_error;        /* the first failed write            */
  /* Read buffers kept for the next read of the same size: a fresh pinned
   * buffer costs its page faults and locking on every fetch. */
  zt__spares_t spares;
  zt__param_nvme_stats_t st;
};

static uint64_t write_tag(unsigned page) { return (uint64_t)page << 1 | 1; }

/* Reaps completions, at least one when `block`. */
static int reap(zt__param_nvme_t *pn, int block) {
  zt__swap_cqe_t cqe[16];
  double t0 = zt__now();
  int n = block ? zt__swap_wait(pn->sw, cqe, 16, 1) : zt__swap_poll(pn->sw, cqe, 16);
  pn->st.wait_seconds += zt__now() - t0;
  if (n < 0) return n;
  for (int i = 0; i < n; i++) {
    if (cqe[i].tag & 1) {
      pn->writing[cqe[i].tag >> 1] = 0;
      if (cqe[i].res < 0 && pn->io_error == 0) pn->io_error = (int)cqe[i].res;
      if (cqe[i].res >= 0) pn->st.write_bytes += (uint64_t)cqe[i].res;
      continue;
    }
    zt__param_read_t *r = (zt__param_read_t *)(uintptr_t)cqe[i].tag;
    r->pending--;
    if (cqe[i].res < 0 && r->error == 0) {
      /* Its sentence is in the error buffer now; a later call may
       * overwrite it before the read is waited for. */
      r->error = (int)cqe[i].res;
      r->why = *pn->ctx->err;
    }
    if (cqe[i].res >= 0) pn->st.read_bytes += (uint64_t)cqe[i].res;
  }
  return 0;
}

int zt__param_nvme_create(const zt__ctx_t *ctx, zt__pinned_t *pin, size_t numel,
                          zt_dtype_t dt, zt__param_nvme_t **out) {
  *out = NULL;
  zt__param_nvme_t *pn = calloc(1, sizeof *pn);
  if (pn == NULL) return zt__errf(ctx->err, -ENOMEM, "out of memory");
  pn->ctx = ctx;
  pn->pin = pin;
  pn->numel = numel;
  pn->psz = zt__dtype_size(dt);
  pn->file_bytes = zt__round_up(numel ? numel * pn->psz : 1, BLOCK);
  pn->page_bytes = zt__round_up(ctx->cfg->chunk_bytes, BLOCK);
  if (pn->page_bytes > pn->file_bytes) pn->page_bytes = pn->file_bytes;
  pn->st.file_bytes = pn->file_bytes;
  int rc = 0;
  for (int k = 0; k < PAGES && rc == 0; k++)
    rc = zt__pinned_alloc(pin, pn->page_bytes, &pn->page[k]);
  if (rc == 0)
    rc = zt__swapspace_open(ctx, "par", "param_tier", pn->file_bytes, BLOCK, PAGES, &pn->sw,
                            NULL, 0);
  if (rc == 0) {
    for (int k = 0; k < PAGES; k++)
      if (zt__swap_register_buf(pn->sw, pn->page[k], pn->page_bytes) < 0) break;
    zt__err_clear(ctx->err);
    *out = pn;
    return 0;
  }
  zt__param_nvme_destroy(pn);
  return rc;
}

void zt__param_nvme_destroy(zt__param_nvme_t *pn) {
  if (pn == NULL) return;
  if (pn->sw) {
    zt__swap_drain(pn->sw);
    zt__swap_destroy(pn->sw);
  }
  for (int k = 0; k < PAGES; k++) zt__pinned_free(pn->pin, pn->page[k], pn->page_bytes);
  zt__param_nvme_trim(pn);
  free(pn);
}

void zt__param_nvme_trim(zt__param_nvme_t *pn) {
  if (pn == NULL) return;
  for (int i = 0; i < pn->spares.n; i++)
    zt__pinned_free(pn->pin, pn->spares.buf[i], pn->spares.bytes[i]);
  pn->spares.n = 0;
}

size_t zt__param_nvme_spare_bytes(const zt__param_nvme_t *pn) {
  return pn ? zt__spares_bytes(&pn->spares) : 0;
}

/* A pinned buffer of `bytes` for a read: a spare of that size, else a new
 * one (the spares are freed first when the pinned budget is short). Its
 * content is not zeroed: the read fills all of it. */
static int read_buf_get(zt__param_nvme_t *pn, size_t bytes, void **out) {
  int i = zt__spares_find(&pn->spares, bytes);
  if (i >= 0) {
    *out = zt__spares_take(&pn->spares, i, NULL);
    return 0;
  }
  int rc = zt__pinned_alloc(pn->pin, bytes, out);
  if (rc == -ENOMEM && pn->spares.n > 0) {
    zt__err_clear(pn->ctx->err);
    zt__param_nvme_trim(pn);
    rc = zt__pinned_alloc(pn->pin, bytes, out);
  }
  return rc;
}

/* ---- writes -------------------------------------------------------------------------- */

/* The page being filled goes to the disk; the next one is waited free. */
static int write_page(zt__param_nvme_t *pn) {
  size_t off = pn->written - pn->fill;
  ZT_TRY(zt__swap_prep_write(pn->sw, pn->page[pn->cur], pn->fill, off, write_tag(pn->cur)));
  pn->writing[pn->cur] = 1;
  int rc = zt__swap_submit(pn->sw);
  if (rc < 0) return rc;
  pn->cur = (pn->cur + 1) % PAGES;
  pn->fill = 0;
  while (pn->writing[pn->cur]) ZT_TRY(reap(pn, 1));
  return pn->io_error;
}

int zt__param_nvme_put(zt__param_nvme_t *pn, size_t first, size_t n, const void *src) {
  if (first * pn->psz != pn->written || first + n > pn->numel)
    return zt__errf(pn->ctx->err, -EINVAL,
                    "param_tier \"nvme\": a put of [%zu, %zu) after %zu elements of %zu; "
                    "expected the shard in order",
                    first, first + n, pn->written / pn->psz, pn->numel);
  const char *s = src;
  size_t bytes = n * pn->psz;
  while (bytes) {
    size_t take = pn->page_bytes - pn->fill;
    if (take > bytes) take = bytes;
    memcpy((char *)pn->page[pn->cur] + pn->fill, s, take);
    pn->fill += take;
    pn->written += take;
    s += take;
    bytes -= take;
    if (pn->fill == pn->page_bytes) ZT_TRY(write_page(pn));
  }
  return 0;
}

int zt__param_nvme_flush(zt__param_nvme_t *pn) {
  int rc = pn->fill ? write_page(pn) : 0;
  for (int k = 0; k < PAGES && rc == 0; k++)
    while (pn->writing[k] && (rc = reap(pn, 1)) == 0) {
    }
  if (rc == 0) rc = pn->io_error;
  if (rc < 0 && zt__swap_outstanding(pn->sw) > 0) {
    /* Nothing may stay in flight from the pages; the first error stands. */
    zt__err_t keep = *pn->ctx->err;
    zt__swap_drain(pn->sw);
    *pn->ctx->err = keep;
    memset(pn->writing, 0, sizeof pn->writing);
  }
  pn->written = pn->fill = 0;
  pn->io_error = 0;
  return rc;
}

/* ---- reads --------------------------------------------------------------------------- */

int zt__param_nvme_get(zt__param_nvme_t *pn, size_t first, size_t n, void *dst) {
  if (pn->fill || pn->written || first + n > pn->numel)
    return zt__errf(pn->ctx->err, -EINVAL,
                    "param_tier \"nvme\": a get of [%zu, %zu) of %zu elements with %zu "
                    "put; expected a range of the shard between steps",
                    first, first + n, pn->numel, pn->written / pn->psz);
  char *out = dst;
  size_t pos = first * pn->psz, end = (first + n) * pn->psz;
  while (pos < end) {
    /* An aligned run of at most a page around pos, read into page 0. */
    size_t lo = pos / BLOCK * BLOCK;
    size_t hi = zt__round_up(end, BLOCK);
    if (hi - lo > pn->page_bytes) hi = lo + pn->page_bytes;
    ZT_TRY(zt__swap_prep_read(pn->sw, pn->page[0], hi - lo, lo, 0));
    int rc = zt__swap_submit(pn->sw);
    if (rc < 0) return rc;
    zt__swap_cqe_t cqe;
    double t0 = zt__now();
    rc = zt__swap_wait(pn->sw, &cqe, 1, 1);
    pn->st.wait_seconds += zt__now() - t0;
    if (rc < 0) return rc;
    if (cqe.res < 0) return (int)cqe.res; /* its sentence is in the error buffer */
    pn->st.read_bytes += hi - lo;
    size_t take = (hi < end ? hi : end) - pos;
    memcpy(out, (const char *)pn->page[0] + (pos - lo), take);
    out += take;
    pos += take;
  }
  return 0;
}

/* Span k of a strided list. */
static void span_at(const zt__param_spans_t *s, size_t k, size_t *a, size_t *b) {
  *a = *(const size_t *)((const char *)s->a + k * s->stride);
  *b = *(const size_t *)((const char *)s->b + k * s->stride);
}

int zt__param_nvme_read(zt__param_nvme_t *pn, const zt__param_spans_t *spans, size_t begin,
                        zt__param_read_t **out) {
  size_t n_spans = spans->n;
  *out = NULL;
  size_t end = begin + pn->numel, bytes = 0, payload = 0;
  for (size_t k = 0; k < n_spans; k++) {
    size_t a, b, sa, sb;
    span_at(spans, k, &sa, &sb);
    if (!zt__span_clip(sa, sb, begin, end, &a, &b)) continue;
    size_t lo = (a - begin) * pn->psz / BLOCK * BLOCK;
    bytes += zt__round_up((b - begin) * pn->psz, BLOCK) - lo;
    payload += (b - a) * pn->psz;
  }
  zt__param_read_t *r = calloc(1, sizeof *r);
  size_t *at = calloc(n_spans ? n_spans : 1, sizeof *at);
  if (r == NULL || at == NULL) {
    free(r);
    free(at);
    return zt__errf(pn->ctx->err, -ENOMEM, "out of memory");
  }
  r->at = at;
  r->bytes = bytes;
  r->payload = payload;
  if (bytes) {
    int rc = read_buf_get(pn, bytes, &r->buf);
    if (rc < 0) {
      free(at);
      free(r);
      return rc;
    }
  }
  size_t pos = 0;
  int rc = 0;
  for (size_t k = 0; k < n_spans; k++) {
    size_t a, b, sa, sb;
    r->at[k] = SIZE_MAX;
    span_at(spans, k, &sa, &sb);
    if (!zt__span_clip(sa, sb, begin, end, &a, &b)) continue;
    size_t lo = (a - begin) * pn->psz / BLOCK * BLOCK;
    size_t hi = zt__round_up((b - begin) * pn->psz, BLOCK);
    r->at[k] = pos + (a - begin) * pn->psz - lo;
    if (rc == 0) rc = zt__swap_prep_read(pn->sw, (char *)r->buf + pos, hi - lo, lo,
                                         (uint64_t)(uintptr_t)r);
    if (rc == 0) r->pending++;
    pos += hi - lo;
  }
  if (rc == 0 && r->pending) {
    int sub = zt__swap_submit(pn->sw);
    rc = sub < 0 ? sub : 0;
  }
  *out = r;
  /* Requests prepared before a failure still complete into r: the caller
   * frees it (which waits for them). */
  return rc;
}

int zt__param_nvme_wait(zt__param_nvme_t *pn, zt__param_read_t *r) {
  while (r->pending) ZT_TRY(reap(pn, 1));
  if (r->error < 0) *pn->ctx->err = r->why;
  return r->error;
}

int zt__param_nvme_landed(zt__param_nvme_t *pn, zt__param_read_t *r) {
  unsigned before;
  do {
    before = r->pending;
    if (before && reap(pn, 0) < 0) {
      zt__err_clear(pn->ctx->err); /* the wait reports it */
      return 0;
    }
  } while (r->pending && r->pending < before);
  return r->pending == 0 && r->error == 0;
}

void zt__param_nvme_read_free(zt__param_nvme_t *pn, zt__param_read_t *r) {
  if (r == NULL) return;
  /* A ring whose submission keeps failing cannot complete it: drained, its
   * requests never reached the kernel. The first error stands. */
  zt__err_t keep = *pn->ctx->err;
  while (r->pending)
    if (reap(pn, 1) < 0) {
      zt__swap_drain(pn->sw);
      break;
    }
  *pn->ctx->err = keep;
  if (r->buf && !zt__spares_put(&pn->spares, r->buf, r->bytes, NULL))
    zt__pinned_free(pn->pin, r->buf, r->bytes);
  free(r->at);
  free(r);
}

void zt__param_nvme_stats(const zt__param_nvme_t *pn, zt__param_nvme_stats_t *out) {
  if (pn == NULL) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = pn->st;
}

struct zt__swap *zt__param_nvme_swap(zt__param_nvme_t *pn) { return pn ? pn->sw : NULL; }

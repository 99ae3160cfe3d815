/*
 * opt_nvme.c — the storage of the optimizer tier "nvme" (its ops table is
 * tier_nvme.c): states in swap files, streamed through ZT_NVME_SLOTS pinned
 * slots per step; see opt_nvme.h.
 *
 * A slot holds one window: its record (master | m | v, `chunk` elements
 * each: floats, and m and v in the optimizer_states format; padded to the
 * swap block), its gradients as they came from the device and
 * its cast parameters on their way back. Window w uses slot w % SLOTS. The
 * step keeps LOOKAHEAD = SLOTS - 2 reads ahead of the update, so while
 * window w is updated, windows w+1 and w+2 are being read and window w-1 is
 * being written: a slot is reused only once its write and its parameters'
 * host→device copy are done.
 *
 * The swap engine runs inline (one ring, on this thread) or on ring threads
 * (swap_rings > 1). Inline, I/Os already handed to the kernel proceed while
 * the CPU updates, and new ones are handed over whenever this thread reaps;
 * queue_depth x swap_block_bytes (256 MiB by default) is in flight at most,
 * several windows' worth.
 */
#include <stdlib.h>
#include <string.h>

#include "offload/opt_nvme.h"
#include "offload/context.h"  // defines: zt__ctx_t, zt__counters_t
#include "offload/param_nvme.h" // defines: zt__param_nvme_put
#include "offload/pinned.h"   // defines: zt__pinned_alloc, zt__pinned_free
#include "offload/swap.h"     // defines: zt__swap_*
#include "offload/swapspace.h" // defines: zt__swapspace_open
#include "cpu/window.h"   // defines: zt__window_*
#include "offload/file_mem.h" // defines: zt__file_mem_release

#define LOOKAHEAD (ZT_NVME_SLOTS - 2)
/* Windows are a multiple of this many elements (a 4 KiB page of floats), so
 * m and v start page-aligned inside a record. */
#define CHUNK_ALIGN 1024

typedef struct slot {
  float *states;           /* master | m | v, stride bytes, pinned */
  void *grads;             /* chunk elements of grad_dtype, pinned; NULL in_host */
  void *params;            /* chunk elements of param_dtype, pinned; NULL in_host
                              without a sink */
  zt__event_t *grads_ready; /* D2H of the window's gradients done   */
  zt__event_t *params_sent; /* H2D of the window's parameters done  */
  int reading, writing;     /* a request of this slot is in flight  */
} slot_t;

struct zt__opt_nvme {
  const zt__ctx_t *ctx;
  zt__pinned_t *pin;  /* where the slots come from */
  zt__counters_t cnt; /* the engine's statistics   */
  zt__opt_nvme_view_t view;
  zt__swap_t *sw;
  zt__window_t *windows;
  size_t n_windows;
  zt__seg_t *pieces; /* one window's pieces (room for n_segs) */
  size_t chunk;      /* elements per window                    */
  int states;        /* config optimizer_states                */
  size_t ssz;        /* bytes of an element of m, of v         */
  size_t rec_len;    /* chunk * (4 + 2 * ssz) bytes            */
  size_t stride;     /* rec_len rounded up to the swap block   */
  slot_t slot[ZT_NVME_SLOTS];
  zt__event_t *compute_mark;
  int io_error; /* the first failed completion of this step */
  zt__opt_nvme_stats_t st;
};

/* A slot's m and v, after its master (chunk floats), in the states'
 * format; as float * for the launch, whose m and v point at that format. */
static float *state_m(const zt__opt_nvme_t *o, const slot_t *s) {
  return (float *)((char *)s->states + o->chunk * sizeof(float));
}
static float *state_v(const zt__opt_nvme_t *o, const slot_t *s) {
  return (float *)((char *)s->states + o->chunk * (sizeof(float) + o->ssz));
}

/* The element sizes of a slot's gradients and parameters: 0 for those the
 * update reads or writes where they are (in_host). */
static size_t slot_gsz(const zt__opt_nvme_view_t *v) {
  return v->in_host ? 0 : zt__dtype_size(v->grad_dtype);
}
static size_t slot_psz(const zt__opt_nvme_view_t *v) {
  return v->in_host && v->params_sink == NULL ? 0 : zt__dtype_size(v->param_dtype);
}

/* ---- sizing ------------------------------------------------------------------------ */

/* The swap block (the checksum unit, and what a record is padded to): large
 * enough that the table of checksums stays small, small enough that the
 * padding of a small model's record is. */
static uint32_t swap_block(size_t rec_len) { return rec_len >= (64u << 10) ? 64u << 10 : 4096; }

static size_t record_bytes(size_t chunk, size_t ssz) { return chunk * (sizeof(float) + 2 * ssz); }

size_t zt__opt_nvme_stride(size_t chunk, size_t ssz) {
  size_t rec = record_bytes(chunk, ssz);
  return zt__round_up(rec, swap_block(rec));
}

/* As the pinned budget counts them: the bytes asked for. */
size_t zt__opt_nvme_slot_bytes(size_t chunk, size_t gsz, size_t psz, size_t ssz) {
  return zt__opt_nvme_stride(chunk, ssz) + chunk * gsz + chunk * psz;
}

/* A slot's pinned pages: each of its regions is rounded up to 4 KiB. */
static size_t slot_pages(size_t chunk, size_t gsz, size_t psz, size_t ssz) {
  return zt__page_round(zt__opt_nvme_stride(chunk, ssz)) + zt__page_round(chunk * gsz) +
         zt__page_round(chunk * psz);
}

size_t zt__opt_nvme_chunk(size_t extent, size_t chunk_bytes, size_t room, size_t gsz,
                          size_t psz, size_t ssz) {
  size_t chunk = chunk_bytes / sizeof(float);
  if (chunk > zt__round_up(extent, CHUNK_ALIGN)) chunk = zt__round_up(extent, CHUNK_ALIGN);
  if (room == 0) return chunk;
  while (chunk > CHUNK_ALIGN && ZT_NVME_SLOTS * slot_pages(chunk, gsz, psz, ssz) > room)
    chunk = (chunk / 2 + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  return ZT_NVME_SLOTS * slot_pages(chunk, gsz, psz, ssz) > room ? 0 : chunk;
}

/* Elements per window (zt__opt_nvme_chunk), with the room the pinned budget
 * leaves after the pages pinned already. */
static int size_chunk(const zt__ctx_t *ctx, const zt__pinned_t *pin,
                      const zt__opt_nvme_view_t *v, size_t *out) {
  const zt__seg_t *first = &v->segs[0], *last = &v->segs[v->n_segs - 1];
  size_t extent = last->index + last->n - first->index;
  size_t gsz = slot_gsz(v), psz = slot_psz(v), ssz = zt__states_size(ctx->cfg->optimizer_states);
  size_t budget = ctx->cfg->pinned_budget_bytes, room = 0;
  if (budget != 0) {
    room = budget > pin->pages ? budget - pin->pages : 0;
    if (room == 0) room = 1; /* 0 would mean "no limit" */
  }
  *out = zt__opt_nvme_chunk(extent, ctx->cfg->chunk_bytes, room, gsz, psz, ssz);
  if (*out == 0) {
    size_t least = ZT_NVME_SLOTS * slot_pages(CHUNK_ALIGN, gsz, psz, ssz);
    return zt__errf(ctx->err, -ENOMEM,
                    "optimizer_tier \"nvme\" needs %d pinned slots of at least %zu bytes "
                    "(%zu in all), but pinned_budget_bytes leaves %zu; raise "
                    "pinned_budget_bytes",
                    ZT_NVME_SLOTS, least / ZT_NVME_SLOTS, least, room);
  }
  return 0;
}

/* ---- completions -------------------------------------------------------------------- */

/* Tags: window << 1 | write. */
static uint64_t tag_of(size_t w, int write) { return (uint64_t)w << 1 | (uint64_t)write; }

/* Reaps completions: at least one when `block`, else whatever is ready.
 * A failed one is kept in o->io_error (its sentence is in ctx->err). */
static int reap(zt__opt_nvme_t *o, int block) {
  zt__swap_cqe_t cqe[16];
  double t0 = zt__now();
  int n = block ? zt__swap_wait(o->sw, cqe, 16, 1) : zt__swap_poll(o->sw, cqe, 16);
  o->st.wait_seconds += zt__now() - t0;
  if (n < 0) return n;
  for (int i = 0; i < n; i++) {
    size_t w = (size_t)(cqe[i].tag >> 1);
    slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
    if (cqe[i].tag & 1) {
      s->writing = 0;
      if (cqe[i].res >= 0) o->st.write_bytes += o->rec_len;
    } else {
      s->reading = 0;
      if (cqe[i].res >= 0) o->st.read_bytes += o->rec_len;
    }
    if (cqe[i].res < 0 && o->io_error == 0) o->io_error = (int)cqe[i].res;
  }
  return o->io_error;
}

/* Blocks until slot s has no request in flight. */
static int settle(zt__opt_nvme_t *o, slot_t *s) {
  while (s->reading || s->writing) ZT_TRY(reap(o, 1));
  return o->io_error;
}

/* After a failure: nothing may stay in flight into the slots (the caller
 * may free them). The first error stands; the drain's own is dropped. */
static int fail(zt__opt_nvme_t *o, int rc) {
  if (o->sw && zt__swap_outstanding(o->sw) > 0) {
    zt__err_t keep = *o->ctx->err;
    zt__swap_drain(o->sw);
    *o->ctx->err = keep;
  }
  for (int k = 0; k < ZT_NVME_SLOTS; k++) o->slot[k].reading = o->slot[k].writing = 0;
  return rc;
}

/* ---- copies between the view's buffers and a slot ----------------------------------- */

static int write_record(zt__opt_nvme_t *o, size_t w) {
  slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
  ZT_TRY(zt__swap_prep_write(o->sw, s->states, o->rec_len, (uint64_t)w * o->stride,
                             tag_of(w, 1)));
  s->writing = 1;
  int rc = zt__swap_submit(o->sw);
  return rc < 0 ? rc : 0;
}

/* D2H of window w's gradients (the whole extent: gaps between units are
 * read, never used; in_host: none), then the read of its record. */
static int issue(zt__opt_nvme_t *o, size_t w) {
  const zt__ctx_t *ctx = o->ctx;
  const zt__backend_ops_t *be = ctx->be_ops;
  slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
  const zt__window_t *win = &o->windows[w];
  size_t gsz = zt__dtype_size(o->view.grad_dtype);
  ZT_TRY(settle(o, s));
  if (!o->view.in_host) {
    ZT_TRY(be->stream_wait(ctx->be, ZT_STREAM_D2H, o->compute_mark));
    ZT_TRY(be->copy(ctx->be, s->grads,
                    (const char *)o->view.grads + (win->first - o->view.grads_first) * gsz,
                    win->n * gsz, ZT_COPY_D2H, ZT_STREAM_D2H));
    ZT_TRY(be->event_record(ctx->be, s->grads_ready, ZT_STREAM_D2H));
    *o->cnt.d2h_bytes += win->n * gsz;
  }
  ZT_TRY(zt__swap_prep_read(o->sw, s->states, o->rec_len, (uint64_t)w * o->stride,
                            tag_of(w, 0)));
  s->reading = 1;
  int rc = zt__swap_submit(o->sw);
  return rc < 0 ? rc : 0;
}

/* H2D of the updated parameters of window w: one copy per contiguous run
 * of pieces, so elements between units stay as the user left them; or, with
 * a sink, the runs into it, from the slot (host memory). In_host without a
 * sink the update wrote them in place: nothing to send. */
static int send_params(zt__opt_nvme_t *o, size_t w, size_t n_pieces) {
  const zt__ctx_t *ctx = o->ctx;
  const zt__backend_ops_t *be = ctx->be_ops;
  if (o->view.in_host && o->view.params_sink == NULL) return 0;
  slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
  const zt__window_t *win = &o->windows[w];
  size_t psz = zt__dtype_size(o->view.param_dtype);
  for (size_t k = 0; k < n_pieces;) {
    size_t a = o->pieces[k].index, b = a + o->pieces[k].n;
    for (k++; k < n_pieces && o->pieces[k].index == b; k++) b += o->pieces[k].n;
    if (o->view.params_sink) {
      ZT_TRY(zt__param_nvme_put(o->view.params_sink, a - o->view.params_first, b - a,
                                (const char *)s->params + (a - win->first) * psz));
      continue;
    }
    ZT_TRY(be->copy(ctx->be, (char *)o->view.params + (a - o->view.params_first) * psz,
                    (const char *)s->params + (a - win->first) * psz, (b - a) * psz,
                    ZT_COPY_H2D, ZT_STREAM_H2D));
    *o->cnt.h2d_bytes += (b - a) * psz;
  }
  return o->view.in_host ? 0 : be->event_record(ctx->be, s->params_sent, ZT_STREAM_H2D);
}

/* ---- create: every record written once ---------------------------------------------- */

/* master = the parameters of the window, cast; m = v = 0; then written. */
static int init_records(zt__opt_nvme_t *o) {
  const zt__ctx_t *ctx = o->ctx;
  const zt__backend_ops_t *be = ctx->be_ops;
  size_t psz = zt__dtype_size(o->view.param_dtype);
  for (size_t w = 0; w < o->n_windows; w++) {
    slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
    const zt__window_t *win = &o->windows[w];
    ZT_TRY(settle(o, s));
    const char *at = (const char *)o->view.params + (win->first - o->view.params_first) * psz;
    if (!o->view.in_host) {
      ZT_TRY(be->copy(ctx->be, s->params, at, win->n * psz, ZT_COPY_D2H, ZT_STREAM_D2H));
      ZT_TRY(be->stream_sync(ctx->be, ZT_STREAM_D2H));
      *o->cnt.d2h_bytes += win->n * psz;
      at = s->params;
    }
    memset(s->states, 0, o->stride);
    size_t n = zt__window_pieces(o->view.segs, o->view.n_segs, win, win->state_first,
                                 o->pieces);
    for (size_t k = 0; k < n; k++)
      zt__cpu_cast(ctx->cpu, s->states + o->pieces[k].state_off, ZT_FP32,
                   at + (o->pieces[k].index - win->first) * psz, o->view.param_dtype,
                   o->pieces[k].n);
    if (o->view.in_host) zt__file_mem_release(o->view.params_file, at, win->n * psz);
    ZT_TRY(write_record(o, w));
  }
  for (int k = 0; k < ZT_NVME_SLOTS; k++) ZT_TRY(settle(o, &o->slot[k]));
  return 0;
}

/* The swap space, with the slots' states as fixed buffers. */
static int open_swap(zt__opt_nvme_t *o) {
  const zt__ctx_t *ctx = o->ctx;
  o->st.file_bytes = (uint64_t)o->n_windows * o->stride;
  ZT_TRY(zt__swapspace_open(ctx, "opt", "optimizer_tier", o->st.file_bytes,
                            swap_block(o->rec_len), ZT_NVME_SLOTS, &o->sw, o->st.note,
                            sizeof o->st.note));
  /* Fixed buffers save pinning pages per I/O; where the kernel refuses
   * them, plain I/O works the same. */
  for (int k = 0; k < ZT_NVME_SLOTS; k++)
    if (zt__swap_register_buf(o->sw, o->slot[k].states, o->stride) < 0) break;
  zt__err_clear(ctx->err);
  return 0;
}

int zt__opt_nvme_create(const zt__ctx_t *ctx, zt__pinned_t *pin, const zt__counters_t *cnt,
                        const zt__opt_nvme_view_t *view, zt__opt_nvme_t **out) {
  *out = NULL;
  zt__opt_nvme_t *o = calloc(1, sizeof *o);
  if (o == NULL) return zt__errf(ctx->err, -ENOMEM, "out of memory");
  o->ctx = ctx;
  o->pin = pin;
  o->cnt = *cnt;
  o->view = *view;
  int rc = view->n_segs ? size_chunk(ctx, pin, view, &o->chunk) : 0;
  if (rc < 0 || view->n_segs == 0) { /* an empty shard has nothing to swap */
    free(o);
    if (rc == 0) *out = NULL;
    return rc;
  }
  o->states = ctx->cfg->optimizer_states;
  o->ssz = zt__states_size(o->states);
  o->rec_len = record_bytes(o->chunk, o->ssz);
  o->stride = zt__opt_nvme_stride(o->chunk, o->ssz);
  o->st.chunk = o->chunk;
  o->n_windows = zt__window_count(view->segs, view->n_segs, o->chunk);
  o->windows = calloc(o->n_windows, sizeof *o->windows);
  o->pieces = calloc(view->n_segs, sizeof *o->pieces);
  if (o->windows == NULL || o->pieces == NULL) {
    rc = zt__errf(ctx->err, -ENOMEM, "out of memory");
    goto fail;
  }
  size_t j = 0, pos = 0;
  for (size_t w = 0; w < o->n_windows; w++) {
    zt__window_next(view->segs, view->n_segs, o->chunk, &j, pos, &o->windows[w]);
    pos = o->windows[w].first + o->windows[w].n;
  }
  size_t gsz = slot_gsz(view), psz = slot_psz(view);
  const zt__backend_ops_t *be = ctx->be_ops;
  for (int k = 0; k < ZT_NVME_SLOTS && rc == 0; k++) {
    slot_t *s = &o->slot[k];
    rc = zt__pinned_alloc(o->pin, o->stride, (void **)&s->states);
    if (rc == 0 && gsz) rc = zt__pinned_alloc(o->pin, o->chunk * gsz, &s->grads);
    if (rc == 0 && psz) rc = zt__pinned_alloc(o->pin, o->chunk * psz, &s->params);
    if (rc == 0) rc = be->event_create(ctx->be, &s->grads_ready);
    if (rc == 0) rc = be->event_create(ctx->be, &s->params_sent);
  }
  if (rc == 0) rc = be->event_create(ctx->be, &o->compute_mark);
  if (rc == 0) rc = open_swap(o);
  if (rc == 0) rc = init_records(o);
  if (rc < 0) goto fail;
  *out = o;
  return 0;

fail:
  fail(o, rc);
  zt__opt_nvme_destroy(o);
  return rc;
}

void zt__opt_nvme_destroy(zt__opt_nvme_t *o) {
  if (o == NULL) return;
  const zt__ctx_t *ctx = o->ctx;
  const zt__backend_ops_t *be = ctx->be_ops;
  if (o->sw) {
    /* Nothing is in flight between calls (every path drains), so destroy
     * cannot refuse with -EBUSY; the files go with it. */
    zt__swap_drain(o->sw);
    zt__swap_destroy(o->sw);
  }
  size_t gsz = slot_gsz(&o->view), psz = slot_psz(&o->view);
  for (int k = 0; k < ZT_NVME_SLOTS; k++) {
    slot_t *s = &o->slot[k];
    zt__pinned_free(o->pin, s->states, o->stride);
    zt__pinned_free(o->pin, s->grads, o->chunk * gsz);
    zt__pinned_free(o->pin, s->params, o->chunk * psz);
    if (s->grads_ready) be->event_destroy(ctx->be, s->grads_ready);
    if (s->params_sent) be->event_destroy(ctx->be, s->params_sent);
  }
  if (o->compute_mark) be->event_destroy(ctx->be, o->compute_mark);
  free(o->windows);
  free(o->pieces);
  free(o);
}

/* ---- the step ----------------------------------------------------------------------- */

static int step(zt__opt_nvme_t *o, const zt__adam_hp_t *hp,
                const zt__update_progress_t *progress) {
  const zt__ctx_t *ctx = o->ctx;
  const zt__backend_ops_t *be = ctx->be_ops;
  /* The gradients are final once the user's work on the compute stream is:
   * each window's D2H waits for this mark, on the device. */
  ZT_TRY(be->event_record(ctx->be, o->compute_mark, ZT_STREAM_COMPUTE));
  size_t issued = 0;
  for (size_t w = 0; w < o->n_windows; w++) {
    while (issued < o->n_windows && issued <= w + LOOKAHEAD) ZT_TRY(issue(o, issued++));
    slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
    while (s->reading) ZT_TRY(reap(o, 1));
    ZT_TRY(o->io_error);
    /* The update writes the slot's parameters: their last H2D (window
     * w - SLOTS) must be done, and this window's gradients here. In_host
     * there are no copies: it reads and writes the view where it is. */
    double t0 = zt__now();
    if (!o->view.in_host) {
      ZT_TRY(be->event_sync(ctx->be, s->params_sent));
      ZT_TRY(be->event_sync(ctx->be, s->grads_ready));
    }
    double t1 = zt__now();
    *o->cnt.copy_seconds += t1 - t0;

    const zt__window_t *win = &o->windows[w];
    size_t n = zt__window_pieces(o->view.segs, o->view.n_segs, win, win->state_first,
                                 o->pieces);
    int in_place = o->view.in_host && o->view.params_sink == NULL;
    zt__adam_launch_t l = {
        .hp = hp,
        .master = s->states,
        .m = state_m(o, s),
        .v = state_v(o, s),
        .grads = o->view.in_host ? o->view.grads : s->grads,
        .grads_first = o->view.in_host ? o->view.grads_first : win->first,
        .grad_dtype = o->view.grad_dtype,
        .params = in_place ? o->view.params : s->params,
        .params_first = in_place ? o->view.params_first : win->first,
        .param_dtype = o->view.param_dtype,
        .segs = o->pieces,
        .n_segs = n,
    };
    size_t gsz = zt__dtype_size(o->view.grad_dtype);
    const char *grads = (const char *)o->view.grads + (win->first - o->view.grads_first) * gsz;
    zt__cpu_adam_in(ctx->cpu, o->states, &l);
    if (o->view.in_host) zt__file_mem_release(o->view.grads_file, grads, win->n * gsz);
    *o->cnt.optimizer_seconds += zt__now() - t1;
    ZT_TRY(send_params(o, w, n));
    ZT_TRY(write_record(o, w));
    ZT_TRY(reap(o, 0)); /* hands the kernel more I/O while the next waits */
    if (in_place && progress && progress->fn)
      ZT_TRY(progress->fn(progress->arg, win->first + win->n));
  }
  for (int k = 0; k < ZT_NVME_SLOTS; k++) ZT_TRY(settle(o, &o->slot[k]));
  /* In host memory there were no copies of the tier's own: the H2D stream
   * holds the gather's, which the loop's stream waits for by event. */
  if (o->view.in_host) return 0;
  double t0 = zt__now();
  ZT_TRY(be->stream_sync(ctx->be, ZT_STREAM_H2D));
  *o->cnt.copy_seconds += zt__now() - t0;
  return 0;
}

int zt__opt_nvme_step(zt__opt_nvme_t *o, const zt__adam_hp_t *hp,
                      const zt__update_progress_t *progress) {
  if (o == NULL) return 0; /* an empty shard */
  o->io_error = 0;
  int rc = step(o, hp, progress);
  return rc < 0 ? fail(o, rc) : 0;
}

/* ---- checkpoints: the records visited in order --------------------------------------- */

static int read_record(zt__opt_nvme_t *o, size_t w) {
  slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
  ZT_TRY(settle(o, s));
  ZT_TRY(zt__swap_prep_read(o->sw, s->states, o->rec_len, (uint64_t)w * o->stride,
                            tag_of(w, 0)));
  s->reading = 1;
  int rc = zt__swap_submit(o->sw);
  return rc < 0 ? rc : 0;
}

/* fn on a window's record: its master, m and v as floats. Compressed m
 * and v go through `bounce` (2 * chunk floats), widened exactly and rounded
 * back to nearest (which gives a widened value back unchanged). */
static int visit_window(zt__opt_nvme_t *o, slot_t *s, const zt__window_t *win, int import,
                        float *bounce, zt__opt_nvme_visit_fn fn, void *ctx) {
  if (o->states == ZT_STATES_FP32)
    return fn(ctx, win->state_first, win->state_n, s->states, state_m(o, s), state_v(o, s));
  zt__cpu_t *cpu = o->ctx->cpu;
  size_t n = win->state_n;
  float *m = bounce, *v = bounce + o->chunk;
  if (!import) {
    zt__cpu_cast(cpu, m, ZT_FP32, state_m(o, s), ZT_BF16, n);
    zt__cpu_cast(cpu, v, ZT_FP32, state_v(o, s), ZT_BF16, n);
  }
  ZT_TRY(fn(ctx, win->state_first, n, s->states, m, v));
  if (import) {
    zt__cpu_cast(cpu, state_m(o, s), ZT_BF16, m, ZT_FP32, n);
    zt__cpu_cast(cpu, state_v(o, s), ZT_BF16, v, ZT_FP32, n);
  }
  return 0;
}

/* Export reads LOOKAHEAD windows ahead of fn; import only writes, each
 * record's write overlapping fn's filling of the next ones. */
static int visit_windows(zt__opt_nvme_t *o, int import, float *bounce, zt__opt_nvme_visit_fn fn,
                         void *ctx) {
  size_t issued = 0;
  for (size_t w = 0; w < o->n_windows; w++) {
    slot_t *s = &o->slot[w % ZT_NVME_SLOTS];
    if (import) {
      ZT_TRY(settle(o, s));
    } else {
      while (issued < o->n_windows && issued <= w + LOOKAHEAD) ZT_TRY(read_record(o, issued++));
      while (s->reading) ZT_TRY(reap(o, 1));
      ZT_TRY(o->io_error);
    }
    const zt__window_t *win = &o->windows[w];
    ZT_TRY(visit_window(o, s, win, import, bounce, fn, ctx));
    if (import) ZT_TRY(write_record(o, w));
  }
  for (int k = 0; k < ZT_NVME_SLOTS; k++) ZT_TRY(settle(o, &o->slot[k]));
  return 0;
}

static int visit(zt__opt_nvme_t *o, int import, zt__opt_nvme_visit_fn fn, void *ctx) {
  /* Compressed m and v are widened for fn: a bounce buffer for the visit
   * only, as checkpoints are rare and the tier's footprint leaves it out. */
  float *bounce = NULL;
  if (o->states != ZT_STATES_FP32 && (bounce = malloc(2 * o->chunk * sizeof(float))) == NULL)
    return zt__errf(o->ctx->err, -ENOMEM, "out of memory");
  int rc = visit_windows(o, import, bounce, fn, ctx);
  free(bounce);
  return rc;
}

int zt__opt_nvme_export(zt__opt_nvme_t *o, zt__opt_nvme_visit_fn fn, void *ctx) {
  if (o == NULL) return 0;
  o->io_error = 0;
  int rc = visit(o, 0, fn, ctx);
  return rc < 0 ? fail(o, rc) : 0;
}

int zt__opt_nvme_import(zt__opt_nvme_t *o, zt__opt_nvme_visit_fn fn, void *ctx) {
  if (o == NULL) return 0;
  o->io_error = 0;
  int rc = visit(o, 1, fn, ctx);
  return rc < 0 ? fail(o, rc) : 0;
}

void zt__opt_nvme_stats(const zt__opt_nvme_t *o, zt__opt_nvme_stats_t *out) {
  if (o == NULL) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = o->st;
}

struct zt__swap *zt__opt_nvme_swap(zt__opt_nvme_t *o) { return o ? o->sw : NULL; }

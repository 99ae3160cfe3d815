/* window.c — windows over a segment list; see window.h. */
#include "cpu/window.h"

int zt__window_next(const zt__seg_t *segs, size_t n_segs, size_t chunk, size_t *j,
                    size_t pos, zt__window_t *w) {
  while (*j < n_segs && segs[*j].index + segs[*j].n <= pos) (*j)++;
  if (*j >= n_segs) return 0;
  const zt__seg_t *s = &segs[*j];
  w->first = pos > s->index ? pos : s->index;
  size_t end = w->first + chunk;
  const zt__seg_t *last = &segs[n_segs - 1];
  if (end > last->index + last->n) end = last->index + last->n;
  w->n = end - w->first;
  w->seg_begin = *j;
  /* The first piece starts at w->first inside segment *j; the last piece
   * ends in the last segment that starts before `end`. */
  w->state_first = s->state_off + (w->first - s->index);
  size_t k = *j;
  while (k + 1 < n_segs && segs[k + 1].index < end) k++;
  const zt__seg_t *e = &segs[k];
  size_t e_end = e->index + e->n < end ? e->index + e->n : end;
  w->state_n = e->state_off + (e_end - e->index) - w->state_first;
  return 1;
}

size_t zt__window_pieces(const zt__seg_t *segs, size_t n_segs, const zt__window_t *w,
                         size_t state_base, zt__seg_t *out) {
  size_t k = 0, end = w->first + w->n;
  for (size_t j = w->seg_begin; j < n_segs && segs[j].index < end; j++) {
    const zt__seg_t *s = &segs[j];
    size_t a, b;
    if (!zt__span_clip(s->index, s->index + s->n, w->first, end, &a, &b)) continue;
    out[k++] = (zt__seg_t){a, s->state_off + (a - s->index) - state_base, b - a, s->decay};
  }
  return k;
}

size_t zt__window_count(const zt__seg_t *segs, size_t n_segs, size_t chunk) {
  size_t j = 0, pos = 0, count = 0;
  zt__window_t w;
  while (zt__window_next(segs, n_segs, chunk, &j, pos, &w)) {
    count++;
    pos = w.first + w.n;
  }
  return count;
}

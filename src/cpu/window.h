/*
 * window.h — windows over a segment list (src/cpu/window.c): the pieces of
 * registered elements that the host and nvme tiers move and update one
 * chunk at a time.
 *
 * A window is [first, first + n) in element (index) space: it starts at a
 * covered element, holds at most `chunk` elements, and may span several
 * segments and the gaps between them (elements no unit covers, which are
 * never read or written). Its pieces are the segments clipped to it. Since
 * states are laid out in index order, the states of a window's pieces are
 * one contiguous run: [state_first, state_first + state_n), with
 * state_n <= n.
 */
#ifndef ZT_WINDOW_H
#define ZT_WINDOW_H

#include <stddef.h>

#include "cpu/cpu_optim.h" // defines: zt__seg_t
#include "base/internal.h"  // defines: ZT_INTERNAL

typedef struct zt__window {
  size_t first, n;       /* element range                               */
  size_t seg_begin;      /* first segment overlapping it                */
  size_t state_first;    /* states of its pieces: one contiguous run    */
  size_t state_n;
} zt__window_t;

/* The window that starts at or after element `pos`, from segment *j on (*j
 * advances past segments that end before pos); 0 when no segment is left. */
ZT_INTERNAL int zt__window_next(const zt__seg_t *segs, size_t n_segs, size_t chunk,
                                size_t *j, size_t pos, zt__window_t *w);

/* The pieces of w, written to out (room for n_segs); returns how many.
 * Their state_off is the segments' own (the state arrays' index) less
 * `state_base`: 0 for states addressed as a whole, w->state_first for a
 * buffer that holds only the window's states. */
ZT_INTERNAL size_t zt__window_pieces(const zt__seg_t *segs, size_t n_segs,
                                     const zt__window_t *w, size_t state_base,
                                     zt__seg_t *out);

/* How many windows cover the segments. */
ZT_INTERNAL size_t zt__window_count(const zt__seg_t *segs, size_t n_segs, size_t chunk);

#endif /* ZT_WINDOW_H */

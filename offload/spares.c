/* spares.c — the size-keyed list of unused buffers of spares.h. */
#include "offload/spares.h"

int zt__spares_find(const zt__spares_t *s, size_t bytes) {
  for (int i = 0; i < s->n; i++)
    if (s->bytes[i] == bytes) return i;
  return -1;
}

void *zt__spares_take(zt__spares_t *s, int i, void **note) {
  ZT_ASSERT(i >= 0 && i < s->n);
  void *buf = s->buf[i];
  if (note) *note = s->note[i];
  s->n--;
  s->buf[i] = s->buf[s->n];
  s->bytes[i] = s->bytes[s->n];
  s->note[i] = s->note[s->n];
  return buf;
}

int zt__spares_put(zt__spares_t *s, void *buf, size_t bytes, void *note) {
  if (s->n >= ZT_SPARES_MAX) return 0;
  s->buf[s->n] = buf;
  s->bytes[s->n] = bytes;
  s->note[s->n++] = note;
  return 1;
}

size_t zt__spares_bytes(const zt__spares_t *s) {
  size_t n = 0;
  for (int i = 0; i < s->n; i++) n += s->bytes[i];
  return n;
}

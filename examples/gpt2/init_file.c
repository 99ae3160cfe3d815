/*
 * examples/gpt2/init_file.c — the random initialisation written to a
 * safetensors file instead of into the parameter buffer, for stage 3.
 *
 * At stage 3 in place, ztier keeps only the groups in use resident, but a
 * loop that fills its whole buffer before registering would hold the whole
 * model once anyway: 6.2 GB for GPT-2 XL in fp32, more than the run needs
 * at any later moment. Written here a piece at a time (the same values as
 * gpt2_init_random, drawn in the same order) and read back by --init's
 * zt_import_safetensors, which also goes a piece at a time, the weights
 * never sit in memory whole; the buffer the loop registers is never
 * written before ztier takes it.
 *
 * The file: an 8-byte little-endian header length, the JSON header (each
 * tensor's dtype, shape and byte range, in table order, padded with spaces
 * to 8 bytes), then the tensors' fp32 bytes. It has no name (O_TMPFILE, or
 * a name unlinked at once): a run that dies leaves nothing the size of the
 * model behind in the swap folder.
 */
#define _GNU_SOURCE // O_TMPFILE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "gpt2.h" // defines: GPT2, GPT2Tensor, gpt2_init_values

// Values drawn and written at a time.
#define PIECE ((size_t)1 << 18)

// The header's JSON: {"name": {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}, ...}, in table order. NULL when out of
// memory.
static char *header_json(const GPT2 *m) {
  cJSON *root = cJSON_CreateObject();
  size_t at = 0;
  for (int i = 0; root && i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    cJSON *x = cJSON_AddObjectToObject(root, t->name);
    cJSON *shape = x ? cJSON_AddArrayToObject(x, "shape") : NULL;
    cJSON *range = shape ? cJSON_AddArrayToObject(x, "data_offsets") : NULL;
    int ok = range && cJSON_AddStringToObject(x, "dtype", "F32");
    for (int d = 0; ok && d < t->ndim; d++)
      ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->shape[d]));
    size_t end = at + t->numel * sizeof(float);
    ok = ok && cJSON_AddItemToArray(range, cJSON_CreateNumber((double)at)) &&
         cJSON_AddItemToArray(range, cJSON_CreateNumber((double)end));
    at = end;
    if (!ok) {
      cJSON_Delete(root);
      root = NULL;
    }
  }
  char *json = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return json;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

// A file in dir with no name, open for reading and writing; -1 on failure.
static int open_unnamed(const char *dir) {
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/gpt2-init.XXXXXX", dir) >= sizeof path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  fd = mkostemp(path, O_CLOEXEC);
  if (fd >= 0) unlink(path);
  return fd;
}

int gpt2_init_random_file(const GPT2 *m, uint64_t seed, const char *dir) {
  char *json = header_json(m);
  float *piece = malloc(PIECE * sizeof(float));
  int fd = json && piece ? open_unnamed(dir) : -1;
  FILE *f = fd >= 0 ? fdopen(dup(fd), "wb") : NULL;
  int ok = f != NULL;
  if (ok) {
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    unsigned char size[8];
    for (int i = 0; i < 8; i++) size[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    ok = write_all(f, size, 8) && write_all(f, json, len) &&
         write_all(f, "        ", padded - len);
  }
  // Tensor after tensor in table order, as gpt2_init_random draws them.
  for (int i = 0; ok && i < m->num_tensors; i++) {
    const GPT2Tensor *t = &m->tensors[i];
    for (size_t j = 0; ok && j < t->numel; j += PIECE) {
      size_t n = t->numel - j < PIECE ? t->numel - j : PIECE;
      gpt2_init_values(m, t, &seed, piece, n);
      ok = write_all(f, piece, n * sizeof(float));
    }
  }
  int err = errno;
  if (f && fclose(f) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (!ok) {
    fprintf(stderr, "gpt2: cannot write the initial weights to a file in %s: %s\n", dir,
            json && piece ? strerror(err) : "out of memory");
    if (fd >= 0) close(fd);
    fd = -1;
  }
  free(json);
  free(piece);
  return fd;
}

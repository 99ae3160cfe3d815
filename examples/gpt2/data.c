/*
 * examples/gpt2/data.c — the token ids a run trains on, from a file: the
 * bytes of a text (one token per byte, V 256), raw little-endian uint16 or
 * uint32 ids in one flat file, or llm.c's token files (a header of 256
 * int32, magic 20240520, version 1, the token count; then uint16 ids).
 * Or a text cut into GPT-2's BPE tokens (gpt2_load_text, with a tokenizer
 * of bpe.h). Every id is checked against the model's vocabulary here, so
 * the forward never indexes past wte.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"  // defines: gpt2_bpe_encode
#include "gpt2.h" // defines: GPT2Tokens

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES (256 * 4)

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    rewind(f);
    buf = len > 0 ? malloc((size_t)len) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
      free(buf);
      buf = NULL;
    }
    *n = buf ? (size_t)len : 0;
  }
  fclose(f);
  return buf;
}

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// The file's bytes, or NULL with a sentence on stderr.
static unsigned char *read_file(const char *path, size_t *n) {
  unsigned char *raw = slurp(path, n);
  if (raw == NULL)
    fprintf(stderr, "gpt2: %s: %s\n", path, *n ? "cannot read it" : strerror(errno ? errno : EIO));
  return raw;
}

int gpt2_load_tokens(const char *path, const char *format, int vocab, GPT2Tokens *out) {
  memset(out, 0, sizeof *out);
  size_t n = 0;
  unsigned char *raw = read_file(path, &n);
  if (raw == NULL) return -1;
  size_t width = 1, skip = 0, count;
  if (strcmp(format, "bytes") == 0) {
    width = 1;
  } else if (strcmp(format, "u16") == 0) {
    width = 2;
  } else if (strcmp(format, "u32") == 0) {
    width = 4;
  } else if (strcmp(format, "llmc") == 0) {
    width = 2;
    skip = LLMC_HEADER_BYTES;
    if (n < skip || le32(raw) != LLMC_MAGIC || le32(raw + 4) != 1) {
      fprintf(stderr, "gpt2: %s is not an llm.c token file (magic %d, version 1)\n", path,
              LLMC_MAGIC);
      free(raw);
      return -1;
    }
  } else {
    fprintf(stderr, "gpt2: --token-format %s: expected bytes, u16, u32 or llmc\n", format);
    free(raw);
    return -1;
  }
  if ((n - skip) % width != 0 ||
      (skip && le32(raw + 8) != (n - skip) / width)) {
    fprintf(stderr, "gpt2: %s holds %zu bytes of ids; expected a whole number of %zu-byte ids%s\n",
            path, n - skip, width, skip ? ", as many as its header counts" : "");
    free(raw);
    return -1;
  }
  count = (n - skip) / width;
  out->ids = malloc((count ? count : 1) * sizeof *out->ids);
  if (out->ids == NULL) {
    fprintf(stderr, "gpt2: out of memory\n");
    free(raw);
    return -1;
  }
  const unsigned char *p = raw + skip;
  for (size_t i = 0; i < count; i++) {
    uint32_t id = width == 1 ? p[i] : width == 2 ? (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8
                                                : le32(p + 4 * i);
    if (id >= (uint32_t)vocab) {
      fprintf(stderr, "gpt2: %s: token %zu is %u; the model's vocabulary is %d (--size)\n",
              path, i, id, vocab);
      free(raw);
      gpt2_free_tokens(out);
      return -1;
    }
    out->ids[i] = (int)id;
  }
  out->n = count;
  free(raw);
  return 0;
}

int gpt2_load_text(const char *path, const GPT2Bpe *bpe, int vocab, GPT2Tokens *out) {
  memset(out, 0, sizeof *out);
  size_t n = 0;
  unsigned char *raw = read_file(path, &n);
  if (raw == NULL) return -1;
  uint32_t *ids = NULL;
  size_t count = 0;
  int rc = gpt2_bpe_encode(bpe, (const char *)raw, n, &ids, &count);
  free(raw);
  if (rc == 0 && (out->ids = malloc((count ? count : 1) * sizeof *out->ids)) == NULL)
    rc = -ENOMEM;
  for (size_t i = 0; rc == 0 && i < count; i++) {
    if (ids[i] >= (uint32_t)vocab) {
      fprintf(stderr, "gpt2: %s: token %zu is %u; the model's vocabulary is %d (--size), "
                      "smaller than the tokenizer's (%zu)\n",
              path, i, ids[i], vocab, gpt2_bpe_vocab_size(bpe));
      rc = -EINVAL;
      break;
    }
    out->ids[i] = (int)ids[i];
  }
  free(ids);
  if (rc == -ENOMEM) fprintf(stderr, "gpt2: out of memory\n");
  if (rc) {
    gpt2_free_tokens(out);
    return -1;
  }
  out->n = count;
  return 0;
}

void gpt2_free_tokens(GPT2Tokens *t) {
  free(t->ids);
  memset(t, 0, sizeof *t);
}

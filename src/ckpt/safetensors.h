/*
 * safetensors.h — the safetensors file format (docs/checkpoints.md,
 * "Safetensors export"): a streaming writer, to export parameters, and a
 * header parser that trusts nothing, for `ztier ckpt info` and fuzzing.
 *
 * A file is: N as 8 bytes, a little-endian u64; N bytes of UTF-8 JSON, the
 * header; then the data. The header is one object: an optional
 * "__metadata__" object of string values, and one member per tensor,
 *
 *   "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [b, e]}
 *
 * where [b, e) are the tensor's bytes counted from the data's start (8 + N),
 * little-endian, row-major. The tensors tile the data: in the order of their
 * offsets each begins where the one before ends, the first at 0, the last at
 * the file's end. The writer pads the header with spaces so that the data
 * starts at a multiple of 8 bytes (readers may map it and read the tensors
 * in place); the parser accepts any header length.
 *
 * The parser knows every dtype of the format (F64, F32, F16, BF16, the
 * integers I64 to U8, BOOL, C64, the 8-bit floats F8_*, the packed F6_* and
 * F4). zt__st_parse_header accepts only the dtypes ztier holds, F32, BF16
 * and F16 (zt_dtype_t), and names any other tensor; zt__st_parse with
 * ZT__ST_ANY_DTYPE accepts them all, for listing (`ztier ckpt info`). The
 * writer writes the three ztier holds.
 *
 * The writer holds the header text until it is written at open and never
 * any tensor data: the caller streams the bytes through it in pieces of any
 * size, tensor after tensor, and it counts them.
 *
 * Threading: none inside. A writer is used by one thread at a time; parsing
 * is pure over its arguments.
 */
#ifndef ZT_SAFETENSORS_H
#define ZT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t, zt_dtype_t

/* Dimensions a tensor may have here (0 is a scalar of one element). */
#define ZT__ST_MAX_DIMS 8
/* The longest header the parser reads: the reference implementation's
 * limit, so every file it writes is read here and a damaged length cannot
 * ask for gigabytes. */
#define ZT__ST_HEADER_MAX ((uint64_t)100000000)

/* A tensor to write. */
typedef struct zt__st_spec {
  const char *name; /* non-empty, valid UTF-8, not "__metadata__"; copied */
  zt_dtype_t dtype;
  int ndim;                        /* 0 to ZT__ST_MAX_DIMS            */
  uint64_t shape[ZT__ST_MAX_DIMS]; /* shape[0..ndim)                  */
} zt__st_spec_t;

/* A tensor the parser found. */
typedef struct zt__st_tensor {
  char *name;             /* owned by the header; UTF-8                       */
  const char *dtype_name; /* the header's dtype, "F32", "I64", ...; static     */
  int held;               /* 1: a dtype ztier holds, and `dtype` is it         */
  zt_dtype_t dtype;       /* only when held                                    */
  int ndim;
  uint64_t shape[ZT__ST_MAX_DIMS];
  uint64_t begin, end; /* data_offsets: bytes from the data's start */
} zt__st_tensor_t;

/* A parsed header. */
typedef struct zt__st_header {
  zt__st_tensor_t *tensors; /* owned; in data order (ascending begin)     */
  size_t n_tensors;
  char **meta;              /* owned; meta[2i] a key, meta[2i+1] its value,
                             * in header order                            */
  size_t n_meta;            /* pairs                                      */
  uint64_t header_bytes;    /* N                                          */
  uint64_t data_start;      /* 8 + N                                      */
  uint64_t data_bytes;      /* file size - data_start: what the tensors tile */
} zt__st_header_t;

/* "F32", "BF16", "F16", or NULL for an invalid value. */
ZT_INTERNAL const char *zt__st_dtype_name(zt_dtype_t dt);

/* ---- reading --------------------------------------------------------------- */

/* From a file's first 8 bytes (`len` >= 8 given, of a `file_size`-byte file),
 * the bytes the caller must read for zt__st_parse_header: 8 + N, into *out.
 * Checks N against ZT__ST_HEADER_MAX and the file's size. Returns 0 or
 * ZT_ECKPT with a sentence naming `where`. */
ZT_INTERNAL int zt__st_header_size(const void *prefix, size_t len, uint64_t file_size,
                                   const char *where, zt__err_t *e, uint64_t *out);

/* Parses a safetensors header: `buf` holds the file's first `len` bytes
 * (at least 8 + N; all of them for a file in memory), `file_size` is the
 * whole file's. Checks everything the header says against itself and the
 * file's size: the length, UTF-8, one JSON object, each member's fields,
 * dtype one ztier holds (else ZT_ECKPT naming the tensor and its dtype),
 * shape product * dtype size == e - b without overflow, names
 * unique, and the tensors tiling the data exactly. Returns 0 with *h filled
 * (free with zt__st_header_free), ZT_ECKPT with a sentence naming `where`,
 * the tensor and what is wrong, -EINVAL when `len` is short of 8 + N, or
 * -ENOMEM; on failure *h is left zeroed. Synchronous, pure. */
ZT_INTERNAL int zt__st_parse_header(zt__st_header_t *h, const void *buf, size_t len,
                                    uint64_t file_size, const char *where, zt__err_t *e);

/* Flags of zt__st_parse. */
#define ZT__ST_ANY_DTYPE 1u /* accept every dtype of the format; `held` tells ztier's */

/* zt__st_parse_header with `flags`: 0 is zt__st_parse_header itself;
 * ZT__ST_ANY_DTYPE lists tensors of any safetensors dtype, checked the same
 * way (a dtype the format does not define is still refused). */
ZT_INTERNAL int zt__st_parse(zt__st_header_t *h, const void *buf, size_t len,
                             uint64_t file_size, unsigned flags, const char *where,
                             zt__err_t *e);

/* Frees what *h owns and zeroes it; safe on a zeroed or parsed header. */
ZT_INTERNAL void zt__st_header_free(zt__st_header_t *h);

/* ---- writing --------------------------------------------------------------- */

typedef struct zt__st_writer zt__st_writer_t;

/* Starts a safetensors file on `fd` (opened for writing by the caller, who
 * keeps it; written from its current offset with write(2)) holding the
 * tensors t[0..n) in that order, with the metadata pairs meta[0..2 n_meta)
 * (key, value, key, value...; keys unique). Every offset is computed and the
 * whole header written before it returns. `path` names the file in
 * messages; it, the names and the metadata are copied. Returns 0 with *out
 * set, -EINVAL for a bad table (naming the tensor), -errno of write(2), or
 * -ENOMEM, with a sentence in `e`; on failure *out is NULL. `e` stays in use
 * until zt__st_writer_close. */
ZT_INTERNAL int zt__st_writer_open(int fd, const char *path, const zt__st_spec_t *t, size_t n,
                                   const char *const *meta, size_t n_meta, zt__err_t *e,
                                   zt__st_writer_t **out);

/* The file's size once finished: 8 + N + the tensors' bytes. */
ZT_INTERNAL uint64_t zt__st_writer_size(const zt__st_writer_t *w);

/* Writes the next `bytes` bytes of tensor data (the tensors' bytes one after
 * another, in table order, split anywhere). Returns 0; -EINVAL when that
 * would pass the last tensor's end (nothing written); -errno of write(2).
 * After a failure only zt__st_writer_close is allowed. */
ZT_INTERNAL int zt__st_write(zt__st_writer_t *w, const void *buf, size_t bytes);

/* Checks that every announced byte was written: 0, or -EINVAL naming the
 * first tensor short of its bytes. Neither syncs nor closes the fd. */
ZT_INTERNAL int zt__st_finish(zt__st_writer_t *w);

/* Frees the writer (not the fd); NULL does nothing. */
ZT_INTERNAL void zt__st_writer_close(zt__st_writer_t *w);

#endif /* ZT_SAFETENSORS_H */

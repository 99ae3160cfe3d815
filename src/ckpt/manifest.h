/*
 * manifest.h — a checkpoint's manifest.json (docs/checkpoints.md): what the
 * checkpoint holds and where, as a plain struct, and its JSON form both
 * ways (cJSON). The parser trusts nothing: every field is checked for
 * presence, type and range, and the files are checked against each other
 * (they tile [0, state_numel) without gap or overlap) and against the unit
 * table (units inside the registered buffer, in state order, end to end).
 *
 * A rank file holds the elements [begin, end) of the state space, section
 * after section: fp32 master, fp32 m, fp32 v, then the parameters in
 * param_dtype when that is not fp32 (fp32 parameters are the master).
 *
 * Threading: none; every call is pure over its arguments.
 */
#ifndef ZT_MANIFEST_H
#define ZT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt__err_t, zt_dtype_t

#define ZT_CKPT_FORMAT "ztier-checkpoint"
/* The newest version. 2: the manifest carries its own checksum and rank
 * files a trailer. 3: a unit may carry its shape (zt_set_shape); the rank
 * files are version 2's. A save writes 3 where a unit has a shape, else 2.
 * Versions 1 to 3 are read. */
#define ZT_CKPT_VERSION 3
#define ZT_CKPT_VERSION_MIN 1
/* Bytes of a rank file's trailer (version 2 on); ckpt.h has its layout. */
#define ZT_CKPT_TRAILER 128
#define ZT_CKPT_MANIFEST "manifest.json"
/* The lock a save holds on its directory (flock), holding the saver's pid
 * and host: one writer at a time. */
#define ZT_CKPT_LOCK "save.lock"
/* Names in the manifest: file names and unit names. */
#define ZT_CKPT_NAME_MAX 255

typedef struct zt__ckpt_unit {
  char *name; /* owned */
  uint64_t offset, numel, state_off;
  int group, weight_decay;
  int ndim;                    /* 0: none (version 3 on: "shape" absent) */
  uint64_t shape[ZT_MAX_DIMS]; /* shape[0..ndim), product numel          */
} zt__ckpt_unit_t;

typedef struct zt__ckpt_file {
  char *name;     /* owned; a plain file name in the checkpoint directory */
  int rank;       /* the rank that wrote it                               */
  uint64_t begin, end; /* its elements of the state space                */
  uint64_t bytes; /* its size                                             */
  uint64_t xxh64; /* XXH3-64 of its whole content                         */
} zt__ckpt_file_t;

typedef struct zt__manifest {
  int version;      /* ZT_CKPT_VERSION_MIN to ZT_CKPT_VERSION             */
  uint64_t generation; /* counts saves into one directory, from 1         */
  int world, stage; /* of the engine that saved                           */
  zt_dtype_t param_dtype;
  uint64_t numel;       /* elements of the registered buffer              */
  uint64_t state_numel; /* elements the units cover (the state space)     */

  /* The optimizer's scalar state. */
  uint64_t steps, skipped_steps;
  double loss_scale, loss_scale_handed;
  int loss_scale_dynamic, good_steps;
  uint64_t seed; /* stochastic rounding's                                 */
  int rounding;  /* zt_rounding_t                                         */

  zt__ckpt_unit_t *units; /* owned; in state order */
  size_t n_units;
  zt__ckpt_file_t *files; /* owned; ascending begin */
  size_t n_files;

  /* Version 2: XXH3-64 of the manifest's text with this value's 16 hex
   * digits read as "0000000000000000" (zt__manifest_check_sum). to_json
   * computes it; parse reads it. */
  uint64_t checksum;
} zt__manifest_t;

/* Bytes of the sections of a rank file holding `n` elements (n below 2^53:
 * no overflow); version 2 files have ZT_CKPT_TRAILER more. */
ZT_INTERNAL uint64_t zt__manifest_file_bytes(zt_dtype_t param_dtype, uint64_t n);

/* Checks the text `json` (len bytes), parsed into *m, against m->checksum:
 * 0, or ZT_ECKPT with a sentence naming `where` when the text changed since
 * it was written (or the checksum is not where ztier writes it). Version 1
 * manifests carry none: 0. */
ZT_INTERNAL int zt__manifest_check_sum(const char *json, size_t len, const zt__manifest_t *m,
                                       const char *where, zt__err_t *e);

/* The manifest as JSON, NUL-terminated, malloc'ed into *out: one field per
 * line, one unit or file per line, in the form of m->version (version 2
 * ends with its checksum, computed here). It does not check *m (parse
 * does): what parse accepted comes back from to_json then parse identical,
 * doubles included. Returns 0 or -ENOMEM (*out NULL). */
ZT_INTERNAL int zt__manifest_to_json(const zt__manifest_t *m, char **out);

/* Parses `len` bytes of JSON (not NUL-terminated) into *m, all of it checked
 * as the header comment says; *m is overwritten, not freed first. `where`
 * names the file in messages. It does not check the checksum
 * (zt__manifest_check_sum does, on the same text). Returns 0, or ZT_ECKPT
 * for anything malformed or of another format version, with a sentence in `e` naming `where` and
 * the field by its path (files[2].begin), or -ENOMEM; on failure *m is left
 * zeroed. */
ZT_INTERNAL int zt__manifest_parse(zt__manifest_t *m, const char *json, size_t len,
                                   const char *where, zt__err_t *e);

/* Frees what *m owns and zeroes it; safe on a zeroed or parsed manifest. */
ZT_INTERNAL void zt__manifest_free(zt__manifest_t *m);

#endif /* ZT_MANIFEST_H */

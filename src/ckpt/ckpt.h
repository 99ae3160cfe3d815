/*
 * ckpt.h — what zt_save (src/ckpt/save.c), zt_load (src/ckpt/load.c) and
 * consolidation (src/ckpt/consolidate.c) share: the rank file's layout and
 * checksum (src/ckpt/rankfile.c), and this rank's states and parameters reached
 * in whatever tier the engine keeps them (src/ckpt/tiers.c).
 *
 * A rank file holds the states [begin, end) of the state space, n = end -
 * begin of them, section after section: fp32 master, fp32 m, fp32 v, and
 * the parameters in the param dtype when that is not fp32 (fp32 parameters
 * are the master). Since format version 2 a trailer of ZT_CKPT_TRAILER
 * bytes follows: what the saving engine's scalars were, for the manifest to
 * be checked against (the sections keep the offsets of version 1). Its
 * checksum is XXH3-64 over little-endian u64s: the sections' own XXH3-64
 * digests in section order, 0 for an absent section (four), then, in
 * version 2, the XXH3-64 of the trailer's bytes (five). Each section is
 * hashed as it is written, in order, and read back in order when verified.
 */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/internal.h" // defines: ZT_INTERNAL, zt_engine_t, zt__err_t

#define ZT_CKPT_SECTIONS 4
enum { ZT_CKPT_MASTER = 0, ZT_CKPT_M = 1, ZT_CKPT_V = 2, ZT_CKPT_PARAMS = 3 };

/* Sections in a file of this param dtype (3 for fp32, else 4), and where
 * section `s` of a file of n states starts, with its element size. */
ZT_INTERNAL int zt__ckpt_sections(zt_dtype_t param_dtype);
ZT_INTERNAL uint64_t zt__ckpt_section_off(zt_dtype_t param_dtype, uint64_t n, int s);
ZT_INTERNAL size_t zt__ckpt_section_esz(zt_dtype_t param_dtype, int s);

/* ---- the trailer (rankfile.c) ---------------------------------------------- */

/* A rank file's trailer (version 2), decoded. On disk, ZT_CKPT_TRAILER
 * bytes, every integer little-endian: "ZTRANK02", then u64 nonce,
 * generation, begin, end, steps, skipped_steps, seed; the IEEE bits of
 * loss_scale and loss_scale_handed as u64; u32 rank, world, stage,
 * param_dtype, rounding, loss_scale_dynamic, good_steps; zeros to the end. */
typedef struct zt__ckpt_trailer {
  uint64_t nonce; /* the save's, also in the lock file while it runs */
  uint64_t generation, begin, end, steps, skipped_steps, seed;
  double loss_scale, loss_scale_handed;
  int rank, world, stage, param_dtype, rounding, loss_scale_dynamic, good_steps;
} zt__ckpt_trailer_t;

struct zt__manifest;

/* The trailer of files[i] of `m` against the manifest: ZT_ECKPT with a
 * sentence naming `where` (the manifest's path), the field, both values
 * and the file when one differs (the manifest changed after the save). */
ZT_INTERNAL int zt__ckpt_check_trailer(const struct zt__manifest *m, size_t i,
                                       const zt__ckpt_trailer_t *t, const char *where,
                                       zt__err_t *e);

/* ---- writing a rank file (rankfile.c) ---------------------------------------- */

typedef struct zt__ckpt_writer zt__ckpt_writer_t;

/* Creates `path` (truncating a leftover of a crashed save) sized for n
 * states. Returns 0 or -errno with a sentence in `e` naming the path. */
ZT_INTERNAL int zt__ckpt_writer_open(const char *path, zt_dtype_t param_dtype, uint64_t n,
                                     zt__err_t *e, zt__ckpt_writer_t **out);
/* Elements [i, i + count) of section s, from `data`; each section's pieces
 * come in order, the sections in any interleaving. */
ZT_INTERNAL int zt__ckpt_writer_put(zt__ckpt_writer_t *w, int s, uint64_t i, uint64_t count,
                                    const void *data);
/* Checks every section is complete, writes the trailer `t`, fsyncs,
 * closes: *digest is the file's checksum. Frees w whatever the outcome. */
ZT_INTERNAL int zt__ckpt_writer_finish(zt__ckpt_writer_t *w, const zt__ckpt_trailer_t *t,
                                       uint64_t *digest);
/* Closes (after a failure: the caller removes the file). NULL: nothing. */
ZT_INTERNAL void zt__ckpt_writer_abort(zt__ckpt_writer_t *w);

/* Reads `path` whole and checks its size and checksum against the
 * manifest's: ZT_ECKPT for a missing or truncated file, ZT_ECHECKSUM for a
 * changed byte, with a sentence naming the file. A file of format version 2
 * or later has a trailer: decoded into *t (NULL: not returned); version 1
 * files have none, and *t is zeroed. */
ZT_INTERNAL int zt__ckpt_verify(const char *path, int version, zt_dtype_t param_dtype,
                                uint64_t n, uint64_t bytes, uint64_t digest,
                                zt__ckpt_trailer_t *t, zt__err_t *e);

/* The cheap look at a rank file of n states that should have `bytes`: its
 * size and its trailer (one read of its last bytes), not its checksum.
 * Returns 0, -errno (-ENOENT: missing) or ZT_ECKPT for a wrong size or no
 * trailer, with a sentence naming the file. *t: the trailer where one was
 * found (a short file's last bytes are tried), else zeroed (nonce 0). */
ZT_INTERNAL int zt__ckpt_peek(const char *path, zt_dtype_t param_dtype, uint64_t n,
                              uint64_t bytes, zt__ckpt_trailer_t *t, zt__err_t *e);

/* For tests: called with `path` on every rank right after its file of a
 * save is renamed into place, before the rank reads it back (when 0), and
 * on rank 0 for each file before it checks it for the commit (when 1).
 * NULL: none (the default). */
typedef void (*zt__ckpt_save_hook_fn)(void *arg, int when, const char *path);
ZT_INTERNAL void zt__ckpt_set_save_hook(zt__ckpt_save_hook_fn fn, void *arg);

/* pread of exactly `len` bytes, or a sentence naming the file (short: the
 * file was truncated after it was verified). */
ZT_INTERNAL int zt__ckpt_pread(int fd, const char *path, void *buf, size_t len, uint64_t off,
                               zt__err_t *e);

/* Makes dir's entries durable (fsync of the directory). */
ZT_INTERNAL int zt__ckpt_fsync_dir(const char *dir, zt__err_t *e);

/* ---- a saved checkpoint, read (source.c) ---------------------------------------- */

/* dir/manifest.json, parsed and checked, its own checksum included:
 * ZT_ECKPT naming it when it is missing, malformed or changed. */
ZT_INTERNAL int zt__ckpt_read_manifest(const char *dir, struct zt__manifest *m,
                                       zt__err_t *e);

/* zt__ckpt_verify of file i of `m` in `dir` (size and checksum), and, from
 * format 2 on, its trailer against the manifest. */
ZT_INTERNAL int zt__ckpt_verify_file(const char *dir, const struct zt__manifest *m, size_t i,
                                     zt__err_t *e);
/* zt__ckpt_verify_file of every file of `m` in `dir` holding part of states
 * [lo, hi), and each trailer against the manifest: the first bad one's
 * error. */
ZT_INTERNAL int zt__ckpt_verify_range(const char *dir, const struct zt__manifest *m,
                                      uint64_t lo, uint64_t hi, zt__err_t *e);

typedef struct zt__ckpt_src zt__ckpt_src_t;
/* Reads from the files of `m` in `dir` (m stays the caller's). */
ZT_INTERNAL int zt__ckpt_src_open(const char *dir, const struct zt__manifest *m,
                                  zt__err_t *e, zt__ckpt_src_t **out);
/* Section `section` of states [a, a + n) into dst, from every file holding
 * part of it. */
ZT_INTERNAL int zt__ckpt_src_read(zt__ckpt_src_t *s, int section, uint64_t a, uint64_t n,
                                  void *dst);
ZT_INTERNAL void zt__ckpt_src_close(zt__ckpt_src_t *s); /* NULL: nothing */

/* ---- export (consolidate.c) --------------------------------------------------- */

/* Writes the checkpoint in `dir` as safetensors file `out`: one tensor per
 * unit (of the unit's shape, [numel] where it has none; the fp32 master,
 * or rounded to nearest-even bf16),
 * in state order, with metadata format, producer, ztier_generation and
 * ztier_steps. Every rank file is verified first; the data goes to a
 * temporary name of its own (out.tmp-XXXXXX), fsynced, renamed. An `out`
 * inside `dir` or one that exists is refused (-EEXIST) unless `force`; a
 * file the checkpoint uses (its manifest, a rank file, the lock, by any
 * name) is refused always. `progress` (NULL: none) gets a line every
 * 10 %. *size: the file's bytes. 0, or a negative code with a sentence. */
ZT_INTERNAL int zt__ckpt_consolidate(const char *dir, const char *out, zt_dtype_t out_dt,
                                     int force, FILE *progress, uint64_t *size,
                                     zt__err_t *e);

/* zt__ckpt_consolidate as Hugging Face shards it: the same tensors, in unit
 * order, in files "<out_dir>/model-00001-of-0000N.safetensors" (1-based,
 * five digits), each holding at most `max_shard` bytes of tensor data (its
 * header comes on top; a unit larger than that goes alone in its shard),
 * and "<out_dir>/model.safetensors.index.json":
 * {"metadata": {"total_size": <the tensors' bytes>}, "weight_map":
 * {"<unit>": "<its shard's file name>", ...}}. `out_dir` is made when it
 * does not exist (and removed again, if still empty, on failure). Each file
 * is refused, or kept from the checkpoint, as `out` is above; all are
 * written whole under temporary names first, then renamed, the index
 * last. A failure while renaming may leave earlier shards in place, but
 * never an index without its shards. *n_shards: N; *size: the shards'
 * bytes together. 0, or a negative code with a sentence (-EINVAL for
 * max_shard 0). */
ZT_INTERNAL int zt__ckpt_consolidate_shards(const char *dir, const char *out_dir,
                                            zt_dtype_t out_dt, uint64_t max_shard, int force,
                                            FILE *progress, size_t *n_shards, uint64_t *size,
                                            zt__err_t *e);

/* The writer both exports share (consolidate.c): the units of `m`, in state
 * order, into one safetensors file `out` (max_shard 0) or Hugging Face's
 * shards and index in directory `out`, as zt__ckpt_consolidate_shards
 * describes them; every file under a temporary name until the commit.
 * `dir` is the checkpoint exported, whose files an OUT may never be; NULL
 * for a live engine's export (then only an existing OUT, unforced, and a
 * directory are refused). `meta` pairs as zt__st_writer_open; `m`, `out`
 * and `meta` stay the caller's until the commit or the abort. */
typedef struct zt__ckpt_export zt__ckpt_export_t;
ZT_INTERNAL int zt__ckpt_export_open(const char *dir, const struct zt__manifest *m,
                                     const char *out, zt_dtype_t dt, uint64_t max_shard,
                                     int force, const char *const *meta, size_t n_meta,
                                     FILE *progress, zt__err_t *e, zt__ckpt_export_t **x);
/* The next n states' fp32 values, in state order, any piece size. */
ZT_INTERNAL int zt__ckpt_export_put(zt__ckpt_export_t *x, const float *v, size_t n);
/* Every state put: the index, then the files renamed into place (the index
 * last) and made durable. *size: the files' bytes; *n_files (NULL: not
 * asked): the shards. Frees x whatever the outcome. */
ZT_INTERNAL int zt__ckpt_export_commit(zt__ckpt_export_t *x, uint64_t *size, size_t *n_files);
/* Gives up: removes the temporary files and a directory it made (if still
 * empty), frees x. NULL: nothing. */
ZT_INTERNAL void zt__ckpt_export_abort(zt__ckpt_export_t *x);

/* A live engine's parameters exported as zt__ckpt_export writes them: the
 * fp32 master of every unit, read from the tier that holds it, a piece at a
 * time. Collective: every rank calls it, with `local` its own refusal of
 * the call (0, or a code whose sentence is written), which every rank then
 * returns; each rank sends its shard, in state order, to rank 0, which
 * alone writes. Every rank returns the same: 0, or the lowest failing
 * rank's code (export_live.c). */
ZT_INTERNAL int zt__ckpt_export_engine(zt_engine_t *eng, int local, const char *out,
                                       zt_dtype_t dt, uint64_t max_shard, int force);

/* Every rank's status of a stage of a collective call (0, or a negative
 * code whose sentence this rank wrote), exchanged: 0 when every rank's is
 * 0, else the lowest failing rank's code, with the sentence "<fn>: rank R
 * <what> (...)" on the ranks that did not fail (vote.c). */
ZT_INTERNAL int zt__ckpt_vote(zt_engine_t *eng, int mine, const char *fn, const char *what);

/* For tests: 1 makes zt__ckpt_consolidate commit OUT as on a file system
 * with neither RENAME_NOREPLACE nor hard links; 0 (the default) undoes it. */
ZT_INTERNAL void zt__ckpt_consolidate_plain_fs(int on);

/* ---- names (save.c) -------------------------------------------------- */

/* "<dir>/g<gen>-r<rank>.zts<suffix>" (dir NULL: the bare name), or
 * -ENAMETOOLONG. */
ZT_INTERNAL int zt__ckpt_name(char *buf, size_t n, const char *dir, uint64_t gen, int rank,
                              const char *suffix);

/* ---- this rank's states and parameters (tiers.c) ------------------------------ */

/* The states this rank holds: [*lo, *hi) of the state space (its shard, or
 * all of them unpartitioned). */
ZT_INTERNAL void zt__ckpt_state_range(const zt_engine_t *eng, size_t *lo, size_t *hi);

/* Visits the rank's states in order, in pieces [a, a + n) with master, m and
 * v in host memory: export hands over what the tier holds, import lets fn
 * fill them and puts them in the tier. master is NULL where the fp32
 * parameters are the master (the parameters carry it). */
typedef int (*zt__ckpt_piece_fn)(void *ctx, size_t a, size_t n, float *master, float *m,
                                 float *v);
ZT_INTERNAL int zt__ckpt_walk_states(zt_engine_t *eng, int import, zt__ckpt_piece_fn fn,
                                     void *ctx);

/* The parameters of states [a, b), where this rank keeps them (its shard at
 * stage 3, the registered buffer below), to and from host memory. Puts come
 * in state order over the whole range the rank loads, then params_done. */
ZT_INTERNAL int zt__ckpt_params_get(zt_engine_t *eng, size_t a, size_t b, void *dst);
ZT_INTERNAL int zt__ckpt_params_put(zt_engine_t *eng, size_t a, size_t b, const void *src);
ZT_INTERNAL int zt__ckpt_params_done(zt_engine_t *eng);

/* Elements per piece that save and load move at once. */
#define ZT_CKPT_PIECE ((size_t)1 << 18)

#endif /* ZT_CKPT_H */

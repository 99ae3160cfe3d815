/*
 * src/tool/ckpt.c — `ztier ckpt`: what a checkpoint holds, its files'
 * checksums verified (`info`), and its parameters exported as one
 * safetensors file that other tools read, or as Hugging Face's shards and
 * index with --max-shard-size (`consolidate`).
 *
 * consolidate is src/ckpt/consolidate.c's; this prints its peak RSS, a few MiB
 * whatever the model's size.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h> // defines: cJSON (info --json)

#include "ckpt/ckpt.h"        // defines: zt__ckpt_read_manifest, zt__ckpt_consolidate
#include "ckpt/manifest.h"    // defines: zt__manifest_t
#include "ckpt/safetensors.h" // defines: zt__st_*
#include "tool/args.h"            // defines: tool_args_parse
#include "tool/progress.h"        // defines: tool_progress_stream
#include "tool/report.h"          // defines: tool_report_*, tool_table_*

int tool_ckpt_main(int argc, char **argv);

static const char *err(void) { return zt_last_error(NULL); }


static double peak_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* Verifies every file of the manifest, printing one line each, or adding
 * one object each to `arr` when it is not NULL. 0: all good. */
static int verify_all(const char *dir, const zt__manifest_t *m, cJSON *arr) {
  int bad = 0;
  for (size_t i = 0; i < m->n_files; i++) {
    const zt__ckpt_file_t *f = &m->files[i];
    int rc = zt__ckpt_verify_file(dir, m, i, zt__err_thread());
    if (arr) {
      char hex[17];
      snprintf(hex, sizeof hex, "%016llx", (unsigned long long)f->xxh64);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "name", f->name);
      cJSON_AddNumberToObject(o, "rank", f->rank);
      cJSON_AddNumberToObject(o, "begin", (double)f->begin);
      cJSON_AddNumberToObject(o, "end", (double)f->end);
      cJSON_AddNumberToObject(o, "bytes", (double)f->bytes);
      cJSON_AddStringToObject(o, "xxh64", hex); /* 64 bits: a JSON number would round */
      cJSON_AddBoolToObject(o, "ok", rc == 0);
      if (rc < 0) cJSON_AddStringToObject(o, "error", err());
      cJSON_AddItemToArray(arr, o);
    } else {
      printf("  %-22s rank %-4d states [%llu, %llu)  %llu bytes  xxh64 %016llx  %s\n",
             f->name, f->rank, (unsigned long long)f->begin, (unsigned long long)f->end,
             (unsigned long long)f->bytes, (unsigned long long)f->xxh64,
             rc == 0 ? "ok" : "BAD");
    }
    if (rc < 0) {
      fprintf(stderr, "ztier ckpt: %s\n", err());
      bad = 1;
    }
  }
  return bad;
}

/* ---- info ------------------------------------------------------------------------ */

/* Prints `o` as one line of JSON and frees it. */
static void print_json(cJSON *o) { tool_report_print(stdout, o, "ztier ckpt info"); }

static int info_safetensors(const char *path, int json) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    fprintf(stderr, "ztier ckpt info: %s: %s\n", path, strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  unsigned char prefix[8];
  uint64_t need = 0;
  char *buf = NULL;
  zt__st_header_t h = {0};
  int rc = zt__ckpt_pread(fd, path, prefix, sizeof prefix, 0, zt__err_thread());
  if (rc == 0)
    rc = zt__st_header_size(prefix, sizeof prefix, (uint64_t)st.st_size, path,
                            zt__err_thread(), &need);
  if (rc == 0 && (buf = malloc(need)) == NULL) rc = -ENOMEM;
  if (rc == 0) rc = zt__ckpt_pread(fd, path, buf, need, 0, zt__err_thread());
  if (rc == 0)
    rc = zt__st_parse(&h, buf, need, (uint64_t)st.st_size, ZT__ST_ANY_DTYPE, path,
                      zt__err_thread());
  close(fd);
  free(buf);
  if (rc < 0) {
    fprintf(stderr, "ztier ckpt info: %s\n", rc == -ENOMEM ? "out of memory" : err());
    return 1;
  }
  if (json) {
    cJSON *o = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *ts = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "path", path);
    cJSON_AddStringToObject(o, "format", "safetensors");
    cJSON_AddNumberToObject(o, "tensor_count", (double)h.n_tensors);
    cJSON_AddNumberToObject(o, "data_bytes", (double)h.data_bytes);
    for (size_t i = 0; i < h.n_meta; i++)
      cJSON_AddStringToObject(meta, h.meta[2 * i], h.meta[2 * i + 1]);
    cJSON_AddItemToObject(o, "metadata", meta);
    for (size_t i = 0; i < h.n_tensors; i++) {
      const zt__st_tensor_t *t = &h.tensors[i];
      cJSON *tj = cJSON_CreateObject(), *shape = cJSON_CreateArray();
      cJSON_AddStringToObject(tj, "name", t->name);
      cJSON_AddStringToObject(tj, "dtype", t->dtype_name);
      for (int d = 0; d < t->ndim; d++)
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
      cJSON_AddItemToObject(tj, "shape", shape);
      cJSON_AddItemToArray(ts, tj);
    }
    cJSON_AddItemToObject(o, "tensors", ts);
    print_json(o);
    zt__st_header_free(&h);
    return 0;
  }
  printf("%s: safetensors, %zu tensors, %llu bytes of data\n", path, h.n_tensors,
         (unsigned long long)h.data_bytes);
  for (size_t i = 0; i < h.n_meta; i++) printf("  %s = %s\n", h.meta[2 * i], h.meta[2 * i + 1]);
  int width = 4; /* "BF16"; the 8-bit floats' names are longer */
  for (size_t i = 0; i < h.n_tensors; i++) {
    int w = (int)strlen(h.tensors[i].dtype_name);
    if (w > width) width = w;
  }
  for (size_t i = 0; i < h.n_tensors; i++) {
    const zt__st_tensor_t *t = &h.tensors[i];
    printf("  %-32s %-*s [", t->name, width, t->dtype_name);
    for (int d = 0; d < t->ndim; d++)
      printf("%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    printf("]\n");
  }
  zt__st_header_free(&h);
  return 0;
}

static int cmd_info(int argc, char **argv) {
  int json = 0;
  const tool_flag_t flags[] = {
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the lines", 0, 0, NULL},
  };
  const tool_cmd_t cmd = {"ztier ckpt info", "ztier ckpt info DIR | FILE.safetensors [--json]",
                          "What a checkpoint directory (zt_save) holds, every file's checksum\n"
                          "verified; or the tensors of a safetensors file, of any dtype of the\n"
                          "format.",
                          flags, 1, 1, 0};
  const char *dir = NULL;
  int rc = tool_args_parse(&cmd, argc, argv, &dir, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  if (dir == NULL) return tool_args_fail(&cmd, "DIR or FILE.safetensors is required");
  struct stat st;
  if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return info_safetensors(dir, json);
  zt__manifest_t m;
  if (zt__ckpt_read_manifest(dir, &m, zt__err_thread()) < 0) {
    fprintf(stderr, "ztier ckpt info: %s\n", err());
    return 1;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.n_files; i++) bytes += m.files[i].bytes;
  if (json) {
    char seed[24];
    snprintf(seed, sizeof seed, "0x%llx", (unsigned long long)m.seed);
    cJSON *o = cJSON_CreateObject(), *units = cJSON_CreateArray(), *files = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "path", dir);
    cJSON_AddStringToObject(o, "format", "ztier");
    cJSON_AddNumberToObject(o, "version", m.version);
    cJSON_AddNumberToObject(o, "generation", (double)m.generation);
    cJSON_AddBoolToObject(o, "manifest_checksum", m.version >= 2);
    cJSON_AddNumberToObject(o, "world", m.world);
    cJSON_AddNumberToObject(o, "stage", m.stage);
    cJSON_AddStringToObject(o, "param_dtype", zt__dtype_name(m.param_dtype));
    cJSON_AddNumberToObject(o, "numel", (double)m.numel);
    cJSON_AddNumberToObject(o, "state_numel", (double)m.state_numel);
    cJSON_AddNumberToObject(o, "steps", (double)m.steps);
    cJSON_AddNumberToObject(o, "skipped_steps", (double)m.skipped_steps);
    cJSON_AddNumberToObject(o, "loss_scale", m.loss_scale);
    cJSON_AddBoolToObject(o, "loss_scale_dynamic", m.loss_scale_dynamic);
    cJSON_AddStringToObject(o, "rounding",
                            m.rounding == ZT_ROUND_STOCHASTIC ? "stochastic" : "nearest");
    cJSON_AddStringToObject(o, "seed", seed); /* 64 bits: a JSON number would round */
    for (size_t i = 0; i < m.n_units; i++) {
      cJSON *u = cJSON_CreateObject();
      cJSON_AddStringToObject(u, "name", m.units[i].name);
      cJSON_AddNumberToObject(u, "offset", (double)m.units[i].offset);
      cJSON_AddNumberToObject(u, "numel", (double)m.units[i].numel);
      cJSON_AddNumberToObject(u, "group", m.units[i].group);
      cJSON_AddBoolToObject(u, "weight_decay", m.units[i].weight_decay);
      if (m.units[i].ndim > 0) {
        cJSON *shape = cJSON_AddArrayToObject(u, "shape");
        for (int d = 0; shape && d < m.units[i].ndim; d++)
          cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)m.units[i].shape[d]));
      }
      cJSON_AddItemToArray(units, u);
    }
    cJSON_AddItemToObject(o, "units", units);
    cJSON_AddNumberToObject(o, "bytes", (double)bytes);
    int bad = verify_all(dir, &m, files);
    cJSON_AddItemToObject(o, "files", files);
    cJSON_AddBoolToObject(o, "checksums_ok", !bad);
    zt__manifest_free(&m);
    print_json(o);
    return bad;
  }
  printf("%s: ztier checkpoint, format version %d, generation %llu; %s\n", dir, m.version,
         (unsigned long long)m.generation,
         m.version >= 2 ? "manifest checksum verified" : "no manifest checksum (version 1)");
  printf("  saved by %d ranks at stage %d; %s parameters; %llu elements, %llu with states\n",
         m.world, m.stage, zt__dtype_name(m.param_dtype), (unsigned long long)m.numel,
         (unsigned long long)m.state_numel);
  printf("  steps %llu (%llu skipped); loss scale %g (%s); rounding %s, seed 0x%llx\n",
         (unsigned long long)m.steps, (unsigned long long)m.skipped_steps, m.loss_scale,
         m.loss_scale_dynamic ? "dynamic" : "fixed",
         m.rounding == ZT_ROUND_STOCHASTIC ? "stochastic" : "nearest",
         (unsigned long long)m.seed);
  printf("  %zu units:\n", m.n_units);
  for (size_t i = 0; i < m.n_units; i++) {
    char shape[8 * 24] = "";
    for (int d = 0; d < m.units[i].ndim; d++)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%llu",
               d ? ", " : " [", (unsigned long long)m.units[i].shape[d]);
    if (m.units[i].ndim > 0) strcat(shape, "]");
    printf("    %-32s offset %-12llu %llu elements%s, group %d%s\n", m.units[i].name,
           (unsigned long long)m.units[i].offset, (unsigned long long)m.units[i].numel, shape,
           m.units[i].group, m.units[i].weight_decay ? "" : ", no weight decay");
  }
  printf("  %zu files, %llu bytes:\n", m.n_files, (unsigned long long)bytes);
  int bad = verify_all(dir, &m, NULL);
  zt__manifest_free(&m);
  printf("%s\n", bad ? "checksums: FAILED" : "checksums: all verified");
  return bad;
}

static int cmd_consolidate(int argc, char **argv) {
  static const char *const dtypes[] = {"fp32", "bf16", NULL};
  int dtype = 0, force = 0, json = 0;
  size_t max_shard = 0; /* 0: one file */
  const tool_flag_t flags[] = {
      {"dtype", TOOL_FLAG_CHOICE, &dtype, "fp32|bf16",
       "the exported dtype (default fp32; bf16 rounds to nearest even)", 0, 0, dtypes},
      {"force", TOOL_FLAG_BOOL, &force, NULL, "replace OUT, or write it inside DIR", 0, 0, NULL},
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the line", 0, 0, NULL},
      {"max-shard-size", TOOL_FLAG_BYTES, &max_shard, "SIZE",
       "shards of at most SIZE tensor bytes (\"5GB\", \"500MiB\", bytes) and their index, "
       "Hugging Face's names, in the directory OUT",
       1, 1e15, NULL},
  };
  const tool_cmd_t cmd = {
      "ztier ckpt consolidate",
      "ztier ckpt consolidate DIR OUT.safetensors [--dtype fp32|bf16] [--force] [--json]\n"
      "       ztier ckpt consolidate DIR OUT --max-shard-size SIZE [--dtype fp32|bf16] "
      "[--force] [--json]",
      "The full fp32 master weights of the checkpoint in DIR, one tensor per unit\nnamed by "
      "the unit table, as one safetensors file, streamed. OUT may not exist\nnor lie in DIR "
      "unless --force, and is never a file DIR's checkpoint uses.\nWith --max-shard-size, OUT "
      "is a directory (made if absent) that gets\nmodel-00001-of-0000N.safetensors ... and "
      "model.safetensors.index.json.",
      flags, 4, 2, 0};
  const char *pos[2] = {NULL, NULL};
  int n_pos = 0;
  int rc = tool_args_parse(&cmd, argc, argv, pos, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if (n_pos == 0)
    return tool_args_fail(&cmd, "DIR (the checkpoint) and OUT.safetensors are required");
  if (n_pos == 1) return tool_args_fail(&cmd, "OUT.safetensors (the file to write) is required");
  uint64_t size = 0;
  zt_dtype_t dt = dtype == 1 ? ZT_BF16 : ZT_FP32;
  /* Its progress, a line per tenth, goes through the tool's progress line. */
  tool_progress_start(cmd.prog);
  FILE *progress = tool_progress_stream();
  size_t n_shards = 0;
  if (max_shard)
    rc = zt__ckpt_consolidate_shards(pos[0], pos[1], dt, max_shard, force,
                                     progress ? progress : stderr, &n_shards, &size,
                                     zt__err_thread());
  else
    rc = zt__ckpt_consolidate(pos[0], pos[1], dt, force, progress ? progress : stderr, &size,
                              zt__err_thread());
  if (progress) fclose(progress);
  tool_progress_end();
  if (rc < 0) {
    fprintf(stderr, "ztier ckpt consolidate: %s\n", err());
    return 1;
  }
  double rss = peak_rss_mib();
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "path", pos[1]);
    tool_report_str(j, "checkpoint", pos[0]);
    tool_report_str(j, "dtype", zt__dtype_name(dt));
    tool_report_uint(j, "bytes", (unsigned long long)size);
    if (max_shard) tool_report_uint(j, "shards", (unsigned long long)n_shards);
    tool_report_num(j, "peak_rss_mib", rss);
    return tool_report_print(stdout, j, cmd.prog) < 0;
  }
  if (max_shard)
    printf("%s: %s, %zu shards and %s, %llu bytes; peak RSS %.1f MiB\n", pos[1],
           zt__dtype_name(dt), n_shards, "model.safetensors.index.json",
           (unsigned long long)size, rss);
  else
    printf("%s: %s, %llu bytes; peak RSS %.1f MiB\n", pos[1], zt__dtype_name(dt),
           (unsigned long long)size, rss);
  return 0;
}

int tool_ckpt_main(int argc, char **argv) {
  const tool_cmd_t cmd = {
      "ztier ckpt",
      "ztier ckpt info DIR | FILE.safetensors [--json]\n"
      "       ztier ckpt consolidate DIR OUT.safetensors [--dtype fp32|bf16] [--force] [--json]\n"
      "       ztier ckpt consolidate DIR OUT --max-shard-size SIZE [...]",
      "info: what a checkpoint directory (zt_save) holds, every file's checksum\n"
      "verified; or the tensors of a safetensors file. --json: one JSON object.\n"
      "consolidate: the full fp32 master weights, one tensor per unit named by the\n"
      "unit table, as safetensors (bf16: rounded to nearest even), streamed. OUT may\n"
      "not exist nor lie in DIR unless --force, and is never a file DIR's checkpoint\n"
      "uses. --max-shard-size SIZE: Hugging Face's shards and index in directory OUT.\n"
      "See docs/checkpoints.md.",
      NULL, 0, 0, 1};
  int first = argc;
  int rc = tool_args_parse(&cmd, argc, argv, NULL, &first);
  if (rc) return rc < 0 ? 0 : rc;
  if (first >= argc) return tool_args_fail(&cmd, "no command; expected info or consolidate");
  if (strcmp(argv[first], "info") == 0) return cmd_info(argc - first, argv + first);
  if (strcmp(argv[first], "consolidate") == 0)
    return cmd_consolidate(argc - first, argv + first);
  return tool_args_fail(&cmd, "unknown command '%s'; expected info or consolidate", argv[first]);
}

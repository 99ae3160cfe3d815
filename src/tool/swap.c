/*
 * src/tool/swap.c — `ztier swap {list,clean} PATH`: the swap files in the
 * swap directories (a swap_path, one directory or several joined by ':'),
 * whose process is running and which were left by processes that died
 * (kill -9, a crash, the OOM killer); `clean` removes those, never a
 * running process's. The scan is offload/swapspace.c's, the one engine
 * create runs.
 */
#include <stdio.h>
#include <string.h>

#include "offload/swap.h"      // defines: ZT__SWAP_MAX_PATHS
#include "offload/swapspace.h" // defines: zt__swapspace_scan
#include "tool/args.h"         // defines: tool_args_parse
#include "tool/report.h"       // defines: tool_report_*, tool_table_*
#include "ztier.h"             // defines: zt_last_error

int tool_swap_main(int argc, char **argv);

static const char usage_line[] = "ztier swap list PATH [--json]\n"
                                 "       ztier swap clean PATH [--json]";
static const char about[] =
    "The swap files ztier engines made under PATH (a swap_path: one directory, or\n"
    "several joined by ':'). Each is \"running\" (its process holds the file's lock)\n"
    "or \"leftover\" (its process is gone: killed, crashed); `clean` removes the\n"
    "leftovers and never a running process's file. Engine create removes them too,\n"
    "in its own swap_path. Files of other names are never touched.\n\n"
    "Exit status: 0, or 1 when a directory cannot be read or a leftover cannot be\n"
    "removed, 2 for bad arguments.";

typedef struct out {
  cJSON *files;      /* --json: one object per file */
  tool_table_t *table; /* the table otherwise */
  int failed;
  unsigned running, leftover, removed;
  unsigned long long removed_bytes, leftover_bytes;
} out_t;

static void on_file(void *arg, const zt__swap_leftover_t *f) {
  out_t *o = arg;
  const char *state = f->removed ? "removed" : f->live ? "running" : "leftover";
  if (f->removed) o->removed++, o->removed_bytes += f->bytes;
  else if (f->live) o->running++;
  else o->leftover++, o->leftover_bytes += f->bytes;
  if (f->err) o->failed = 1;
  if (o->files) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "path", f->path);
    tool_report_int(j, "pid", f->pid);
    tool_report_int(j, "rank", f->rank);
    tool_report_uint(j, "bytes", (unsigned long long)f->bytes);
    tool_report_str(j, "state", state);
    if (f->err) tool_report_str(j, "error", strerror(-f->err));
    if (j == NULL || !cJSON_AddItemToArray(o->files, j)) cJSON_Delete(j), o->failed = 1;
  } else {
    tool_table_row(o->table, "%s\t%ld\t%d\t%llu\t%s%s%s%s", state, f->pid, f->rank,
                   (unsigned long long)f->bytes, f->path, f->err ? "  (cannot remove: " : "",
                   f->err ? strerror(-f->err) : "", f->err ? ")" : "");
  }
}

int tool_swap_main(int argc, char **argv) {
  int json = 0;
  const tool_flag_t flags[] = {
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the table", 0, 0, NULL},
  };
  tool_cmd_t cmd = {"ztier swap", usage_line, about, flags, 1, 0, 1};
  int first = argc;
  int rc = tool_args_parse(&cmd, argc, argv, NULL, &first);
  if (rc) return rc < 0 ? 0 : rc;
  const char *sub = first < argc ? argv[first] : NULL;
  if (!sub) return tool_args_fail(&cmd, "no command; expected list or clean");
  if (strcmp(sub, "list") != 0 && strcmp(sub, "clean") != 0)
    return tool_args_fail(&cmd, "unknown command '%s'; expected list or clean", sub);
  char prog[32];
  snprintf(prog, sizeof prog, "ztier swap %s", sub);
  cmd.prog = prog;
  cmd.subcommand = 0;
  cmd.max_operands = 1;
  const char *path = NULL;
  int n = 0;
  rc = tool_args_parse(&cmd, argc - first, argv + first, &path, &n);
  if (rc) return rc < 0 ? 0 : rc;
  if (!path || !path[0]) return tool_args_fail(&cmd, "PATH is required (the swap directory)");
  int clean = strcmp(sub, "clean") == 0;
  char buf[4096];
  const char *dirs[ZT__SWAP_MAX_PATHS];
  unsigned n_dirs = zt__swapspace_split_paths(path, buf, sizeof buf, dirs);
  out_t o = {0};
  if (json) o.files = cJSON_CreateArray();
  else o.table = tool_table_new("lrrrl");
  tool_table_row(o.table, "state\tpid\trank\tbytes\tpath");
  for (unsigned k = 0; k < n_dirs; k++) {
    zt__err_t e = {{0}};
    if (zt__swapspace_scan(dirs[k], clean, on_file, &o, &e) < 0) {
      fprintf(stderr, "%s: %s\n", prog, e.msg);
      o.failed = 1;
    }
  }
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "path", path);
    if (j && o.files) cJSON_AddItemToObject(j, "files", o.files);
    else cJSON_Delete(o.files);
    tool_report_int(j, "running", o.running);
    tool_report_int(j, "leftover", o.leftover);
    tool_report_uint(j, "leftover_bytes", o.leftover_bytes);
    tool_report_int(j, "removed", o.removed);
    tool_report_uint(j, "removed_bytes", o.removed_bytes);
    if (tool_report_print(stdout, j, prog) < 0) o.failed = 1;
  } else {
    printf("%s %s\n", prog, path);
    tool_table_print(o.table, stdout, 2, NULL);
    if (clean)
      printf("\nRemoved %u leftover file%s (%llu bytes); %u file%s of running processes "
             "kept.\n", o.removed, o.removed == 1 ? "" : "s", o.removed_bytes, o.running,
             o.running == 1 ? "" : "s");
    else
      printf("\n%u file%s of running processes; %u leftover%s (%llu bytes)%s.\n", o.running,
             o.running == 1 ? "" : "s", o.leftover, o.leftover == 1 ? "" : "s",
             o.leftover_bytes, o.leftover ? ": `ztier swap clean` removes them" : "");
  }
  return o.failed ? 1 : 0;
}

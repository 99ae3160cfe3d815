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
#include "ztier.h"     // defines: zt_last_error

int zt_swap_main(int argc, char **argv);

static const char usage_text[] =
    "usage: ztier swap list PATH [--json]\n"
    "       ztier swap clean PATH [--json]\n\n"
    "The swap files ztier engines made under PATH (a swap_path: one directory, or\n"
    "several joined by ':'). Each is \"running\" (its process holds the file's lock)\n"
    "or \"leftover\" (its process is gone: killed, crashed); `clean` removes the\n"
    "leftovers and never a running process's file. Engine create removes them too,\n"
    "in its own swap_path. Files of other names are never touched.\n\n"
    "  --json   one JSON object instead of the table\n\n"
    "Exit status: 0, or 1 when a directory cannot be read or a leftover cannot be\n"
    "removed, 2 for bad arguments.\n";

typedef struct out {
  int json, first, failed;
  unsigned running, leftover, removed;
  unsigned long long removed_bytes, leftover_bytes;
} out_t;

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static void on_file(void *arg, const zt__swap_leftover_t *f) {
  out_t *o = arg;
  const char *state = f->removed ? "removed" : f->live ? "running" : "leftover";
  if (f->removed) o->removed++, o->removed_bytes += f->bytes;
  else if (f->live) o->running++;
  else o->leftover++, o->leftover_bytes += f->bytes;
  if (f->err) o->failed = 1;
  if (o->json) {
    printf("%s{\"path\": ", o->first ? "" : ", ");
    json_str(f->path);
    printf(", \"pid\": %ld, \"rank\": %d, \"bytes\": %llu, \"state\": \"%s\"}", f->pid,
           f->rank, (unsigned long long)f->bytes, state);
  } else {
    printf("  %-9s %8ld %5d %16llu  %s%s%s\n", state, f->pid, f->rank,
           (unsigned long long)f->bytes, f->path, f->err ? "  (cannot remove: " : "",
           f->err ? strerror(-f->err) : "");
    if (f->err) printf(")\n");
  }
  o->first = 0;
}

int zt_swap_main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : NULL, *path = NULL;
  int json = 0;
  if (cmd && (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (!cmd || (strcmp(cmd, "list") != 0 && strcmp(cmd, "clean") != 0)) {
    fprintf(stderr, "ztier swap: %s%s%s; expected list or clean\n\n%s",
            cmd ? "unknown command '" : "no command", cmd ? cmd : "", cmd ? "'" : "",
            usage_text);
    return 2;
  }
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "ztier swap %s: unknown option '%s'; see --help\n", cmd, argv[i]);
      return 2;
    } else if (path) {
      fprintf(stderr, "ztier swap %s: unexpected argument '%s'; one PATH is expected\n",
              cmd, argv[i]);
      return 2;
    } else {
      path = argv[i];
    }
  }
  if (!path || !path[0]) {
    fprintf(stderr, "ztier swap %s: PATH is required (the swap directory)\n", cmd);
    return 2;
  }
  int clean = strcmp(cmd, "clean") == 0;
  char buf[4096];
  const char *dirs[ZT__SWAP_MAX_PATHS];
  unsigned n_dirs = zt__swapspace_split_paths(path, buf, sizeof buf, dirs);
  out_t o = {.json = json, .first = 1};
  if (json) printf("{\"path\": "), json_str(path), printf(", \"files\": [");
  else printf("ztier swap %s %s\n  %-9s %8s %5s %16s  %s\n", cmd, path, "state", "pid",
              "rank", "bytes", "path");
  for (unsigned k = 0; k < n_dirs; k++) {
    zt__err_t e = {{0}};
    if (zt__swapspace_scan(dirs[k], clean, on_file, &o, &e) < 0) {
      fprintf(stderr, "ztier swap %s: %s\n", cmd, e.msg);
      o.failed = 1;
    }
  }
  if (json) {
    printf("], \"running\": %u, \"leftover\": %u, \"leftover_bytes\": %llu, \"removed\": %u, "
           "\"removed_bytes\": %llu}\n",
           o.running, o.leftover, o.leftover_bytes, o.removed, o.removed_bytes);
  } else if (clean) {
    printf("\nRemoved %u leftover file%s (%llu bytes); %u file%s of running processes "
           "kept.\n", o.removed, o.removed == 1 ? "" : "s", o.removed_bytes, o.running,
           o.running == 1 ? "" : "s");
  } else {
    printf("\n%u file%s of running processes; %u leftover%s (%llu bytes)%s.\n", o.running,
           o.running == 1 ? "" : "s", o.leftover, o.leftover == 1 ? "" : "s",
           o.leftover_bytes, o.leftover ? ": `ztier swap clean` removes them" : "");
  }
  return o.failed ? 1 : 0;
}

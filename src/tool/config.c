/*
 * src/tool/config.c — `ztier config check FILE`: loads FILE as
 * zt_config_load does (ztier's own keys, or a DeepSpeed config told by its
 * shape) and prints the config an engine would get, every key, with what
 * was made of a DeepSpeed config's keys: mapped to ztier's, ignored (and
 * why), or accepted with a difference; or the error, naming the key.
 *
 * The library says what it did with a DeepSpeed config through log_fn
 * (config_deepspeed.c's notes, at debug, info and warn level), so that is
 * where this command hears it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "tool/args.h"   // defines: tool_args_parse
#include "tool/report.h" // defines: tool_report_*, tool_table_*
#include "ztier.h"       // defines: zt_config_load, zt_config_to_json

int tool_config_main(int argc, char **argv);

static const char usage_line[] = "ztier config check FILE [--json]";
static const char about[] =
    "Loads FILE as zt_config_load() does, over the defaults, and prints the config\n"
    "an engine would be created with (every key, as zt_config_to_json writes it).\n"
    "FILE holds ztier's keys, or is a DeepSpeed config (ds_config.json, told by its\n"
    "\"zero_optimization\" or a batch size): then each of its keys is listed as\n"
    "mapped to a ztier key (units converted), ignored with the reason, or accepted\n"
    "with a difference from DeepSpeed that is said; a key ztier cannot honour is an\n"
    "error naming it (docs/config.md, \"DeepSpeed configs\").\n\n"
    "Exit status: 0, 1 when FILE cannot be read or is refused, 2 for bad arguments.";

/* What the library said about the DeepSpeed keys. */
typedef struct heard {
  int deepspeed; /* the file was read as a DeepSpeed config */
  cJSON *mapped, *ignored, *differs;
} heard_t;

/* Adds {"key": K, field: text} to `list` from a note "... DeepSpeed key 'K'
 * <verb> text", or nothing when the note is not one. */
static void add_note(cJSON *list, const char *msg, const char *verb, const char *field) {
  const char *k = strstr(msg, "DeepSpeed key '");
  if (k == NULL || list == NULL) return;
  k += strlen("DeepSpeed key '");
  const char *end = strchr(k, '\'');
  if (end == NULL || strncmp(end + 1, verb, strlen(verb)) != 0) return;
  char key[256];
  snprintf(key, sizeof key, "%.*s", (int)(end - k), k);
  cJSON *o = tool_report_new();
  tool_report_str(o, "key", key);
  tool_report_str(o, field, end + 1 + strlen(verb));
  if (o == NULL || !cJSON_AddItemToArray(list, o)) cJSON_Delete(o);
}

static void on_log(void *user, zt_log_level_t level, const char *msg) {
  heard_t *h = user;
  if (strstr(msg, "read as a DeepSpeed config")) h->deepspeed = 1;
  if (level == ZT_LOG_DEBUG) add_note(h->mapped, msg, " is mapped: ", "to");
  if (level == ZT_LOG_INFO) add_note(h->ignored, msg, " is ignored: ", "why");
  if (level == ZT_LOG_WARN) add_note(h->differs, msg, " differs: ", "why");
}

/* The rows of `list` under a heading, key and text in two columns. */
static void print_notes(const char *heading, const cJSON *list, const char *field) {
  if (cJSON_GetArraySize(list) == 0) return;
  printf("\n%s:\n", heading);
  tool_table_t *t = tool_table_new("ll");
  for (const cJSON *o = list->child; o; o = o->next)
    tool_table_row(t, "%s\t%s", cJSON_GetObjectItemCaseSensitive(o, "key")->valuestring,
                   cJSON_GetObjectItemCaseSensitive(o, field)->valuestring);
  tool_table_print(t, stdout, 2, NULL);
}

static int check(const tool_cmd_t *cmd, const char *path, int json) {
  /* Loaded twice: once as a program would (the effective config), once
   * with a log_fn at debug level to hear the notes; the second's log_level
   * is this command's, not the file's, so it is not the one printed. */
  zt_config_t cfg = ZT_CONFIG_INIT;
  int rc = zt_config_load(&cfg, path);
  heard_t h = {0, cJSON_CreateArray(), cJSON_CreateArray(), cJSON_CreateArray()};
  if (rc == 0) {
    zt_config_t probe = ZT_CONFIG_INIT;
    probe.log_fn = on_log;
    probe.log_user = &h;
    probe.log_level = ZT_LOG_DEBUG;
    rc = zt_config_load(&probe, path);
  }
  char *text = NULL;
  if (rc == 0) {
    int len = zt_config_to_json(&cfg, NULL, 0);
    text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (text == NULL || zt_config_to_json(&cfg, text, (size_t)len + 1) != len) rc = -1;
  }
  int failed = rc != 0;
  if (json) {
    cJSON *j = tool_report_new();
    tool_report_str(j, "file", path);
    tool_report_bool(j, "ok", !failed);
    if (failed) {
      tool_report_str(j, "error", zt_last_error(NULL));
    } else {
      tool_report_str(j, "format", h.deepspeed ? "deepspeed" : "ztier");
      cJSON *c = cJSON_Parse(text);
      if (j && c) cJSON_AddItemToObject(j, "config", c);
      else cJSON_Delete(c), failed = 1;
      if (j) {
        cJSON_AddItemToObject(j, "mapped", h.mapped);
        cJSON_AddItemToObject(j, "ignored", h.ignored);
        cJSON_AddItemToObject(j, "differs", h.differs);
        h.mapped = h.ignored = h.differs = NULL;
      }
    }
    if (tool_report_print(stdout, j, cmd->prog) < 0) failed = 1;
  } else if (failed) {
    fprintf(stderr, "%s: %s\n", cmd->prog, zt_last_error(NULL));
  } else {
    printf("%s: %s\n", path,
           h.deepspeed ? "a DeepSpeed config, read as ztier's keys" : "a ztier config");
    print_notes("mapped (DeepSpeed key: its value -> ztier key and value)", h.mapped, "to");
    print_notes("ignored (DeepSpeed key: why)", h.ignored, "why");
    print_notes("accepted, but ztier differs from DeepSpeed (key: how)", h.differs, "why");
    printf("\nthe config an engine gets:\n%s\n", text);
  }
  cJSON_Delete(h.mapped);
  cJSON_Delete(h.ignored);
  cJSON_Delete(h.differs);
  free(text);
  return failed ? 1 : 0;
}

int tool_config_main(int argc, char **argv) {
  int json = 0;
  const tool_flag_t flags[] = {
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the text", 0, 0, NULL},
  };
  tool_cmd_t cmd = {"ztier config", usage_line, about, flags, 1, 0, 1};
  int first = argc;
  int rc = tool_args_parse(&cmd, argc, argv, NULL, &first);
  if (rc) return rc < 0 ? 0 : rc;
  const char *sub = first < argc ? argv[first] : NULL;
  if (!sub) return tool_args_fail(&cmd, "no command; expected check");
  if (strcmp(sub, "check") != 0)
    return tool_args_fail(&cmd, "unknown command '%s'; expected check", sub);
  cmd.prog = "ztier config check";
  cmd.subcommand = 0;
  cmd.max_operands = 1;
  const char *path = NULL;
  int n = 0;
  rc = tool_args_parse(&cmd, argc - first, argv + first, &path, &n);
  if (rc) return rc < 0 ? 0 : rc;
  if (!path || !path[0]) return tool_args_fail(&cmd, "FILE is required (the config to check)");
  return check(&cmd, path, json);
}

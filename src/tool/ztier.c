/*
 * src/tool/ztier.c — main() of the `ztier` command-line tool.
 *
 * Commands are rows of tables: a top-level table (bench, version, ...) and
 * one for `ztier bench <name>`. Adding `ztier plan` or `ztier bench nvme` is
 * one row (plus the function it names). Every command gets the arguments
 * from its own name on (argv[0] is "adam" for `ztier bench adam ...`) and
 * returns the exit status: 0 success, 1 failure, 2 usage error. Every
 * command reads its flags with src/tool/args.c (getopt_long) and prints with
 * src/tool/report.c (a table, or one JSON object with --json).
 */
#include <stdio.h>
#include <string.h>

#include "bench/common.h"     // defines: bench_*_main
#include "tool/args.h"         // defines: tool_args_parse
#include "tool/progress.h"     // defines: tool_progress_end
#include "tool/report.h"       // defines: tool_report_*
#include "ztier.h"             // defines: zt_version

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command_t;

static int cmd_bench(int argc, char **argv);
static int cmd_version(int argc, char **argv);
int tool_plan_main(int argc, char **argv); /* src/tool/plan.c */
int tool_ckpt_main(int argc, char **argv); /* src/tool/ckpt.c */
int tool_config_main(int argc, char **argv); /* src/tool/config.c */
int tool_swap_main(int argc, char **argv); /* src/tool/swap.c */
int tool_report_main(int argc, char **argv); /* src/tool/env_report.c */
const char *tool_liburing_version(void);     /* src/tool/env_report.c */

static const command_t commands[] = {
    {"bench", cmd_bench, "measure a part of ztier beside its hardware limit"},
    {"ckpt", tool_ckpt_main, "inspect a checkpoint, or export its weights as safetensors"},
    {"config", tool_config_main, "check a config file (ztier's or DeepSpeed's): what an engine gets"},
    {"plan", tool_plan_main, "memory per rank in each tier, before you run"},
    {"report", tool_report_main,
     "this build and machine: CPU kernels, huge pages, io_uring, O_DIRECT, MPI, CUDA"},
    {"swap", tool_swap_main, "list or remove the swap files that killed processes left"},
    {"version", cmd_version, "print the version of ztier"},
};

static const command_t benches[] = {
    {"adam", bench_adam_main,
     "the CPU AdamW update against the memory bandwidth of the same access pattern"},
    {"device", bench_device_main,
     "the GPU's AdamW, sum of squares and cast kernels against a device copy; the link"},
    {"nvme", bench_nvme_main,
     "the io_uring swap engine against fio on the same disk, and the settings to use"},
    {"offload", bench_offload_main,
     "an optimizer step with its states on NVMe against the disk and the in-memory step"},
    {"stage3", bench_stage3_main,
     "a stage-3 loop with parameters on host or NVMe: time stalled in zt_fetch"},
    {"step", bench_step_main,
     "one step's hand-over and zt_step against the link, disk and kernel bound"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void list(FILE *f, const command_t *t, size_t n) {
  for (size_t i = 0; i < n; i++) fprintf(f, "  %-10s %s\n", t[i].name, t[i].summary);
}

/* What `ztier --help` and `ztier` alone print: written once, here. */
#define USAGE "ztier <command> [arguments]"
#define ABOUT                                                                            \
  "ztier partitions and tiers the model states of data-parallel training\n(ZeRO stages " \
  "1-3, offload to host memory and NVMe) for C training loops."
#define MORE "'ztier <command> --help' describes a command."

static void usage(FILE *f) {
  fprintf(f, "usage: %s\n\n%s\n\ncommands:\n", USAGE, ABOUT);
  list(f, commands, COUNT(commands));
  fprintf(f, "\n%s\n", MORE);
}

/* Runs the row of `t` named by argv[0]; `what` names the table in errors. */
static int dispatch(const char *what, const command_t *t, size_t n, int argc,
                    char **argv) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(argv[0], t[i].name) == 0) return t[i].run(argc, argv);
  if (argv[0][0] == '-')
    fprintf(stderr, "%s: unknown option '%s'; run '%s --help' for the list\n", what,
            argv[0], what);
  else
    fprintf(stderr, "%s: unknown command '%s'; run '%s --help' for the list\n", what,
            argv[0], what);
  return 2;
}

static int cmd_bench(int argc, char **argv) {
  const tool_cmd_t cmd = {"ztier bench", "ztier bench <name> [flags]",
                          "Each benchmark prints its figure beside a limit measured in the same "
                          "run\n(medians over --reps), checks what it times first, and takes "
                          "--json; see\n'ztier bench <name> --help' and docs/bench.md.",
                          NULL, 0, 0, 1};
  int first = argc;
  int rc = tool_args_parse(&cmd, argc, argv, NULL, &first);
  if (rc == -1) {
    printf("\nbenchmarks:\n");
    list(stdout, benches, COUNT(benches));
    return 0;
  }
  if (rc) return rc;
  if (first >= argc) {
    rc = tool_args_fail(&cmd, "a benchmark name is required");
    fprintf(stderr, "\nbenchmarks:\n");
    list(stderr, benches, COUNT(benches));
    return rc;
  }
  rc = dispatch("ztier bench", benches, COUNT(benches), argc - first, argv + first);
  /* A benchmark may return early, on a failure, with its line still up. */
  tool_progress_end();
  return rc;
}


static int cmd_version(int argc, char **argv) {
  int json = 0;
  const tool_flag_t flags[] = {
      {"json", TOOL_FLAG_BOOL, &json, NULL, "one JSON object instead of the version line", 0, 0,
       NULL},
  };
  const tool_cmd_t cmd = {"ztier version", "ztier version [--json]",
                          "Prints the version of ztier; with --json, one JSON object that\nalso "
                          "names what this build has: \"cuda\" (the cuda backend and NCCL "
                          "compiled\nin), \"mpi\" (the comm \"mpi\" backend), \"io_uring\" "
                          "(the nvme tier's I/O) and\n\"liburing_version\" (null when "
                          "liburing's headers do not state it).",
                          flags, COUNT(flags), 0, 0};
  int rc = tool_args_parse(&cmd, argc, argv, NULL, NULL);
  if (rc) return rc < 0 ? 0 : rc;
  if (!json) {
    printf("ztier %s\n", zt_version());
    return 0;
  }
  cJSON *j = tool_report_new();
  tool_report_str(j, "version", zt_version());
  tool_report_bool(j, "cuda", ZT_HAVE_CUDA);
  tool_report_bool(j, "nccl", ZT_HAVE_CUDA);
  tool_report_bool(j, "mpi", ZT_HAVE_MPI);
  tool_report_bool(j, "io_uring", 1);
  tool_report_str(j, "liburing_version", tool_liburing_version());
  return tool_report_print(stdout, j, cmd.prog) < 0;
}

int main(int argc, char **argv) {
  int version = 0;
  const tool_flag_t flags[] = {
      {"version", TOOL_FLAG_BOOL, &version, NULL, "print the version of ztier (as 'ztier version')",
       0, 0, NULL},
  };
  const tool_cmd_t cmd = {"ztier", USAGE, ABOUT "\n" MORE, flags, COUNT(flags), 0, 1};
  int first = argc;
  int rc = tool_args_parse(&cmd, argc, argv, NULL, &first);
  if (rc == -1) {
    printf("\ncommands:\n");
    list(stdout, commands, COUNT(commands));
    return 0;
  }
  if (rc) return rc;
  if (version) return cmd_version(1, argv);
  if (first >= argc) {
    usage(stderr);
    return 2;
  }
  /* "ztier help" reads as "ztier --help". */
  if (strcmp(argv[first], "help") == 0) {
    usage(stdout);
    return 0;
  }
  return dispatch("ztier", commands, COUNT(commands), argc - first, argv + first);
}

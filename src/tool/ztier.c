/*
 * src/tool/ztier.c — main() of the `ztier` command-line tool.
 *
 * Commands are rows of tables: a top-level table (bench, version, ...) and
 * one for `ztier bench <name>`. Adding `ztier plan` or `ztier bench nvme` is
 * one row (plus the function it names). Every command gets the arguments
 * from its own name on (argv[0] is "adam" for `ztier bench adam ...`) and
 * returns the exit status: 0 success, 1 failure, 2 usage error.
 */
#include <liburing.h> // defines: IO_URING_VERSION_* (liburing 2.2 and later)
#include <stdio.h>
#include <string.h>

#include "bench/common.h" // defines: zt_bench_*_main
#include "ztier.h"              // defines: zt_version

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command_t;

static int cmd_bench(int argc, char **argv);
static int cmd_version(int argc, char **argv);
int zt_plan_main(int argc, char **argv); /* src/tool/plan.c */
int zt_ckpt_main(int argc, char **argv); /* src/tool/ckpt.c */
int zt_swap_main(int argc, char **argv); /* src/tool/swap.c */

static const command_t commands[] = {
    {"bench", cmd_bench, "measure a part of ztier beside its hardware limit"},
    {"ckpt", zt_ckpt_main, "inspect a checkpoint, or export its weights as safetensors"},
    {"plan", zt_plan_main, "memory per rank in each tier, before you run"},
    {"swap", zt_swap_main, "list or remove the swap files that killed processes left"},
    {"version", cmd_version, "print the version of ztier"},
};

static const command_t benches[] = {
    {"adam", zt_bench_adam_main,
     "the CPU AdamW update against the memory bandwidth of the same access pattern"},
    {"nvme", zt_bench_nvme_main,
     "the io_uring swap engine against fio on the same disk, and the settings to use"},
    {"offload", zt_bench_offload_main,
     "an optimizer step with its states on NVMe against the disk and the in-memory step"},
    {"stage3", zt_bench_stage3_main,
     "a stage-3 loop with parameters on host or NVMe: time stalled in zt_fetch"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void list(FILE *f, const command_t *t, size_t n) {
  for (size_t i = 0; i < n; i++) fprintf(f, "  %-10s %s\n", t[i].name, t[i].summary);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ztier <command> [arguments]\n\n"
          "ztier partitions and tiers the model states of data-parallel training\n"
          "(ZeRO stages 1-3, offload to host memory and NVMe) for C training loops.\n\n"
          "commands:\n");
  list(f, commands, COUNT(commands));
  fprintf(f, "\n'ztier <command> --help' describes a command.\n");
}

static int is_help(const char *a) {
  return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || strcmp(a, "help") == 0;
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
  if (argc < 2 || is_help(argv[1])) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: ztier bench <name> [flags]\n\nbenchmarks:\n");
    list(f, benches, COUNT(benches));
    fprintf(f,
            "\nEach prints its figure beside a limit measured in the same run (medians\n"
            "over --reps), checks what it times first, and takes --json; see\n"
            "'ztier bench <name> --help' and docs/bench.md.\n");
    return argc < 2 ? 2 : 0;
  }
  return dispatch("ztier bench", benches, COUNT(benches), argc - 1, argv + 1);
}

/* liburing states its version in its headers from 2.2 on; older ones do not. */
#if defined(IO_URING_VERSION_MAJOR) && defined(IO_URING_VERSION_MINOR)
#define STR2(x) #x
#define STR(x) STR2(x)
#define LIBURING_VERSION STR(IO_URING_VERSION_MAJOR) "." STR(IO_URING_VERSION_MINOR)
#else
#define LIBURING_VERSION NULL
#endif

static int cmd_version(int argc, char **argv) {
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (is_help(argv[i])) {
      printf("usage: ztier version [--json]\n\nPrints the version of ztier; with --json, "
             "one JSON object that\nalso names what this build has: \"cuda\" (the cuda "
             "backend and NCCL compiled\nin), \"mpi\" (the comm \"mpi\" backend), "
             "\"io_uring\" (the nvme tier's I/O) and\n\"liburing_version\" (null when "
             "liburing's headers do not state it).\n");
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
      continue;
    }
    fprintf(stderr, "ztier version: unexpected argument '%s'; expected --json or nothing\n",
            argv[i]);
    return 2;
  }
  if (!json) {
    printf("ztier %s\n", zt_version());
    return 0;
  }
  const char *uring = LIBURING_VERSION;
  printf("{\"version\": \"%s\", \"cuda\": %s, \"nccl\": %s, \"mpi\": true, "
         "\"io_uring\": true, \"liburing_version\": ",
         zt_version(), ZT_HAVE_CUDA ? "true" : "false", ZT_HAVE_CUDA ? "true" : "false");
  if (uring) printf("\"%s\"}\n", uring);
  else printf("null}\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (is_help(argv[1])) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) return cmd_version(1, argv + 1);
  return dispatch("ztier", commands, COUNT(commands), argc - 1, argv + 1);
}

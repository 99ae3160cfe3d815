/* swapspace.c — a tier's swap space from the engine's config; see swapspace.h. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h" // defines: struct zt_engine (config, comm, error buffer)
#include "swap.h"   // defines: zt__swap_*
#include "swapspace.h"

int zt__swapspace_open(zt_engine_t *eng, const char *kind, const char *tier, uint64_t bytes,
                       uint32_t block, unsigned max_bufs, zt__swap_t **out, char *note,
                       size_t note_len) {
  const zt_config_t *c = &eng->cfg;
  *out = NULL;
  char paths_buf[sizeof c->swap_path];
  const char *paths[ZT__SWAP_MAX_PATHS];
  unsigned n_paths = 0;
  snprintf(paths_buf, sizeof paths_buf, "%s", c->swap_path);
  for (char *save = NULL, *p = strtok_r(paths_buf, ":", &save);
       p && n_paths < ZT__SWAP_MAX_PATHS; p = strtok_r(NULL, ":", &save))
    paths[n_paths++] = p;
  if (n_paths == 0)
    return zt__errf(&eng->err, ZT_ECONFIG,
                    "%s \"nvme\" needs swap_path: one or more directories for the swap "
                    "files",
                    tier);
  char name[96];
  snprintf(name, sizeof name, "%s-%ld-r%d-%lx", kind, (long)getpid(),
           eng->comm->ops->rank(eng->comm), (unsigned long)(uintptr_t)eng);
  zt__swap_config_t sc = ZT__SWAP_CONFIG_INIT;
  sc.paths = paths;
  sc.n_paths = n_paths;
  sc.name = name;
  sc.bytes = bytes;
  sc.block_size = block;
  /* I/Os of swap_block_bytes: the stripe cuts requests into I/Os. */
  sc.stripe_bytes = c->swap_block_bytes > block ? c->swap_block_bytes : block;
  sc.queue_depth = (unsigned)c->swap_queue_depth;
  sc.max_bufs = max_bufs;
  sc.rings = (unsigned)c->swap_rings;
  sc.sqpoll = c->swap_sqpoll;
  ZT_TRY(zt__swap_create(&sc, &eng->err, out));
  zt__swap_info_t info;
  zt__swap_info(*out, &info);
  if (note) snprintf(note, note_len, "%s", info.note);
  if (info.note[0]) zt__log(c, ZT_LOG_WARN, "%s \"nvme\": %s", tier, info.note);
  return 0;
}

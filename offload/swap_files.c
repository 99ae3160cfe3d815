/*
 * swap_files.c — the swap engine's files: each one created exclusively
 * (never over a file that is there), locked, preallocated and headed with
 * the run's identity; the space check before any of that; and their removal
 * at destroy. What a swap file is on disk: swap_impl.h's hdr_t.
 */
#define _GNU_SOURCE
#include <linux/magic.h> // defines: TMPFS_MAGIC and the other f_type values
#include <stdio.h>
#include <sys/file.h> // defines: flock
#include <sys/statvfs.h>
#include <sys/vfs.h> // defines: fstatfs


#include "offload/swap_impl.h"

/* ---- files -------------------------------------------------------------- */

void zt__swapfile_hdr_fill(const zt__swap_t *sw, unsigned i, hdr_t *h) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, HDR_MAGIC, 8);
  h->version = HDR_VERSION;
  h->block_size = sw->bs;
  h->run_id = sw->run_id;
  h->stripe_bytes = sw->stripe;
  h->capacity = sw->capacity;
  h->file_index = i;
  h->n_files = sw->n_files;
  h->hash = hdr_hash(h);
}

/* A sentence on what an existing file at `path` is, for the -EEXIST. */
static int refuse_existing(zt__swap_t *sw, const char *path) {
  hdr_t h;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? pread(fd, &h, sizeof h, 0) : -1;
  if (fd >= 0) close(fd);
  if (n == (ssize_t)sizeof h && memcmp(h.magic, HDR_MAGIC, 8) == 0)
    return zt__errf(sw->err, -EEXIST,
                    "swap file %s already exists and holds another run's swap "
                    "space (run id %016llx): it is never read as ours; remove it "
                    "if no process uses it, or choose another name",
                    path, (unsigned long long)h.run_id);
  return zt__errf(sw->err, -EEXIST,
                  "swap file %s already exists and is not a ztier swap file; "
                  "choose another directory or name",
                  path);
}

int zt__swapfile_create(zt__swap_t *sw, unsigned i, const char *dir, const char *name,
                        uint64_t size, int buffered, void *hdr_block) {
  sfile_t *f = &sw->files[i];
  size_t plen = strlen(dir) + strlen(name) + 40;
  f->path = malloc(plen);
  if (!f->path) return zt__errf(sw->err, -ENOMEM, "out of memory for swap file names");
  snprintf(f->path, plen, "%s/ztier-%s.%u.swap", dir, name, i);
  f->size = size;
  f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f->fd < 0) {
    int e = errno;
    if (e == EEXIST) return refuse_existing(sw, f->path);
    return zt__errf(sw->err, -e, "cannot create swap file %s (paths[%u] = \"%s\"): %s (%s)",
                    f->path, i, dir, strerror(e), ename(e));
  }
  // The lock says "its owner runs" for as long as the file is open (through
  // the rings' fixed files too), and goes with the process however it ends:
  // another process's scan for leftovers never takes a live file
  // (swapspace.c). The wait is only for such a scan that looks at it now.
  // A file system without flock (some FUSE and cluster mounts) still
  // serves the file: the scan then tells a live owner by its pid alone.
  if (flock(f->fd, LOCK_EX) != 0) {
    int e = errno;
    if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS)
      zt__swap_note_add(
          sw, "flock refused on %s (%s): its swap files are told live by pid only", dir,
          ename(e));
    else
      return zt__errf(sw->err, -e, "cannot lock swap file %s (paths[%u] = \"%s\"): %s (%s)",
                      f->path, i, dir, strerror(e), ename(e));
  }
  // Setting O_DIRECT after the open tells "filesystem refuses it" (EINVAL)
  // apart from "cannot create": the file is ours either way.
  f->direct = 0;
  if (!buffered) {
    int fl = fcntl(f->fd, F_GETFL);
    if (fl >= 0 && fcntl(f->fd, F_SETFL, fl | O_DIRECT) == 0) f->direct = 1;
  }
  if (fallocate(f->fd, 0, 0, (off_t)size) != 0) {
    int e = errno;
    if (e == EOPNOTSUPP) {
      // No preallocation on this filesystem: size it at least, so reads of
      // the whole range stay inside the file.
      if (ftruncate(f->fd, (off_t)size) != 0) e = errno; else e = 0;
    }
    if (e == ENOSPC) {
      struct statvfs vs;
      unsigned long long avail = 0;
      if (fstatvfs(f->fd, &vs) == 0) avail = (unsigned long long)vs.f_bavail * vs.f_frsize;
      return zt__errf(sw->err, -ENOSPC,
                      "swap file %s needs %llu bytes but its filesystem has %llu "
                      "free (fallocate: ENOSPC); free space, lower the swap size "
                      "or add a directory",
                      f->path, (unsigned long long)size, avail);
    }
    if (e)
      return zt__errf(sw->err, -e, "cannot preallocate %llu bytes for swap file %s: %s (%s)",
                      (unsigned long long)size, f->path, strerror(e), ename(e));
  }
  memset(hdr_block, 0, sw->bs);
  zt__swapfile_hdr_fill(sw, i, (hdr_t *)hdr_block);
  ssize_t n = pwrite(f->fd, hdr_block, sw->bs, 0);
  if (n != (ssize_t)sw->bs) {
    int e = n < 0 ? errno : EIO;
    return zt__errf(sw->err, -e, "cannot write the header of swap file %s (offset 0, %u bytes): %s (%s)",
                    f->path, sw->bs, strerror(e), ename(e));
  }
  return 0;
}

void zt__swapfile_close_all(zt__swap_t *sw) {
  for (unsigned i = 0; i < sw->n_files; i++) {
    sfile_t *f = &sw->files[i];
    if (f->fd >= 0) {
      // Removed while still locked: no scan sees it unlocked and in place.
      unlink(f->path);
      close(f->fd);
    }
    free(f->path);
  }
  free(sw->files);
  sw->files = NULL;
}

/* The filesystem's name for the note, from statfs's f_type. */
const char *zt__swapfile_fs_name(int fd) {
  struct statfs s;
  if (fstatfs(fd, &s) != 0) return "this filesystem";
  switch ((unsigned long)s.f_type) {
  case TMPFS_MAGIC: return "tmpfs";
  case RAMFS_MAGIC: return "ramfs";
  case EXT4_SUPER_MAGIC: return "ext4";
  case XFS_SUPER_MAGIC: return "xfs";
  case BTRFS_SUPER_MAGIC: return "btrfs";
  case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
  case NFS_SUPER_MAGIC: return "nfs";
  case FUSE_SUPER_MAGIC: return "a FUSE filesystem";
  case 0x2fc12fc1: return "zfs"; // not in linux/magic.h
  default: return "this filesystem";
  }
}

/* Before any file is made: every filesystem must have room for all the files
 * it will hold (several directories may be on one). fallocate finds a
 * shortfall too, but only after the earlier files took their space; this
 * answers at once and touches nothing. "Free" is statvfs's f_bavail, what df
 * shows as available: the space reserved for root is not counted on. A
 * directory that cannot be examined is left to the open, which names it; a
 * filesystem that reports no size at all (f_blocks 0: ramfs, some FUSE
 * filesystems) is left to fallocate, which finds a real shortfall. */
int zt__swapfile_space_check(const zt__swap_config_t *c, uint64_t capacity,
                             zt__err_t *err) {
  unsigned n = c->n_paths;
  dev_t dev[ZT__SWAP_MAX_PATHS];
  uint64_t avail[ZT__SWAP_MAX_PATHS], need[ZT__SWAP_MAX_PATHS];
  int known[ZT__SWAP_MAX_PATHS];
  for (unsigned i = 0; i < n; i++) {
    struct stat st;
    struct statvfs vs;
    known[i] = stat(c->paths[i], &st) == 0 && statvfs(c->paths[i], &vs) == 0 &&
               vs.f_blocks != 0;
    dev[i] = known[i] ? st.st_dev : 0;
    avail[i] = known[i] ? (uint64_t)vs.f_bavail * vs.f_frsize : 0;
    need[i] = file_bytes(capacity, c->block_size, c->stripe_bytes, n, i);
  }
  for (unsigned i = 0; i < n; i++) {
    if (!known[i]) continue;
    uint64_t total = 0;
    unsigned others = 0;
    for (unsigned j = 0; j < n; j++)
      if (known[j] && dev[j] == dev[i]) {
        total += need[j];
        others += j != i;
      }
    if (total <= avail[i]) continue;
    if (others == 0)
      return zt__errf(err, -ENOSPC,
                      "swap directory %s (paths[%u]) needs %llu bytes for its file but "
                      "its filesystem has %llu bytes free; free space, lower the swap "
                      "size or add a directory on another disk",
                      c->paths[i], i, (unsigned long long)need[i],
                      (unsigned long long)avail[i]);
    return zt__errf(err, -ENOSPC,
                    "swap directory %s (paths[%u]) needs %llu bytes for its file, %llu "
                    "with the %u other swap director%s on the same filesystem, which "
                    "has %llu bytes free; free space, lower the swap size or use "
                    "directories on other disks",
                    c->paths[i], i, (unsigned long long)need[i],
                    (unsigned long long)total, others, others == 1 ? "y" : "ies",
                    (unsigned long long)avail[i]);
  }
  return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The unreserved share (share.c): a container granted no cores on a time-sliced GPU is
 * paced to what the reservations on that GPU leave (docs/cuda-hook.md, "Unreserved
 * containers"). The node agent keeps it in one file per GPU (format: api/shares.go),
 * TESSERA_SHARES_DIR/<uuid>/share, in a directory it mounts read-only: the tenant can
 * read it and write nothing there. The agent replaces the file atomically whenever a
 * container comes to or leaves the GPU; pacing re-reads it at most every
 * TESSERA_SHARE_REREAD_NS, on its slow path, never per launch.
 */
#ifndef TESSERA_SHARE_H
#define TESSERA_SHARE_H

#include <stddef.h>

#ifndef TESSERA_SHARES_DIR
#define TESSERA_SHARES_DIR "/run/tessera-shares" /* api.ContainerSharesDir */
#endif
#define TESSERA_SHARE_FILE "share"              /* api.ShareFileName */
#define TESSERA_SHARE_MIN 1                     /* api.MinUnreservedShare */
#define TESSERA_SHARE_MAX_BYTES 256             /* api.MaxShareFileBytes */
#define TESSERA_SHARE_REREAD_NS 5000000LL

struct tessera_share {
	int share; /* percent of the GPU's time, TESSERA_SHARE_MIN..100; 100: not paced */
	int phase; /* refill point, percent into the pacing period, 0..99 */
};

/* Parses buf[0..len) as api.DecodeShare does. Returns 0, or -1 for anything else. */
int tessera_share_parse(const char *buf, size_t len, struct tessera_share *out);

/* Whether the node agent mounted the GPU's share directory: the container, granted no
 * cores on it, is paced to the file's share. */
int tessera_share_present(const char *uuid);

/* Reads the GPU's share file. Returns 0, or -1 (missing, unreadable, malformed). */
int tessera_share_read(const char *uuid, struct tessera_share *out);

#endif

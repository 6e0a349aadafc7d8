/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where the container's limits come from (limits_source.c).
 *
 * The rules, in order (docs/cuda-hook.md, "Where the limits come from"):
 *
 *   1. the limits file in the read-only limits directory, if it exists;
 *   2. else the node agent's socket beside it, if it exists;
 *   3. else, inside a Tessera container, nothing: CUDA is refused;
 *   4. else (standalone use) TESSERA_LIMITS_FILE, only where the administrator's
 *      config allows it;
 *   5. else nothing: CUDA is refused.
 *
 * A Tessera container is one where the limits directory exists (the node agent mounts
 * it read-only in every container it gives GPUs, with or without NRI) or where the
 * device plugin's marker variable is set. Neither can be removed by the tenant in a
 * way that helps it: the mount cannot be undone without CAP_SYS_ADMIN, and unsetting
 * the marker leaves the mount. Rule 3 is what holds while the node agent restarts on a
 * node without NRI: its socket is gone, and a process started then must not fall
 * through to limits the tenant chose, whatever config file its image ships.
 */
#ifndef TESSERA_LIMITS_SOURCE_H
#define TESSERA_LIMITS_SOURCE_H

#include <stddef.h>

#include "limits.h"

/* Paths are compile-time settings: a tenant must not be able to move them. */
#ifndef TESSERA_LIMITS_DIR
#define TESSERA_LIMITS_DIR "/run/tessera" /* api.ContainerLimitsDir */
#endif
#define TESSERA_LIMITS_PATH TESSERA_LIMITS_DIR "/limits"
#ifndef TESSERA_CONFIG_PATH
#define TESSERA_CONFIG_PATH "/etc/tessera/cuda-hook.conf"
#endif
/* Owner the administrator's config file must have (root in production). */
#ifndef TESSERA_CONFIG_OWNER
#define TESSERA_CONFIG_OWNER 0
#endif

/* deviceplugin.EnvRequested: set by the device plugin's Allocate in every container
 * that asked for Tessera GPUs. */
#define TESSERA_ENV_REQUESTED "TESSERA_GPU_REQUESTED"

/* Reads this process's limits into out. Returns 0, or -1 with why CUDA must be
 * refused in why. */
int tessera_load_limits(struct tessera_limits *out, char *why, size_t len);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node agent's fallback binding (nodes without NRI): the limits come over the
 * agent's unix socket instead of a file. Protocol: node-agent/bindserver (the
 * reference) and docs/cuda-hook.md.
 */
#ifndef TESSERA_BIND_H
#define TESSERA_BIND_H

#include <stddef.h>

#include "limits.h"

/* Where the agent's socket is inside a container (bindserver.ContainerSocket): in the
 * read-only directory the limits file would otherwise come in, so a tenant can put
 * neither a limits file beside it nor a socket of its own in its place. */
#ifndef TESSERA_BIND_SOCKET
#define TESSERA_BIND_SOCKET TESSERA_LIMITS_DIR "/bind.sock"
#endif

/* How long the hook waits for the agent, which itself waits up to 10 s for kubelet to
 * report a container that has just started. */
#ifndef TESSERA_BIND_TIMEOUT_S
#define TESSERA_BIND_TIMEOUT_S 30
#endif

/* What tessera_bind_parse_reply found in the agent's reply packet. */
enum {
	TESSERA_REPLY_OK = 0,         /* *size is the limits' size in bytes */
	TESSERA_REPLY_REFUSED = 1,    /* msg holds the agent's reason */
	TESSERA_REPLY_MALFORMED = -1, /* msg says what is wrong */
};

/* Parses the agent's reply packet buf[0..n) (bind_reply.c). */
int tessera_bind_parse_reply(const char *buf, size_t n, size_t *size, char *msg, size_t msglen);

/* Asks the agent at path for this process's limits. Returns 0, or -1 with the reason
 * (the agent's own when it refused) in err. */
int tessera_bind_fetch(const char *path, struct tessera_limits *out, char *err, size_t errlen);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where the limits come from: the rules are in limits_source.h, and
 * tessera_load_limits applies them in that order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bind.h"
#include "limits.h"
#include "limits_source.h"

/* Whether a path exists; anything but "no such file" counts as existing, so that an
 * unreadable limits directory never makes the hook take a more permissive rule. */
static int present(const char *path)
{
	return access(path, F_OK) == 0 || errno != ENOENT;
}

/* Why this process is inside a Tessera container, or NULL if it is not. */
static const char *tessera_container_reason(void)
{
	if (present(TESSERA_LIMITS_DIR))
		return "the limits directory " TESSERA_LIMITS_DIR " exists";
	if (getenv(TESSERA_ENV_REQUESTED) != NULL)
		return "the device plugin's " TESSERA_ENV_REQUESTED " is set";
	return NULL;
}

/*
 * Standalone use (no node agent) is allowed only where the administrator's config
 * file, owned by root and writable by no one else, says "allow-env-limits yes". It is
 * consulted only outside Tessera containers (rule 4): a tenant image can ship such a
 * file, owned by root, in its own filesystem.
 */
static int env_limits_allowed(char *why, size_t len)
{
	struct stat st;
	int fd = open(TESSERA_CONFIG_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		(void)tessera_fail(why, len, "%s: %s", TESSERA_CONFIG_PATH, strerror(errno));
		return 0;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != (uid_t)TESSERA_CONFIG_OWNER ||
	    (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
		(void)tessera_fail(why, len, "%s is not a regular file owned by uid %d and writable only by it", TESSERA_CONFIG_PATH,
			 TESSERA_CONFIG_OWNER);
		close(fd);
		return 0;
	}
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0) {
		(void)tessera_fail(why, len, "%s: %s", TESSERA_CONFIG_PATH, strerror(errno));
		return 0;
	}
	buf[n] = '\0';
	int allowed = 0;
	for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		if (strcmp(line, "allow-env-limits yes") == 0)
			allowed = 1;
		else if (strcmp(line, "allow-env-limits no") == 0)
			allowed = 0;
	}
	if (!allowed)
		(void)tessera_fail(why, len, "%s does not say \"allow-env-limits yes\"", TESSERA_CONFIG_PATH);
	return allowed;
}

int tessera_load_limits(struct tessera_limits *out, char *why, size_t len)
{
	char err[400];
	/* 1. The container's limits file. */
	if (present(TESSERA_LIMITS_PATH)) {
		if (tessera_limits_load(TESSERA_LIMITS_PATH, out, err, sizeof(err)) < 0)
			return tessera_fail(why, len, "%s", err);
		return 0;
	}
	/* 2. On a node without NRI the agent's socket is mounted in the same read-only
	 * directory, and the agent answers with this container's limits. Its refusal, or no
	 * answer, refuses CUDA: never unlimited. */
	if (present(TESSERA_BIND_SOCKET)) {
		if (tessera_bind_fetch(TESSERA_BIND_SOCKET, out, err, sizeof(err)) < 0)
			return tessera_fail(why, len, "%s", err);
		return 0;
	}
	/* 3. A Tessera container with neither: the agent is restarting, or it did not bind
	 * this container. Environment limits are never honoured here. */
	const char *inside = tessera_container_reason();
	if (inside != NULL)
		return tessera_fail(why, len,
				    "inside a Tessera container (%s) there is no limits file at %s and no node agent socket at %s; "
				    "limits from the environment are not honoured in a Tessera container",
				    inside, TESSERA_LIMITS_PATH, TESSERA_BIND_SOCKET);
	/* 4. Standalone use, where the administrator allows it. */
	char policy[300];
	if (!env_limits_allowed(policy, sizeof(policy)))
		return tessera_fail(why, len, "no limits file at %s, no node agent socket at %s, and standalone use is not enabled (%s)",
				    TESSERA_LIMITS_PATH, TESSERA_BIND_SOCKET, policy);
	const char *path = getenv("TESSERA_LIMITS_FILE");
	if (path == NULL || path[0] == '\0')
		return tessera_fail(why, len, "no limits file at %s and TESSERA_LIMITS_FILE is not set", TESSERA_LIMITS_PATH);
	if (tessera_limits_load(path, out, err, sizeof(err)) < 0)
		return tessera_fail(why, len, "%s", err);
	return 0;
}

/* ---- the driver's view: CUDA_VISIBLE_DEVICES --------------------------------- */

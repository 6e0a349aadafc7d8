/* SPDX-License-Identifier: Apache-2.0 */
/* The unreserved share file (share.h). */
#include "share.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "<key> <n>\n" at *p, n canonical decimal of at most 6 digits (no sign, no leading
 * zero), as Go's strconv.Itoa writes it. */
static int field(const char **p, const char *end, const char *key, int *n)
{
	size_t kl = strlen(key);
	const char *s = *p;
	if ((size_t)(end - s) < kl + 2 || memcmp(s, key, kl) != 0 || s[kl] != ' ')
		return -1;
	s += kl + 1;
	const char *d = s;
	long v = 0;
	while (s < end && *s >= '0' && *s <= '9' && s - d < 7)
		v = v * 10 + (*s++ - '0');
	if (s == d || s - d > 6 || (s - d > 1 && *d == '0') || s >= end || *s != '\n')
		return -1;
	*n = (int)v;
	*p = s + 1;
	return 0;
}

int tessera_share_parse(const char *buf, size_t len, struct tessera_share *out)
{
	const char *p = buf, *end = buf + len;
	int version, reserved, containers, share, phase;
	if (len > TESSERA_SHARE_MAX_BYTES || field(&p, end, "version", &version) != 0 ||
	    field(&p, end, "reserved", &reserved) != 0 || field(&p, end, "containers", &containers) != 0 ||
	    field(&p, end, "share", &share) != 0 || field(&p, end, "phase", &phase) != 0 || p != end)
		return -1;
	if (version != 1 || reserved > 10000 || containers > 100000 || share < TESSERA_SHARE_MIN || share > 100 ||
	    phase > 99)
		return -1;
	out->share = share;
	out->phase = phase;
	return 0;
}

static int share_path(char *buf, size_t len, const char *uuid, const char *file)
{
	if (uuid[0] == '\0' || uuid[0] == '.' || strchr(uuid, '/') != NULL)
		return -1;
	int n = snprintf(buf, len, "%s/%s%s%s", TESSERA_SHARES_DIR, uuid, file[0] ? "/" : "", file);
	return n > 0 && (size_t)n < len ? 0 : -1;
}

int tessera_share_present(const char *uuid)
{
	char path[256];
	if (share_path(path, sizeof(path), uuid, "") != 0)
		return 0;
	/* open(O_DIRECTORY), not stat(): the hook must not need glibc 2.33's stat symbol
	 * (compat/glibc-2.28.h). */
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

int tessera_share_read(const char *uuid, struct tessera_share *out)
{
	char path[256], buf[TESSERA_SHARE_MAX_BYTES + 1];
	if (share_path(path, sizeof(path), uuid, TESSERA_SHARE_FILE) != 0)
		return -1;
	/* O_NONBLOCK: a named pipe in the file's place (it cannot be the agent's) does not
	 * hold the caller; fstat refuses it. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return -1;
	struct stat st;
	ssize_t n = -1;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		do
			n = read(fd, buf, sizeof(buf));
		while (n < 0 && errno == EINTR);
	}
	close(fd);
	if (n < 0 || n > TESSERA_SHARE_MAX_BYTES)
		return -1;
	return tessera_share_parse(buf, (size_t)n, out);
}

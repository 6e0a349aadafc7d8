/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Client of the node agent's fallback binding. The agent identifies this process by
 * its peer credentials and cgroup, so the request carries nothing but a version; the
 * answer is one packet: "ok <bytes>\n" with a sealed memfd holding the limits file, or
 * "error <reason>\n".
 */
#define _GNU_SOURCE
#include "bind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define BIND_REQUEST "tessera-bind 1\n"
#define BIND_MAX_FDS 4
#define REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)

/* Reads the limits from a sealed memfd of size bytes. */
static int read_sealed(int fd, size_t size, struct tessera_limits *out, char *err, size_t errlen)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS)
		return tessera_fail(err, errlen, "the node agent's limits did not come sealed (seals %#x)", seals < 0 ? 0 : seals);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != size)
		return tessera_fail(err, errlen, "the node agent's limits are not the %zu bytes it announced", size);
	char *buf = malloc(size);
	if (buf == NULL)
		return tessera_fail(err, errlen, "reading the node agent's limits: out of memory");
	size_t n = 0;
	while (n < size) {
		ssize_t r = pread(fd, buf + n, size - n, (off_t)n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(buf);
			return tessera_fail(err, errlen, "reading the node agent's limits: %s", r < 0 ? strerror(errno) : "short read");
		}
		n += (size_t)r;
	}
	char perr[300];
	int rc = tessera_limits_parse(buf, size, out, perr, sizeof(perr));
	free(buf);
	if (rc < 0)
		return tessera_fail(err, errlen, "the node agent's limits: %s", perr);
	return 0;
}

int tessera_bind_fetch(const char *path, struct tessera_limits *out, char *err, size_t errlen)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(addr.sun_path))
		return tessera_fail(err, errlen, "the node agent's socket path %s is too long", path);
	memcpy(addr.sun_path, path, strlen(path) + 1);

	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return tessera_fail(err, errlen, "socket: %s", strerror(errno));
	struct timeval tv = {.tv_sec = TESSERA_BIND_TIMEOUT_S};
	(void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc;
	do
		rc = connect(s, (struct sockaddr *)&addr, sizeof(addr));
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int e = errno;
		close(s);
		return tessera_fail(err, errlen, "cannot reach the node agent at %s: %s", path, strerror(e));
	}
	ssize_t w;
	do
		w = send(s, BIND_REQUEST, sizeof(BIND_REQUEST) - 1, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	if (w != (ssize_t)(sizeof(BIND_REQUEST) - 1)) {
		int e = errno;
		close(s);
		return tessera_fail(err, errlen, "asking the node agent at %s: %s", path, w < 0 ? strerror(e) : "short write");
	}

	char line[1024];
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * BIND_MAX_FDS)];
	} ctl;
	struct iovec iov = {.iov_base = line, .iov_len = sizeof(line) - 1};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
	ssize_t n;
	do
		n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	int e = errno;
	close(s);

	int fds[BIND_MAX_FDS], nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); n >= 0 && c != NULL; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (nfds < BIND_MAX_FDS)
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	rc = -1;
	if (n < 0) {
		if (e == EAGAIN || e == EWOULDBLOCK)
			tessera_fail(err, errlen, "the node agent at %s did not answer within %d s", path, TESSERA_BIND_TIMEOUT_S);
		else
			tessera_fail(err, errlen, "reading the node agent's answer: %s", strerror(e));
	} else if (n == 0) {
		tessera_fail(err, errlen, "the node agent at %s closed the connection without an answer", path);
	} else if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		tessera_fail(err, errlen, "the node agent's answer was truncated");
	} else {
		size_t size = 0;
		char why[400];
		int kind = tessera_bind_parse_reply(line, (size_t)n, &size, why, sizeof(why));
		if (kind == TESSERA_REPLY_REFUSED) {
			tessera_fail(err, errlen, "the node agent refused: %s", why);
		} else if (kind != TESSERA_REPLY_OK) {
			tessera_fail(err, errlen, "%s", why);
		} else if (nfds != 1) {
			tessera_fail(err, errlen, "the node agent's answer came with %d descriptors, want 1", nfds);
		} else {
			rc = read_sealed(fds[0], size, out, err, errlen);
		}
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	return rc;
}

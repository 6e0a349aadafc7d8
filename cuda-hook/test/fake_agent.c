/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the node agent's fallback socket (node-agent/bindserver), for the
 * fake-driver suite: it answers every caller the same way.
 *
 *   fake_agent <socket> ok <limits-file>        the file in a sealed memfd
 *   fake_agent <socket> unsealed <limits-file>  the same, not sealed
 *   fake_agent <socket> error <reason>          a refusal
 *   fake_agent <socket> silent                  closes without answering
 *   fake_agent <socket> nofd                    "ok" without a descriptor
 *
 * It creates <socket>.ready once it listens, and serves until it is killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int die(const char *what)
{
	fprintf(stderr, "fake_agent: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int memfd_of(const char *file, int seal, size_t *size)
{
	char buf[65536];
	int in = open(file, O_RDONLY);
	if (in < 0)
		die(file);
	ssize_t n = read(in, buf, sizeof(buf));
	close(in);
	if (n <= 0)
		die("reading the limits");
	int fd = memfd_create("tessera-limits", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		die("memfd_create");
	if (write(fd, buf, (size_t)n) != n)
		die("write");
	if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		die("F_ADD_SEALS");
	*size = (size_t)n;
	return fd;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: fake_agent <socket> ok|unsealed|error|silent|nofd [arg]\n");
		return 2;
	}
	const char *mode = argv[2];
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
	unlink(argv[1]);
	int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(l, 16) < 0)
		die("listen");
	char ready[200];
	snprintf(ready, sizeof(ready), "%s.ready", argv[1]);
	close(open(ready, O_CREAT | O_WRONLY, 0644));
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			die("accept");
		}
		char req[64];
		ssize_t n = recv(c, req, sizeof(req), 0);
		if (n != 15 || memcmp(req, "tessera-bind 1\n", 15) != 0) {
			fprintf(stderr, "fake_agent: unexpected request\n");
			close(c);
			continue;
		}
		char line[1024];
		if (strcmp(mode, "error") == 0) {
			snprintf(line, sizeof(line), "error %s\n", argc > 3 ? argv[3] : "refused");
			send(c, line, strlen(line), MSG_NOSIGNAL);
		} else if (strcmp(mode, "nofd") == 0) {
			send(c, "ok 100\n", 7, MSG_NOSIGNAL);
		} else if (strcmp(mode, "ok") == 0 || strcmp(mode, "unsealed") == 0) {
			size_t size;
			int fd = memfd_of(argv[3], strcmp(mode, "ok") == 0, &size);
			snprintf(line, sizeof(line), "ok %zu\n", size);
			union {
				struct cmsghdr h;
				char buf[CMSG_SPACE(sizeof(int))];
			} ctl;
			struct iovec iov = {.iov_base = line, .iov_len = strlen(line)};
			struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &fd, sizeof(int));
			if (sendmsg(c, &msg, MSG_NOSIGNAL) < 0)
				perror("fake_agent: sendmsg");
			close(fd);
		}
		/* "silent": nothing */
		close(c);
	}
}

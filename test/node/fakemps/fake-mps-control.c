/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake-mps-control: the MPS control program of the real-node suite's fake driver
 * (make test-node), which the node agent runs as --mps-control on a node without a
 * GPU. It speaks the parts of nvidia-cuda-mps-control that Tessera uses:
 *
 *   fake-mps-control -f   the control daemon, in the foreground: it needs
 *                         CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and
 *                         CUDA_VISIBLE_DEVICES (a GPU UUID), as the agent gives them;
 *                         writes its PID to nvidia-cuda-mps-control.pid and listens on
 *                         the Unix socket "control" in the pipe directory, as the real
 *                         daemon does (the fake libcuda.so.1 counts a process as an MPS
 *                         client when its pipe directory holds "control"); SIGTERM or
 *                         "quit" ends it and removes both
 *   fake-mps-control      the client: sends each line of stdin to the daemon of
 *                         CUDA_MPS_PIPE_DIRECTORY and prints its answer:
 *                         get_server_list (no server: the fake driver's clients never
 *                         connect, so the daemon never starts one), get_client_list
 *                         PID ("Server PID not found"), quit
 *
 * Without a daemon the client prints "Cannot find MPS control daemon process" and exits
 * 1, like the real one. Every command the daemon answers is logged to control.log in
 * the log directory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define PID_FILE "nvidia-cuda-mps-control.pid"

static char control_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char pid_path[4096];
static char log_path[4096];
static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static void logf_(const char *fmt, const char *arg)
{
	FILE *f = fopen(log_path, "a");
	if (f == NULL)
		return;
	fprintf(f, fmt, arg);
	fputc('\n', f);
	fclose(f);
}

static int socket_path(const char *pipe)
{
	if (snprintf(control_path, sizeof(control_path), "%s/control", pipe) >= (int)sizeof(control_path)) {
		fprintf(stderr, "fake-mps-control: %s/control does not fit a socket address\n", pipe);
		return -1;
	}
	return 0;
}

static int connect_daemon(void)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, control_path, sizeof(a.sun_path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* One command per connection: the line, then the answer until the daemon closes. */
static int client(void)
{
	char line[512];
	while (fgets(line, sizeof(line), stdin) != NULL) {
		int fd = connect_daemon();
		if (fd < 0) {
			printf("Cannot find MPS control daemon process\n");
			return 1;
		}
		size_t n = strlen(line);
		if (n == 0 || line[n - 1] != '\n')
			line[n++] = '\n';
		if (write(fd, line, n) != (ssize_t)n) {
			close(fd);
			return 1;
		}
		char buf[512];
		ssize_t r;
		while ((r = read(fd, buf, sizeof(buf))) > 0)
			fwrite(buf, 1, (size_t)r, stdout);
		close(fd);
	}
	return 0;
}

static void cleanup(void)
{
	unlink(control_path);
	unlink(pid_path);
}

static void answer(int fd, const char *s)
{
	size_t n = strlen(s);
	while (n > 0) {
		ssize_t w = write(fd, s, n);
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

static int daemon_main(const char *pipe)
{
	const char *log = getenv("CUDA_MPS_LOG_DIRECTORY");
	const char *dev = getenv("CUDA_VISIBLE_DEVICES");
	if (log == NULL || *log == '\0' || dev == NULL || strncmp(dev, "GPU-", 4) != 0) {
		fprintf(stderr, "fake-mps-control: CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES (a GPU UUID) must be set\n");
		return 2;
	}
	snprintf(pid_path, sizeof(pid_path), "%s/%s", pipe, PID_FILE);
	snprintf(log_path, sizeof(log_path), "%s/control.log", log);
	FILE *pf = fopen(pid_path, "r");
	if (pf != NULL) {
		int pid = 0;
		if (fscanf(pf, "%d", &pid) == 1 && pid > 0 && kill(pid, 0) == 0) {
			fclose(pf);
			fprintf(stderr, "An instance of this daemon is already running\n");
			return 1;
		}
		fclose(pf);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, control_path, sizeof(a.sun_path));
	unlink(control_path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 16) != 0) {
		fprintf(stderr, "fake-mps-control: listening on %s: %s\n", control_path, strerror(errno));
		return 1;
	}
	pf = fopen(pid_path, "w");
	if (pf == NULL || fprintf(pf, "%d\n", (int)getpid()) < 0 || fclose(pf) != 0) {
		fprintf(stderr, "fake-mps-control: writing %s: %s\n", pid_path, strerror(errno));
		unlink(control_path);
		return 1;
	}
	/* No SA_RESTART: a SIGTERM interrupts accept. */
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	logf_("started for %s", dev);
	while (!stop) {
		int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		char cmd[512];
		size_t n = 0;
		ssize_t r;
		while (n < sizeof(cmd) - 1 && (r = read(c, cmd + n, sizeof(cmd) - 1 - n)) > 0) {
			n += (size_t)r;
			if (memchr(cmd, '\n', n) != NULL)
				break;
		}
		cmd[n] = '\0';
		cmd[strcspn(cmd, "\r\n")] = '\0';
		logf_("command %s", cmd);
		int pid;
		char extra;
		if (strcmp(cmd, "get_server_list") == 0) {
			/* No server runs: nothing to list. */
		} else if (sscanf(cmd, "get_client_list %d %c", &pid, &extra) == 1) {
			char msg[64];
			snprintf(msg, sizeof(msg), "Server %d not found\n", pid);
			answer(c, msg);
		} else if (strcmp(cmd, "quit") == 0) {
			stop = 1;
		} else {
			char msg[600];
			snprintf(msg, sizeof(msg), "Unknown command \"%s\"\n", cmd);
			answer(c, msg);
		}
		close(c);
	}
	close(fd);
	cleanup();
	logf_("%s", "quit");
	return 0;
}

int main(int argc, char **argv)
{
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	if (pipe == NULL || *pipe == '\0')
		pipe = "/tmp/nvidia-mps";
	if (socket_path(pipe) != 0)
		return 2;
	if (argc == 2 && strcmp(argv[1], "-f") == 0)
		return daemon_main(pipe);
	if (argc == 1)
		return client();
	fprintf(stderr, "usage: fake-mps-control [-f] (commands on stdin without -f)\n");
	return 2;
}

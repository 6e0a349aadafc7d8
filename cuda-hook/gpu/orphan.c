/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the driver does with a dead process's memory while a child it forked still
 * holds the driver's descriptors. On an H200 with driver 580 it keeps it until the
 * last holder exits (memory belongs to the open file description, not to the PID),
 * which is why the hook gives a dead process's usage back only once no process holds
 * its lease (docs/cuda-hook.md, "Shared by the container's processes"); the fake
 * driver models it so. make test-gpu prints this as information.
 *
 *   orphan <mib> <gpu-uuid>   run with CUDA_VISIBLE_DEVICES=<gpu-uuid>
 *
 * A process allocates mib on the GPU, forks a child that keeps the inherited
 * descriptors and does nothing else, and exits; this program (a subreaper, with no
 * CUDA of its own) reads the GPU's used memory through nvidia-smi before, while the
 * allocator lives, and after it exited while the child still runs. It also reports how
 * many of the child's driver descriptors are close-on-exec (the hook's lease file is
 * O_CLOEXEC on the assumption that they all are). Exit status 0: the memory was freed
 * within 10 s; 1: the driver kept it; 2: nothing was tested (the allocation did not
 * show, or the child held no driver descriptor).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver_check.h"

#define MIB (1024ULL * 1024ULL)

static const char *uuid;

/* The GPU's used memory in MiB, as nvidia-smi reports it (-1: cannot tell). */
static long gpu_used(void)
{
	char cmd[256], line[128];
	long mib = -1;
	snprintf(cmd, sizeof(cmd), "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i %s", uuid);
	FILE *f = popen(cmd, "r");
	if (f == NULL)
		return -1;
	if (fgets(line, sizeof(line), f) == NULL || sscanf(line, "%ld", &mib) != 1)
		mib = -1;
	pclose(f);
	return mib;
}

/* How many of this process's descriptors are the driver's device files, and how many
 * of those are close-on-exec. */
static int driver_fds(int *cloexec)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], target[256];
	int n = 0;
	*cloexec = 0;
	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t k = readlink(path, target, sizeof(target) - 1);
		if (k > 0) {
			target[k] = 0;
			if (strncmp(target, "/dev/nvidia", 11) == 0) {
				int fl = fcntl(atoi(e->d_name), F_GETFD);
				n++;
				*cloexec += fl >= 0 && (fl & FD_CLOEXEC);
			}
		}
	}
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: orphan <mib> <gpu-uuid>\n");
		return 2;
	}
	long mib = atol(argv[1]);
	uuid = argv[2];
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
		perror("prctl");
		return 2;
	}
	int info[2], go[2], release[2];
	if (pipe(info) || pipe(go) || pipe(release)) {
		perror("pipe");
		return 2;
	}
	long base = gpu_used();
	pid_t allocator = fork();
	if (allocator == 0) {
		CUdevice dev;
		CUcontext ctx;
		CUdeviceptr p;
		CK(cuInit(0));
		CK(cuDeviceGet(&dev, 0));
		CK(cuDevicePrimaryCtxRetain(&ctx, dev));
		CK(cuCtxSetCurrent(ctx));
		CK(cuMemAlloc(&p, (size_t)mib * MIB));
		CK(cuMemsetD8(p, 1, (size_t)mib * MIB));
		CK(cuCtxSynchronize());
		pid_t child = fork();
		if (child == 0) {
			/* Keeps what it inherited and nothing more, until told to go. */
			int msg[3] = {(int)getpid(), 0, 0};
			msg[1] = driver_fds(&msg[2]);
			char c;
			if (write(info[1], msg, sizeof(msg)) != sizeof(msg))
				_exit(2);
			if (read(release[0], &c, 1) < 0)
				_exit(2);
			_exit(0);
		}
		char c;
		if (read(go[0], &c, 1) < 0)
			_exit(2);
		_exit(0); /* nothing freed, no context destroyed */
	}
	int msg[3];
	if (read(info[0], msg, sizeof(msg)) != sizeof(msg)) {
		fprintf(stderr, "the allocator failed before it forked\n");
		return 2;
	}
	pid_t child = msg[0];
	long held = gpu_used();
	if (write(go[1], "x", 1) != 1)
		return 2;
	int st;
	waitpid(allocator, &st, 0);
	double t0 = now_s(), t = 0;
	long after = -1;
	int child_alive = 0;
	while ((t = now_s() - t0) < 10) {
		after = gpu_used();
		child_alive = kill(child, 0) == 0;
		if (after >= 0 && after < base + mib / 4)
			break;
		usleep(100000);
	}
	if (write(release[1], "x", 1) != 1)
		return 2;
	waitpid(child, &st, 0);
	const char *verdict = "freed";
	int rc = 0;
	if (base < 0 || held < base + mib * 9 / 10 || msg[1] == 0 || !child_alive) {
		verdict = "not tested (allocation not seen, or the child held no driver descriptor)";
		rc = 2;
	} else if (after < 0 || after >= base + mib / 4) {
		verdict = "KEPT: the driver holds a dead process's memory while its child lives (the hook keeps it counted)";
		rc = 1;
	}
	printf("orphan mib=%ld child_driver_fds=%d cloexec=%d used_mib before=%ld held=%ld after_exit=%ld (%.1f s after, child alive) %s\n",
	       mib, msg[1], msg[2], base, held, after, t, verdict);
	return rc;
}

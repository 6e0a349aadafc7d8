/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tessera-pause: the pod sandbox's process in the real-node suite's pause image (the
 * suite runs without a registry, so it brings its own). It waits for a signal and
 * exits 0 on SIGTERM or SIGINT, as Kubernetes' pause does.
 */
#include <signal.h>
#include <unistd.h>

static void stop(int sig)
{
	(void)sig;
	_exit(0);
}

int main(void)
{
	signal(SIGTERM, stop);
	signal(SIGINT, stop);
	for (;;)
		pause();
}

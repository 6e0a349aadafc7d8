/* SPDX-License-Identifier: Apache-2.0 */
/* The monotonic clock, in nanoseconds: what pacing, the residency probes and the GPU
 * turns measure with. All processes on a node share it. */
#ifndef TESSERA_CLOCK_H
#define TESSERA_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t tessera_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The same clock at the kernel's tick (1-4 ms behind at most): a few ns, no system
 * call, for checks on the launch path that need no finer time. */
static inline int64_t tessera_coarse_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif

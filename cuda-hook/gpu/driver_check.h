/* SPDX-License-Identifier: Apache-2.0 */
/* What the GPU suite's programs share: a CUDA call that fails ends the program,
 * naming the call and its error (CK for the driver API, CKRT for the runtime API
 * in the .cu programs), and the clocks their measurements read. */
#ifndef TESSERA_GPU_DRIVER_CHECK_H
#define TESSERA_GPU_DRIVER_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                       \
	do {                                                        \
		CUresult r_ = (x);                                  \
		if (r_ != CUDA_SUCCESS) {                           \
			fprintf(stderr, "%s failed: %d\n", #x, r_); \
			exit(1);                                    \
		}                                                   \
	} while (0)

/* CUDART_VERSION: the includer has the runtime API (cuda_runtime.h, which nvcc
 * includes in every .cu file). */
#ifdef CUDART_VERSION
#define CKRT(x)                                                                    \
	do {                                                                       \
		cudaError_t e_ = (x);                                              \
		if (e_ != cudaSuccess) {                                           \
			fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));   \
			exit(1);                                                   \
		}                                                                  \
	} while (0)
#endif

/* Seconds on the monotonic clock, for intervals. */
static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds since the epoch, for instants other processes agree on. */
static inline double epoch_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif

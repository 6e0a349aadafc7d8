/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hook's state: one struct, set up once by tessera_init (init.c), and the checks
 * every hook starts with. Nothing here is exported.
 */
#ifndef TESSERA_STATE_H
#define TESSERA_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "limits.h"
#include "real.h"
#include "region.h"
#include "tessera_cuda.h"

#define MIB (1024ULL * 1024ULL)

struct tessera_state {
	/* Set once by tessera_init; CUDA_SUCCESS, or the error every hook returns. */
	CUresult status;
	char why[512];
	struct tessera_limits limits;
	void *libcuda;
	struct tessera_real real;
	struct tessera_region *region;

	/* The container's GPUs this process sees, in the order it sees them (indexes into
	 * limits.gpus): all of them in the limits' order, unless the tenant narrowed them
	 * with CUDA_VISIBLE_DEVICES. Set before the driver loads (visible_devices.c). */
	int nview;
	int view[TESSERA_MAX_GPUS];

	/* Devices, resolved after cuInit: the container sees limits.gpus[vis[i]] as CUDA
	 * device i; real_dev[g] is the driver's CUdevice of limits.gpus[g] (-1: absent). */
	pthread_mutex_t dev_mu;
	_Atomic int dev_ready;
	int nvis;
	int vis[TESSERA_MAX_GPUS];
	CUdevice real_dev[TESSERA_MAX_GPUS];

	/* NVML, loaded only when the program calls NVML. */
	pthread_mutex_t nvml_mu;
	void *libnvml;
	int nvml_ready;
	int nvml_nvis;
	nvmlDevice_t nvml_dev[TESSERA_MAX_GPUS]; /* by limits index; NULL: absent */
	int nvml_vis[TESSERA_MAX_GPUS];

	/* Open stream captures in this process: pacing never synchronizes during one. */
	_Atomic int captures;
};

extern struct tessera_state tessera;

/* Sets up the state once; returns tessera.status. After the first call, one acquire
 * load (no call into libc) on every hook. */
extern _Atomic int tessera_ready;
CUresult tessera_init_slow(void);
static inline CUresult tessera_init(void)
{
	if (__builtin_expect(atomic_load_explicit(&tessera_ready, memory_order_acquire), 1))
		return tessera.status;
	return tessera_init_slow();
}

/* GPU gpu's memory limit (a limits index). */
uint64_t tessera_limit_bytes(int gpu);

#define REAL(name) (tessera.real.name)

/* Every hook starts with this: set up once, then fail closed if that failed. */
#define HOOK_ENTER()                                                  \
	do {                                                          \
		CUresult hook_rc_ = tessera_init();                   \
		if (hook_rc_ != CUDA_SUCCESS)                         \
			return hook_rc_;                              \
	} while (0)
#define HOOK_REAL(name)                                               \
	do {                                                          \
		if (REAL(name) == NULL)                               \
			return CUDA_ERROR_NOT_FOUND;                  \
	} while (0)

#endif

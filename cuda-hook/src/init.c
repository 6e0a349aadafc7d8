/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Set-up: the hook's state, filled once on the first call into any hook (pthread_once),
 * in this order: the log's verbosity, the limits (limits_source.c), the GPUs this
 * process sees (visible_devices.c), the driver and its functions, the container's
 * accounting region, pacing. Any failure is kept as the error every hook returns.
 * Also what a forked child and an exiting process do to the state.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "devices.h"
#include "fork.h"
#include "limits_source.h"
#include "log.h"
#include "mps.h"
#include "pacing.h"
#include "state.h"

struct tessera_state tessera = {
	.dev_mu = PTHREAD_MUTEX_INITIALIZER,
	.nvml_mu = PTHREAD_MUTEX_INITIALIZER,
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
	/* A child starts with no CUDA state of its own: the parent's allocations, context
	 * charges and accounting slot are the parent's. */
	atomic_store(&tessera.captures, 0);
	pthread_mutex_init(&tessera.dev_mu, NULL);
	pthread_mutex_init(&tessera.nvml_mu, NULL);
	/* Then each part's own handler, in the order of fork.h. */
	tessera_fork_child();
}

static void process_exit(void)
{
	if (tessera.region != NULL)
		tessera_region_forget_process(tessera.region);
}

static void init(void)
{
	tessera_log_setup();

	if (tessera_load_limits(&tessera.limits, tessera.why, sizeof(tessera.why)) < 0) {
		tessera.status = CUDA_ERROR_NOT_PERMITTED;
		tessera_log(TESSERA_LOG_ERROR, "refusing CUDA: %s", tessera.why);
		return;
	}
	tessera_narrow_visible_devices();
	tessera_mps_env(); /* before the driver reads it */
	tessera.libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (tessera.libcuda == NULL) {
		snprintf(tessera.why, sizeof(tessera.why), "cannot load libcuda.so.1: %s", dlerror());
		tessera.status = CUDA_ERROR_NOT_INITIALIZED;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	tessera_resolve(tessera.libcuda, TESSERA_LIB_CUDA);
	if (REAL(cuGetProcAddress_v2) == NULL && REAL(cuGetProcAddress) == NULL) {
		snprintf(tessera.why, sizeof(tessera.why), "libcuda.so.1 has no cuGetProcAddress; the driver is too old");
		tessera.status = CUDA_ERROR_NOT_SUPPORTED;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	char err[300];
	if (tessera_region_open(tessera.limits.cgroup, tessera.limits.region_dir, tessera.limits.ngpus, &tessera.region, err, sizeof(err)) < 0) {
		snprintf(tessera.why, sizeof(tessera.why), "%s", err);
		tessera.status = CUDA_ERROR_OPERATING_SYSTEM;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	/* Before the driver opens its descriptors (the hooked cuInit), so that every
	 * process that comes to share them shares the lease. */
	if (tessera_region_hold_lease(err, sizeof(err)) < 0) {
		snprintf(tessera.why, sizeof(tessera.why), "%s", err);
		tessera.status = CUDA_ERROR_OPERATING_SYSTEM;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	for (int i = 0; i < TESSERA_MAX_GPUS; i++)
		tessera.real_dev[i] = -1;
	tessera_pacing_setup();
	pthread_atfork(NULL, NULL, fork_child);
	atexit(process_exit);
	tessera.status = CUDA_SUCCESS;
	tessera_log(TESSERA_LOG_INFO, "limits loaded cgroup=%s gpus=%d context-mib=%llu", tessera.limits.cgroup,
		    tessera.limits.ngpus, (unsigned long long)tessera.limits.context_mib);
}

_Atomic int tessera_ready;

CUresult tessera_init_slow(void)
{
	pthread_once(&init_once, init);
	atomic_store_explicit(&tessera_ready, 1, memory_order_release);
	return tessera.status;
}

uint64_t tessera_limit_bytes(int gpu)
{
	return tessera.limits.gpus[gpu].memory_mib * MIB;
}

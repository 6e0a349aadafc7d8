/* SPDX-License-Identifier: Apache-2.0 */
/*
 * MPS clients: see mps.h. What the driver reads and when was checked on an H200
 * (docs/cuda-hook.md, "MPS clients"): the percentage is read at cuInit; an MPS
 * client's CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT is already its share of the SMs;
 * and a context created with an execution-affinity SM count of the client's whole
 * share read back every SM of the GPU.
 */
#define _GNU_SOURCE
#include <math.h> /* isfinite */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mps.h"
#include "state.h"

#define ENV_PIPE "CUDA_MPS_PIPE_DIRECTORY"
#define ENV_PERCENT "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#define ENV_PINNED "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

/* The tenant's percentage if it is a plain decimal (digits, an optional fraction) in
 * (0, 100], else -1. MPS reads the variable as a number; anything else is replaced. */
static double tenant_percent(const char *v)
{
	if (v == NULL || v[0] < '0' || v[0] > '9')
		return -1;
	char *end;
	double d = strtod(v, &end);
	if (*end != '\0' || !isfinite(d) || d <= 0 || d > 100)
		return -1;
	for (const char *p = v; *p; p++)
		if (!((*p >= '0' && *p <= '9') || *p == '.'))
			return -1; /* no exponents, hex or signs */
	return d;
}

static void set(const char *name, const char *value)
{
	const char *now = getenv(name);
	if (now != NULL && strcmp(now, value) == 0)
		return;
	if (setenv(name, value, 1) != 0)
		tessera_log(TESSERA_LOG_ERROR, "cannot set %s=%s", name, value);
	else if (now != NULL)
		tessera_log(TESSERA_LOG_INFO, "MPS client: %s=%s replaces the environment's %s", name, value, now);
}

void tessera_mps_env(void)
{
	const struct tessera_limits *l = &tessera.limits;
	if (l->mps_percent <= 0)
		return;
	set(ENV_PIPE, l->mps_pipe);
	const char *mine = getenv(ENV_PERCENT);
	double t = tenant_percent(mine);
	if (!(t > 0 && t <= l->mps_percent)) {
		char v[8];
		snprintf(v, sizeof(v), "%d", l->mps_percent);
		set(ENV_PERCENT, v);
	}
	/* The client numbers its GPUs in the limits' order (visible_devices.c). */
	char pinned[TESSERA_MAX_GPUS * 24];
	size_t off = 0;
	for (int i = 0; i < l->ngpus && off < sizeof(pinned); i++)
		off += (size_t)snprintf(pinned + off, sizeof(pinned) - off, "%s%d=%lluM", i ? "," : "", i,
					(unsigned long long)l->gpus[i].memory_mib);
	set(ENV_PINNED, pinned);
}

CUresult tessera_mps_check(void)
{
	if (tessera.limits.mps_percent <= 0)
		return CUDA_SUCCESS;
	HOOK_REAL(cuDeviceGetAttribute);
	for (int i = 0; i < tessera.nvis; i++) {
		int g = tessera.vis[i], on = 0;
		CUresult rc = REAL(cuDeviceGetAttribute)(&on, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, tessera.real_dev[g]);
		if (rc != CUDA_SUCCESS || !on) {
			snprintf(tessera.why, sizeof(tessera.why),
				 "GPU %s is granted as an MPS client, but the driver did not connect to an MPS server through %s "
				 "(%s): the MPS control daemon is not serving it; refusing CUDA rather than running outside MPS",
				 tessera.limits.gpus[g].uuid, tessera.limits.mps_pipe,
				 rc != CUDA_SUCCESS ? "the driver cannot tell" : "MPS is not enabled for this process");
			tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
			/* Every later call is refused too: the driver is up, outside MPS. */
			tessera.status = CUDA_ERROR_MPS_CONNECTION_FAILED;
			return CUDA_ERROR_MPS_CONNECTION_FAILED;
		}
	}
	return CUDA_SUCCESS;
}

unsigned int tessera_mps_sm_cap(CUdevice dev)
{
	if (tessera.limits.mps_percent <= 0 || REAL(cuDeviceGetAttribute) == NULL)
		return 0;
	/* An MPS client's SM count is its share already (the driver applied the
	 * percentage at cuInit). */
	int sms = 0;
	if (REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || sms <= 0)
		return 0;
	return (unsigned int)sms;
}

int tessera_mps_too_wide(CUdevice dev, CUcontext ctx)
{
	if (tessera.limits.mps_percent <= 0)
		return 0;
	/* A count that cannot be read, the client's or the context's, counts as too wide:
	 * the plain context that replaces it has the client's share whatever it is. */
	unsigned int cap = tessera_mps_sm_cap(dev);
	CUexecAffinityParam a;
	memset(&a, 0, sizeof(a));
	CUresult rc = REAL(cuCtxGetExecAffinity) == NULL ? CUDA_ERROR_NOT_FOUND
							 : REAL(cuCtxGetExecAffinity)(&a, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
	if (cap > 0 && rc == CUDA_SUCCESS && a.param.smCount.val <= cap)
		return 0;
	tessera_log(TESSERA_LOG_INFO, "MPS client: a context with execution affinity has %u SMs (%s), more than the share's %u: "
		    "made again without it", a.param.smCount.val, rc == CUDA_SUCCESS ? "read back" : "unreadable", cap);
	if (REAL(cuCtxDestroy_v2) != NULL)
		REAL(cuCtxDestroy_v2)(ctx);
	return 1;
}

CUresult tessera_mps_affinity(CUdevice dev, CUexecAffinityParam *in, int n, CUexecAffinityParam *copy, int max,
			      CUexecAffinityParam **use)
{
	*use = in;
	unsigned int cap = tessera_mps_sm_cap(dev);
	if (cap == 0 || in == NULL || n <= 0)
		return CUDA_SUCCESS;
	if (n > max) {
		tessera_log(TESSERA_LOG_ERROR, "a context with %d execution-affinity parameters: refused", n);
		return CUDA_ERROR_INVALID_VALUE;
	}
	memcpy(copy, in, (size_t)n * sizeof(*in));
	for (int i = 0; i < n; i++) {
		if (copy[i].type == CU_EXEC_AFFINITY_TYPE_SM_COUNT && copy[i].param.smCount.val > cap) {
			tessera_log(TESSERA_LOG_INFO, "MPS client: a context asking for %u SMs gets %u (its share)",
				    copy[i].param.smCount.val, cap);
			copy[i].param.smCount.val = cap;
		}
	}
	*use = copy;
	return CUDA_SUCCESS;
}

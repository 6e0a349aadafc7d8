/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device virtualisation: the container sees only its GPUs, in its order, as CUDA
 * devices 0..n-1, each showing at most its memory limit as total memory. The driver's
 * devices are matched to the limits' GPUs by UUID once, after cuInit.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "devices.h"
#include "interpose.h"
#include "log.h"
#include "mps.h"
#include "state.h"

const char *tessera_uuid_body(const char *u)
{
	return strncasecmp(u, "GPU-", 4) == 0 || strncasecmp(u, "MIG-", 4) == 0 ? u + 4 : u;
}

void tessera_format_uuid(const CUuuid *u, char *out, size_t len)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
		 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* UUIDs compare without their "GPU-"/"MIG-" prefix and without regard to case, since
 * CUDA reports a MIG instance's UUID as bytes and NVML as text. */
int tessera_same_uuid(const char *a, const char *b)
{
	return strcasecmp(tessera_uuid_body(a), tessera_uuid_body(b)) == 0;
}

CUresult tessera_devices(void)
{
	if (atomic_load_explicit(&tessera.dev_ready, memory_order_acquire))
		return CUDA_SUCCESS;
	if (REAL(cuDeviceGetCount) == NULL || REAL(cuDeviceGet) == NULL || REAL(cuDeviceGetUuid_v2) == NULL)
		return CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&tessera.dev_mu);
	CUresult rc = CUDA_SUCCESS;
	if (!atomic_load(&tessera.dev_ready)) {
		int n = 0;
		rc = REAL(cuDeviceGetCount)(&n);
		for (int i = 0; rc == CUDA_SUCCESS && i < n; i++) {
			CUdevice d;
			CUuuid u;
			char s[64];
			if ((rc = REAL(cuDeviceGet)(&d, i)) != CUDA_SUCCESS || (rc = REAL(cuDeviceGetUuid_v2)(&u, d)) != CUDA_SUCCESS)
				break;
			tessera_format_uuid(&u, s, sizeof(s));
			for (int g = 0; g < tessera.limits.ngpus; g++)
				if (tessera.real_dev[g] < 0 && tessera_same_uuid(s, tessera.limits.gpus[g].uuid))
					tessera.real_dev[g] = d;
		}
		if (rc == CUDA_SUCCESS) {
			tessera.nvis = 0;
			for (int i = 0; i < tessera.nview; i++) {
				int g = tessera.view[i];
				if (tessera.real_dev[g] >= 0)
					tessera.vis[tessera.nvis++] = g;
				else
					tessera_log(TESSERA_LOG_WARN, "assigned GPU %s is not visible to the driver",
						    tessera.limits.gpus[g].uuid);
			}
			if (tessera.nvis == 0 && tessera.nview > 0)
				tessera_log(TESSERA_LOG_ERROR, "none of the container's %d GPUs is visible to the driver",
					    tessera.limits.ngpus);
			else if (tessera.nview == 0)
				tessera_log(TESSERA_LOG_INFO, "CUDA_VISIBLE_DEVICES names none of the container's %d GPUs",
					    tessera.limits.ngpus);
			atomic_store_explicit(&tessera.dev_ready, 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&tessera.dev_mu);
	return rc;
}

int tessera_gpu_of_device(CUdevice dev)
{
	for (int i = 0; i < tessera.nvis; i++)
		if (tessera.real_dev[tessera.vis[i]] == dev)
			return tessera.vis[i];
	return -1;
}

CUresult tessera_current_gpu(int *gpu)
{
	CUdevice dev;
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	HOOK_REAL(cuCtxGetDevice);
	if ((rc = REAL(cuCtxGetDevice)(&dev)) != CUDA_SUCCESS)
		return rc;
	*gpu = tessera_gpu_of_device(dev);
	return *gpu < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUcontext tessera_current_ctx(void)
{
	CUcontext c = NULL;
	return REAL(cuCtxGetCurrent) != NULL && REAL(cuCtxGetCurrent)(&c) == CUDA_SUCCESS ? c : NULL;
}

CUresult cuInit(unsigned int flags)
{
	HOOK_ENTER();
	HOOK_REAL(cuInit);
	/* A forked child that initialises the driver anew takes its own lease first
	 * (region.c): the descriptors the driver opens now are its own. */
	char err[300];
	if (tessera_region_hold_lease(err, sizeof(err)) < 0) {
		tessera_log(TESSERA_LOG_ERROR, "%s", err);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	CUresult rc = REAL(cuInit)(flags);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = tessera_devices()) != CUDA_SUCCESS)
		return rc;
	if (tessera.nvis == 0)
		return CUDA_ERROR_NO_DEVICE;
	return tessera_mps_check();
}

CUresult cuDeviceGetCount(int *count)
{
	HOOK_ENTER();
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*count = tessera.nvis;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	HOOK_ENTER();
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= tessera.nvis)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = tessera.real_dev[tessera.vis[ordinal]];
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceGetByPCIBusId);
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	CUdevice d;
	if ((rc = REAL(cuDeviceGetByPCIBusId)(&d, pciBusId)) != CUDA_SUCCESS)
		return rc;
	if (tessera_gpu_of_device(d) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = d;
	return CUDA_SUCCESS;
}

/* A device's memory as the container sees it: its limit, or the GPU's if less. */
static CUresult total_mem(size_t *bytes, CUdevice dev)
{
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	int g = tessera_gpu_of_device(dev);
	if (g < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	size_t total;
	if ((rc = REAL(cuDeviceTotalMem_v2)(&total, dev)) != CUDA_SUCCESS)
		return rc;
	*bytes = total < tessera_limit_bytes(g) ? total : (size_t)tessera_limit_bytes(g);
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceTotalMem_v2);
	return total_mem(bytes, dev);
}

/* CUDA 3.1's figure, 32-bit: the same, capped as the driver caps it. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceTotalMem_v2);
	size_t t = 0;
	CUresult rc = total_mem(&t, dev);
	if (rc == CUDA_SUCCESS && bytes != NULL)
		*bytes = tessera_bytes32(t);
	return rc;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVML shows the container the same GPUs as CUDA, in the same order, and the same
 * memory view: total = the limit, used = the container's counted usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "devices.h"
#include "interpose.h"
#include "log.h"
#include "state.h"

#define NVML_ENTER()                                                           \
	do {                                                                   \
		if (tessera_init() != CUDA_SUCCESS)                            \
			return NVML_ERROR_NO_PERMISSION;                       \
	} while (0)

/* Loads libnvidia-ml.so.1 and fills the NVML entries of the real-function table;
 * caller holds nvml_mu. */
static nvmlReturn_t load_library(void)
{
	if (tessera.libnvml != NULL)
		return NVML_SUCCESS;
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		tessera_log(TESSERA_LOG_ERROR, "cannot load libnvidia-ml.so.1: %s", dlerror());
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	}
	tessera_resolve(h, TESSERA_LIB_NVML);
	tessera.libnvml = h;
	return NVML_SUCCESS;
}

/* Loads NVML and maps its devices to the container's; caller holds nvml_mu. */
static nvmlReturn_t map_devices(void)
{
	unsigned int n = 0;
	nvmlReturn_t rc;
	if (tessera.nvml_ready)
		return NVML_SUCCESS;
	if ((rc = load_library()) != NVML_SUCCESS)
		return rc;
	if (REAL(nvmlDeviceGetCount_v2) == NULL || REAL(nvmlDeviceGetHandleByIndex_v2) == NULL ||
	    REAL(nvmlDeviceGetUUID) == NULL)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	if ((rc = REAL(nvmlDeviceGetCount_v2)(&n)) != NVML_SUCCESS)
		return rc;
	memset(tessera.nvml_dev, 0, sizeof(tessera.nvml_dev));
	for (unsigned int i = 0; i < n; i++) {
		nvmlDevice_t d;
		char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
		if (REAL(nvmlDeviceGetHandleByIndex_v2)(i, &d) != NVML_SUCCESS ||
		    REAL(nvmlDeviceGetUUID)(d, uuid, sizeof(uuid)) != NVML_SUCCESS)
			continue; /* a device NVML cannot open is not one the container can use */
		for (int g = 0; g < tessera.limits.ngpus; g++)
			if (tessera.nvml_dev[g] == NULL && tessera_same_uuid(uuid, tessera.limits.gpus[g].uuid))
				tessera.nvml_dev[g] = d;
	}
	tessera.nvml_nvis = 0;
	for (int g = 0; g < tessera.limits.ngpus; g++)
		if (tessera.nvml_dev[g] != NULL)
			tessera.nvml_vis[tessera.nvml_nvis++] = g;
	tessera.nvml_ready = 1;
	return NVML_SUCCESS;
}

static nvmlReturn_t after_init(nvmlReturn_t rc)
{
	if (rc != NVML_SUCCESS)
		return rc;
	pthread_mutex_lock(&tessera.nvml_mu);
	rc = map_devices();
	pthread_mutex_unlock(&tessera.nvml_mu);
	return rc;
}

static nvmlReturn_t load(void)
{
	pthread_mutex_lock(&tessera.nvml_mu);
	nvmlReturn_t rc = load_library();
	pthread_mutex_unlock(&tessera.nvml_mu);
	return rc;
}

#define NVML_REAL(name)                                                        \
	do {                                                                   \
		nvmlReturn_t lrc_ = load();                                    \
		if (lrc_ != NVML_SUCCESS)                                      \
			return lrc_;                                           \
		if (REAL(name) == NULL)                                        \
			return NVML_ERROR_FUNCTION_NOT_FOUND;                  \
	} while (0)

nvmlReturn_t nvmlInit_v2(void)
{
	NVML_ENTER();
	NVML_REAL(nvmlInit_v2);
	return after_init(REAL(nvmlInit_v2)());
}

nvmlReturn_t nvmlInit(void)
{
	NVML_ENTER();
	NVML_REAL(nvmlInit);
	return after_init(REAL(nvmlInit)());
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	NVML_ENTER();
	NVML_REAL(nvmlInitWithFlags);
	return after_init(REAL(nvmlInitWithFlags)(flags));
}

static nvmlReturn_t ready(void)
{
	pthread_mutex_lock(&tessera.nvml_mu);
	nvmlReturn_t rc = tessera.nvml_ready ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
	pthread_mutex_unlock(&tessera.nvml_mu);
	return rc;
}

static int gpu_of_handle(nvmlDevice_t d)
{
	for (int i = 0; i < tessera.nvml_nvis; i++)
		if (tessera.nvml_dev[tessera.nvml_vis[i]] == d)
			return tessera.nvml_vis[i];
	return -1;
}

static nvmlReturn_t get_count(unsigned int *count)
{
	NVML_ENTER();
	nvmlReturn_t rc = ready();
	if (rc != NVML_SUCCESS)
		return rc;
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)tessera.nvml_nvis;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return get_count(count); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return get_count(count); }

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device)
{
	NVML_ENTER();
	nvmlReturn_t rc = ready();
	if (rc != NVML_SUCCESS)
		return rc;
	if (device == NULL || index >= (unsigned int)tessera.nvml_nvis)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = tessera.nvml_dev[tessera.nvml_vis[index]];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) { return by_index(index, device); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) { return by_index(index, device); }

/* Look-ups by UUID or PCI address find only the container's GPUs. */
static nvmlReturn_t only_ours(nvmlReturn_t rc, nvmlDevice_t *device)
{
	if (rc != NVML_SUCCESS)
		return rc;
	if (ready() != NVML_SUCCESS || gpu_of_handle(*device) < 0) {
		*device = NULL;
		return NVML_ERROR_NOT_FOUND;
	}
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	NVML_ENTER();
	NVML_REAL(nvmlDeviceGetHandleByUUID);
	if (device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return only_ours(REAL(nvmlDeviceGetHandleByUUID)(uuid, device), device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
	NVML_ENTER();
	NVML_REAL(nvmlDeviceGetHandleByPciBusId_v2);
	if (device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return only_ours(REAL(nvmlDeviceGetHandleByPciBusId_v2)(pciBusId, device), device);
}

static nvmlReturn_t memory_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
				unsigned long long *freeb)
{
	nvmlReturn_t rc = ready();
	if (rc != NVML_SUCCESS)
		return rc;
	int g = gpu_of_handle(device);
	if (g < 0)
		return NVML_ERROR_NO_PERMISSION;
	uint64_t limit = tessera_limit_bytes(g);
	uint64_t u = tessera_region_used(tessera.region, g);
	*total = limit;
	*used = u < limit ? u : limit;
	*freeb = limit - *used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	NVML_ENTER();
	if (memory == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return memory_view(device, &memory->total, &memory->used, &memory->free);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	NVML_ENTER();
	if (memory == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t rc = memory_view(device, &memory->total, &memory->used, &memory->free);
	if (rc == NVML_SUCCESS)
		memory->reserved = 0;
	return rc;
}

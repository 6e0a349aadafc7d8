/*
 * A fake libnvidia-ml.so.1 with the same devices as the fake libcuda.so.1
 * (FAKE_CUDA_DEVICES, FAKE_CUDA_MEM_MIB), so tests can check that NVML and CUDA show
 * a container the same GPUs. Memory info reports the whole card as free: the hook is
 * what must change that.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera_cuda.h"

#define MAXDEV 8

struct nvmlDevice_st {
	int index;
};

static struct nvmlDevice_st devs[MAXDEV];
static int ndev = 4;
static unsigned long long mem_bytes = 81920ULL << 20;
static int initialized;

static void setup(void)
{
	const char *s = getenv("FAKE_CUDA_DEVICES");
	if (s && atoi(s) > 0 && atoi(s) <= MAXDEV)
		ndev = atoi(s);
	if ((s = getenv("FAKE_CUDA_MEM_MIB")))
		mem_bytes = strtoull(s, NULL, 10) << 20;
	for (int i = 0; i < MAXDEV; i++)
		devs[i].index = i;
	initialized = 1;
}

nvmlReturn_t nvmlInit_v2(void)
{
	setup();
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return nvmlInit_v2();
}
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	*n = (unsigned)ndev;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (i >= (unsigned)ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*d = &devs[i];
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
	if (snprintf(uuid, len, "GPU-fa4e0000-0000-0000-0000-%012x", d->index + 1) >= (int)len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
	char s[96];
	for (int i = 0; i < ndev; i++) {
		nvmlDeviceGetUUID(&devs[i], s, sizeof(s));
		if (strcmp(s, uuid) == 0) {
			*d = &devs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d)
{
	unsigned dom, b, dev, fn;
	if (sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn) != 4 || b < 1 || (int)b > ndev)
		return NVML_ERROR_NOT_FOUND;
	*d = &devs[b - 1];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	(void)d;
	m->total = m->free = mem_bytes;
	m->used = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	(void)d;
	m->total = m->free = mem_bytes;
	m->used = m->reserved = 0;
	return NVML_SUCCESS;
}

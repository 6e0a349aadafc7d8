/* SPDX-License-Identifier: Apache-2.0 */
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

/* ---- what NVIDIA's CDI discovery asks (nvidia-container-toolkit's nvcdi) ---------- *
 * The node agent generates its CDI spec through that discovery; the real-node suite
 * runs it against this library in a fake driver root. Layouts are nvml.h's. */

#define FAKE_NVML_DRIVER_VERSION "580.65.06"

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} fake_nvmlPciInfo_t;

static int valid(nvmlDevice_t d) { return initialized && d >= &devs[0] && d < &devs[ndev]; }

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
	if (snprintf(dst, len, "%s", src) >= (int)len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
	const char *s = getenv("FAKE_NVML_DRIVER_VERSION");
	return copy_str(v, len, s && *s ? s : FAKE_NVML_DRIVER_VERSION);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { return copy_str(v, len, "13." FAKE_NVML_DRIVER_VERSION); }

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
	*v = 13000;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*i = (unsigned)d->index;
	return NVML_SUCCESS;
}

/* /dev/nvidia<minor>: the index, as on most machines. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { return nvmlDeviceGetIndex(d, m); }

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	return copy_str(name, len, "Tessera Fake GPU");
}

static nvmlReturn_t pci_info(nvmlDevice_t d, fake_nvmlPciInfo_t *p)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(p, 0, sizeof(*p));
	p->bus = (unsigned)d->index + 1;
	p->pciDeviceId = 0x233010de;
	snprintf(p->busId, sizeof(p->busId), "00000000:%02X:00.0", p->bus);
	snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "0000:%02X:00.0", p->bus);
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, fake_nvmlPciInfo_t *p) { return pci_info(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, fake_nvmlPciInfo_t *p) { return pci_info(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, fake_nvmlPciInfo_t *p) { return pci_info(d, p); }

/* No MIG: the fake GPUs are whole devices only. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*current = *pending = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*is = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = 9;
	*minor = 0;
	return NVML_SUCCESS;
}

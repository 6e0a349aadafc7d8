/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GPUs the container sees: the limits' GPUs, narrowed by the tenant's
 * CUDA_VISIBLE_DEVICES before the driver loads (visible_devices.c), then matched to
 * the driver's devices and shown through the device hooks (devices.c).
 */
#ifndef TESSERA_DEVICES_H
#define TESSERA_DEVICES_H

#include <stddef.h>

#include "tessera_cuda.h"

/* Sets tessera.view to the container's GPUs this process sees and CUDA_VISIBLE_DEVICES
 * to their UUIDs, so that the driver itself shows only those; before the driver loads. */
void tessera_narrow_visible_devices(void);

/* Resolves the container's devices; needs cuInit to have succeeded. */
CUresult tessera_devices(void);
/* The limits index of a driver CUdevice, or -1 if it is not the container's. */
int tessera_gpu_of_device(CUdevice dev);
/* The limits index of the calling thread's current context's device. */
CUresult tessera_current_gpu(int *gpu);
/* The calling thread's current context; NULL if it cannot be told. */
CUcontext tessera_current_ctx(void);
/* A figure in bytes as CUDA 3.1's 32-bit calls answer it: capped, as the driver caps it. */
static inline unsigned int tessera_bytes32(size_t v)
{
	return v > 0xffffffffu ? 0xffffffffu : (unsigned int)v;
}

/* A UUID without its GPU-/MIG- prefix: CUDA gives MIG instances' as bytes, NVML as text. */
const char *tessera_uuid_body(const char *u);
void tessera_format_uuid(const CUuuid *u, char *out, size_t len);
int tessera_same_uuid(const char *a, const char *b);

#endif

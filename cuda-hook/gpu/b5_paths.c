/* SPDX-License-Identifier: Apache-2.0 */
/*
 * B5 on a real GPU: allocate 64 MiB at a time through one allocation path until the
 * hook refuses, then report how much the process got, how much the driver says was
 * taken (its own cuMemGetInfo, reached around the hook), and what cuMemGetInfo shows
 * through the hook. Built against the real cuda.h; run under the hook.
 *
 *   b5_paths <path> <limit-mib>     path: alloc pitch managed async pool vmm array array3d mipmap
 *                                   graph (a memory node per graph) graphcapture
 *                                   (cuMemAllocAsync captured into a graph)
 *   b5_paths poolcache <limit-mib>  memory cached in a stream-ordered pool stays counted
 *                                   until the pool trims
 *   b5_paths v1alloc <limit-mib>    CUDA 3.1's cuMemAlloc (32-bit pointers), looked up by
 *                                   name: refused under the hook (exit 0 when nothing
 *                                   was taken); without it, what the driver does
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_check.h"

#define MIB (1024ULL * 1024ULL)

/* The driver's own cuMemGetInfo, past the hook: libc's dlsym on libcuda. */
static CUresult driver_meminfo(size_t *f, size_t *t)
{
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	void *(*ds)(void *, const char *) = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.34");
	if (ds == NULL)
		ds = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.2.5");
	CUresult (*fn)(size_t *, size_t *) =
		(CUresult(*)(size_t *, size_t *))ds(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cuMemGetInfo_v2");
	return fn(f, t);
}

/* 60% of the allowance is allocated from the default pool and freed: with a release
 * threshold that keeps it (as PyTorch's cudaMallocAsync backend sets), the pool still
 * holds it after a synchronize, so it must stay counted and an ordinary allocation of
 * the same size be refused, until the pool is trimmed. */
static int poolcache(CUmemoryPool pool)
{
	size_t hf0, hf1, hf2, ht;
	cuuint64_t keep = ~0ULL, reserved;
	CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	CK(cuMemGetInfo(&hf0, &ht));
	size_t big = (hf0 / 10 * 6) & ~(MIB - 1);
	CUdeviceptr p, q;
	CK(cuMemAllocAsync(&p, big, NULL));
	CK(cuMemFreeAsync(p, NULL));
	CK(cuCtxSynchronize());
	CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
	CK(cuMemGetInfo(&hf1, &ht));
	CUresult cached_size = cuMemAlloc(&q, big);
	CK(cuMemPoolTrimTo(pool, 0));
	CK(cuMemGetInfo(&hf2, &ht));
	CUresult after_trim = cuMemAlloc(&q, big);
	printf("path=poolcache chunk_mib=%llu pool_reserved_mib=%llu hook_free_mib before=%llu cached=%llu trimmed=%llu "
	       "alloc_while_cached=%d alloc_after_trim=%d\n",
	       (unsigned long long)(big / MIB), (unsigned long long)(reserved / MIB), (unsigned long long)(hf0 / MIB),
	       (unsigned long long)(hf1 / MIB), (unsigned long long)(hf2 / MIB), (int)cached_size, (int)after_trim);
	int ok = reserved >= big && hf1 + big <= hf0 && cached_size == CUDA_ERROR_OUT_OF_MEMORY && hf2 == hf0 &&
		 after_trim == CUDA_SUCCESS;
	return ok ? 0 : 1;
}

/* One graph that allocates chunk on dev and keeps it (no free node), instantiated and
 * launched: each takes new memory from the graph pool. */
static CUresult graph_alloc(CUdevice dev, size_t chunk, CUstream s, int capture)
{
	CUgraph g;
	CUgraphExec e;
	CUresult rc;
	if (capture) {
		CUdeviceptr p;
		CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
		rc = cuMemAllocAsync(&p, chunk, s);
		CK(cuStreamEndCapture(s, &g));
		if (rc != CUDA_SUCCESS)
			return rc;
	} else {
		CUDA_MEM_ALLOC_NODE_PARAMS p;
		CUgraphNode n;
		memset(&p, 0, sizeof(p));
		p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.poolProps.location.id = dev;
		p.bytesize = chunk;
		CK(cuGraphCreate(&g, 0));
		CK(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
	}
	CK(cuGraphInstantiate(&e, g, 0));
	rc = cuGraphLaunch(e, s);
	if (rc == CUDA_SUCCESS)
		rc = cuStreamSynchronize(s);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: b5_paths <path> <limit-mib>\n");
		return 2;
	}
	const char *path = argv[1];
	unsigned long long limit = strtoull(argv[2], NULL, 10);
	CUdevice dev;
	CUcontext ctx;
	CUmemoryPool pool;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuDeviceGetDefaultMemPool(&pool, dev));
	if (strcmp(path, "poolcache") == 0)
		return poolcache(pool);
	size_t f0, t0, f1, t1, hf, ht;
	CK(driver_meminfo(&f0, &t0));
	size_t chunk = 64 * MIB;
	int n = 0;
	CUresult rc;
	for (;;) {
		if (strcmp(path, "alloc") == 0) {
			CUdeviceptr p;
			rc = cuMemAlloc(&p, chunk);
		} else if (strcmp(path, "pitch") == 0) {
			CUdeviceptr p;
			size_t pitch;
			rc = cuMemAllocPitch(&p, &pitch, 8192, chunk / 8192, 16);
		} else if (strcmp(path, "managed") == 0) {
			CUdeviceptr p;
			rc = cuMemAllocManaged(&p, chunk, CU_MEM_ATTACH_GLOBAL);
			if (rc == CUDA_SUCCESS)
				rc = cuMemsetD8(p, 1, chunk); /* make it resident on the GPU */
		} else if (strcmp(path, "async") == 0) {
			CUdeviceptr p;
			rc = cuMemAllocAsync(&p, chunk, NULL);
		} else if (strcmp(path, "pool") == 0) {
			CUdeviceptr p;
			rc = cuMemAllocFromPoolAsync(&p, chunk, pool, NULL);
		} else if (strcmp(path, "vmm") == 0) {
			CUmemAllocationProp prop;
			CUmemGenericAllocationHandle h;
			memset(&prop, 0, sizeof(prop));
			prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
			prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			prop.location.id = dev;
			rc = cuMemCreate(&h, chunk, &prop, 0);
		} else if (strcmp(path, "array") == 0) {
			CUDA_ARRAY_DESCRIPTOR d = {.Width = 4096, .Height = 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
			CUarray a;
			rc = cuArrayCreate(&a, &d);
		} else if (strcmp(path, "array3d") == 0) {
			CUDA_ARRAY3D_DESCRIPTOR d = {
				.Width = 1024, .Height = 1024, .Depth = 16, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
			CUarray a;
			rc = cuArray3DCreate(&a, &d);
		} else if (strcmp(path, "mipmap") == 0) {
			CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 4096, .Height = 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
			CUmipmappedArray a;
			rc = cuMipmappedArrayCreate(&a, &d, 4);
		} else if (strcmp(path, "v1alloc") == 0) {
			CUresult (*alloc1)(unsigned int *, unsigned int) =
				(CUresult(*)(unsigned int *, unsigned int))dlsym(RTLD_DEFAULT, "cuMemAlloc");
			unsigned int p1 = 0;
			rc = alloc1 != NULL ? alloc1(&p1, (unsigned int)chunk) : CUDA_ERROR_NOT_FOUND;
		} else if (strcmp(path, "graph") == 0 || strcmp(path, "graphcapture") == 0) {
			static CUstream s;
			if (s == NULL)
				CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
			rc = graph_alloc(dev, chunk, s, strcmp(path, "graphcapture") == 0);
		} else {
			fprintf(stderr, "unknown path %s\n", path);
			return 2;
		}
		if (rc != CUDA_SUCCESS)
			break;
		if (++n > 100000)
			break;
	}
	CK(cuCtxSynchronize());
	CK(driver_meminfo(&f1, &t1));
	CK(cuMemGetInfo(&hf, &ht));
	unsigned long long taken = (unsigned long long)((f0 - f1) / MIB);
	printf("path=%s limit_mib=%llu allocations=%d result=%d driver_taken_mib=%llu hook_total_mib=%llu hook_free_mib=%llu\n",
	       path, limit, n, (int)rc, taken, (unsigned long long)(ht / MIB), (unsigned long long)(hf / MIB));
	if (strcmp(path, "v1alloc") == 0)
		return n == 0 && taken < 64 ? 0 : 1;
	return rc == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
}

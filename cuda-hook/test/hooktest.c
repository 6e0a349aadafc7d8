/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test program for the hook against the fake driver. test/run.sh writes the limits
 * and starts it with the hook preloaded; each scenario checks what it expects and
 * exits non-zero with a message when something is off.
 *
 *   hooktest alloc <path> <chunk-mib> <limit-mib> <context-mib>
 *   hooktest meminfo <limit-mib> <context-mib>
 *   hooktest poolcache <limit-mib> <context-mib>
 *   hooktest graphmem <limit-mib> <context-mib>
 *   hooktest devices
 *   hooktest visible <uuid-suffixes|none>
 *   hooktest procaddr
 *   hooktest lookup <route> <limit-mib>
 *   hooktest try <mib> ok|oom
 *   hooktest hold <mib> <ready-file>
 *   hooktest damaged <ready-file> <go-file>
 *   hooktest damaged-new
 *   hooktest contexts <create|green> <limit-mib> <context-mib> <chunk-mib>
 *   hooktest modules <module|library> <limit-mib> <module-mib>
 *   hooktest devlimits <limit-mib>
 *   hooktest fork <limit-mib> <context-mib>
 *   hooktest orphan <generations> <mib> <limit-mib>
 *   hooktest threads <n> <limit-mib> [<procs>]
 *   hooktest refused <cuda-error>
 *   hooktest total-is <mib>
 *   hooktest pace <path> <cores> <seconds> [<least share>]
 *   hooktest pace-procs <procs> <cores> <seconds>
 *   hooktest light <cores> <seconds>
 *   hooktest pace-turns <cores> <seconds>
 *   hooktest pace-share <cores> <seconds>
 *   hooktest pace-pause <cores> <pause-seconds> <seconds>
 *   hooktest turn-hog <turn-file> <seconds> [<ahead-seconds>]
 *   hooktest capture
 *   hooktest mps <percent> <pipe> <pinned> <granted> | mps refused
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "elf_lookup.h"
#include "fake_mps.h"
#include "fake_stats.h"
#include "tessera_cuda.h"
#include "turns.h"

/* The driver and NVML functions this program calls by name (linked against the fake
 * libcuda.so.1 and libnvidia-ml.so.1; with the hook preloaded, the hooked ones resolve
 * to the hook). */
CUresult cuInit(unsigned int);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDeviceGetByPCIBusId(CUdevice *, const char *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v4(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
CUresult cuCtxCreate_v3(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
CUresult cuCtxGetExecAffinity(CUexecAffinityParam *, CUexecAffinityType);
CUresult cuDeviceGetAttribute(int *, CUdevice_attribute, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
CUresult cuGreenCtxDestroy(CUgreenCtx);
CUresult cuCtxSetLimit(CUlimit, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuLibraryLoadData(CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *, void **,
			   unsigned int);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuCtxSynchronize(void);
CUresult cuStreamQuery(CUstream);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventQuery(CUevent);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				   CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuLaunchGrid(CUfunction, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *, unsigned int, unsigned int);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

#define MIB (1024ULL * 1024ULL)

static const char *scenario = "?";

#define CHECK(cond, ...)                                                         \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "FAIL %s (%s:%d): ", scenario, __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                            \
			fprintf(stderr, "\n");                                   \
			exit(1);                                                 \
		}                                                                \
	} while (0)
#define OK(call) CHECK((call) == CUDA_SUCCESS, "%s failed", #call)

static void *libcuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	CHECK(h != NULL, "libcuda.so.1 is not loaded");
	return h;
}

static struct fake_cuda_stats stats(void)
{
	struct fake_cuda_stats s;
	fake_cuda_stats_fn f = (fake_cuda_stats_fn)dlsym(libcuda(), "fake_cuda_stats");
	CHECK(f != NULL, "fake_cuda_stats not found: not running against the fake driver?");
	f(&s);
	return s;
}

/* cuInit, then a context on the container's device 0; returns the driver's device. */
static CUdevice setup(void)
{
	CUdevice d;
	CUcontext c;
	OK(cuInit(0));
	OK(cuDeviceGet(&d, 0));
	OK(cuDevicePrimaryCtxRetain(&c, d));
	OK(cuCtxSetCurrent(c));
	return d;
}

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

/* What runtimes do: dlopen the driver, dlsym cuGetProcAddress, ask it for the rest. */
static void *procaddr(const char *name, cuuint64_t flags)
{
	gpa_fn gpa = (gpa_fn)dlsym(libcuda(), "cuGetProcAddress_v2");
	void *p = NULL;
	CHECK(gpa != NULL, "no cuGetProcAddress_v2");
	CHECK(gpa(name, &p, 13000, flags, NULL) == CUDA_SUCCESS && p != NULL, "cuGetProcAddress_v2(%s) failed", name);
	return p;
}

/* ---- alloc: every allocation path stops at the limit --------------------------- */

struct path {
	const char *name;
	CUresult (*alloc)(uint64_t bytes, uint64_t *key);
	CUresult (*release)(uint64_t key);
};

static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*p_free_async)(CUdeviceptr, CUstream);

static CUresult a_direct(uint64_t n, uint64_t *k) { return cuMemAlloc_v2((CUdeviceptr *)k, n); }
static CUresult f_direct(uint64_t k) { return cuMemFree_v2(k); }
static CUresult a_ptr(uint64_t n, uint64_t *k) { return p_alloc((CUdeviceptr *)k, n); }
static CUresult f_ptr(uint64_t k) { return p_free(k); }
static CUresult a_pitch(uint64_t n, uint64_t *k)
{
	size_t pitch;
	return cuMemAllocPitch_v2((CUdeviceptr *)k, &pitch, 1000, n / 1000, 4);
}
static CUresult a_managed(uint64_t n, uint64_t *k) { return cuMemAllocManaged((CUdeviceptr *)k, n, 1); }
static CUresult a_async(uint64_t n, uint64_t *k) { return cuMemAllocAsync((CUdeviceptr *)k, n, NULL); }
static CUresult f_async(uint64_t k) { return cuMemFreeAsync(k, NULL); }
static CUresult a_async_p(uint64_t n, uint64_t *k) { return p_async((CUdeviceptr *)k, n, NULL); }
static CUresult f_async_p(uint64_t k) { return p_free_async(k, NULL); }
static CUresult a_pool(uint64_t n, uint64_t *k)
{
	CUmemoryPool pool;
	CUdevice d;
	OK(cuDeviceGet(&d, 0));
	OK(cuDeviceGetMemPool(&pool, d));
	return cuMemAllocFromPoolAsync((CUdeviceptr *)k, n, pool, NULL);
}
static CUresult a_vmm(uint64_t n, uint64_t *k)
{
	CUmemAllocationProp prop;
	CUdevice d;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	OK(cuDeviceGet(&d, 0));
	prop.location.id = d;
	return cuMemCreate((CUmemGenericAllocationHandle *)k, n, &prop, 0);
}
static CUresult f_vmm(uint64_t k) { return cuMemRelease(k); }
static CUresult a_array(uint64_t n, uint64_t *k)
{
	CUDA_ARRAY_DESCRIPTOR d = {.Width = n / 4 / 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
	return cuArrayCreate_v2((CUarray *)k, &d);
}
static CUresult a_array3d(uint64_t n, uint64_t *k)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {
		.Width = n / 4096, .Height = 256, .Depth = 4, .Format = CU_AD_FORMAT_HALF, .NumChannels = 2};
	return cuArray3DCreate_v2((CUarray *)k, &d);
}
static CUresult f_array(uint64_t k) { return cuArrayDestroy((CUarray)(uintptr_t)k); }
static CUresult a_mipmap(uint64_t n, uint64_t *k)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {.Width = n / 1024, .Height = 1024, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
	return cuMipmappedArrayCreate((CUmipmappedArray *)k, &d, 4);
}
static CUresult f_mipmap(uint64_t k) { return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)k); }

static const struct path paths[] = {
	{"direct", a_direct, f_direct},     {"dlsym", a_ptr, f_ptr},           {"procaddr", a_ptr, f_ptr},
	{"procaddr-v1", a_ptr, f_ptr},      {"pitch", a_pitch, f_direct},      {"managed", a_managed, f_direct},
	{"async", a_async, f_async},        {"async-ptsz", a_async_p, f_async_p}, {"pool", a_pool, f_async},
	{"vmm", a_vmm, f_vmm},              {"array", a_array, f_array},       {"array3d", a_array3d, f_array},
	{"mipmap", a_mipmap, f_mipmap},
};

static void resolve(const char *path)
{
	if (strcmp(path, "dlsym") == 0) {
		p_alloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(libcuda(), "cuMemAlloc_v2");
		p_free = (CUresult(*)(CUdeviceptr))dlsym(libcuda(), "cuMemFree_v2");
	} else if (strcmp(path, "procaddr") == 0) {
		p_alloc = (CUresult(*)(CUdeviceptr *, size_t))procaddr("cuMemAlloc", 0);
		p_free = (CUresult(*)(CUdeviceptr))procaddr("cuMemFree", 0);
	} else if (strcmp(path, "procaddr-v1") == 0) {
		gpa1_fn gpa = (gpa1_fn)dlsym(libcuda(), "cuGetProcAddress");
		CHECK(gpa != NULL, "no cuGetProcAddress");
		OK(gpa("cuMemAlloc", (void **)&p_alloc, 12000, 0));
		OK(gpa("cuMemFree", (void **)&p_free, 12000, 0));
	} else if (strcmp(path, "async-ptsz") == 0) {
		p_async = (CUresult(*)(CUdeviceptr *, size_t, CUstream))procaddr(
			"cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
		p_free_async = (CUresult(*)(CUdeviceptr, CUstream))procaddr("cuMemFreeAsync",
									    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	}
}

static int alloc_main(int argc, char **argv)
{
	CHECK(argc == 6, "usage: alloc <path> <chunk-mib> <limit-mib> <context-mib>");
	const struct path *p = NULL;
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (strcmp(paths[i].name, argv[2]) == 0)
			p = &paths[i];
	CHECK(p != NULL, "unknown path %s", argv[2]);
	uint64_t chunk = strtoull(argv[3], NULL, 10) * MIB, limit = strtoull(argv[4], NULL, 10) * MIB;
	uint64_t ctx = strtoull(argv[5], NULL, 10) * MIB;
	CUdevice d = setup();
	resolve(p->name);
	uint64_t keys[4096];
	int n = 0;
	CUresult rc;
	while ((rc = p->alloc(chunk, &keys[n])) == CUDA_SUCCESS)
		CHECK(++n < 4096, "no limit reached after %d allocations", n);
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "allocation %d ended with %d, want CUDA_ERROR_OUT_OF_MEMORY", n, rc);
	struct fake_cuda_stats s = stats();
	uint64_t held = s.used[d];
	/* Within the limit (less the context charge), and within one chunk (plus the
	 * padding the fake adds to arrays) of it. */
	CHECK(held + ctx <= limit, "holds %llu MiB + %llu MiB context, limit %llu MiB", (unsigned long long)(held / MIB),
	      (unsigned long long)(ctx / MIB), (unsigned long long)(limit / MIB));
	CHECK(held + ctx + chunk + chunk / 2 + (1ULL << 17) > limit, "stopped at %llu MiB, more than a chunk below %llu MiB",
	      (unsigned long long)(held / MIB), (unsigned long long)(limit / MIB));
	CHECK(s.peak[d] + ctx <= limit, "peak %llu MiB over the limit", (unsigned long long)(s.peak[d] / MIB));
	size_t fr, tot;
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(tot == limit, "cuMemGetInfo total %zu, want %llu", tot, (unsigned long long)limit);
	CHECK(fr == limit - ctx - held, "cuMemGetInfo free %zu, want %llu", fr, (unsigned long long)(limit - ctx - held));
	for (int i = 0; i < n; i++)
		OK(p->release(keys[i]));
	/* Memory freed into a stream-ordered pool stays there, and counted, until the pool
	 * trims: the fake's pools (release threshold 0) trim at a synchronize. */
	OK(cuCtxSynchronize());
	s = stats();
	CHECK(s.used[d] == 0, "%llu bytes still held after freeing all", (unsigned long long)s.used[d]);
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(fr == limit - ctx, "after freeing all, free is %zu, want %llu", fr, (unsigned long long)(limit - ctx));
	/* And the whole allowance can be had again. */
	int m = 0;
	while (p->alloc(chunk, &keys[m]) == CUDA_SUCCESS)
		m++;
	CHECK(m == n, "second round got %d allocations, first %d", m, n);
	printf("ok alloc %s: %d x %s MiB, held %llu MiB of %llu\n", p->name, n, argv[3], (unsigned long long)(held / MIB),
	       (unsigned long long)(limit / MIB));
	return 0;
}

/* ---- meminfo: CUDA and NVML report the limit ----------------------------------- */

static int meminfo_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: meminfo <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctx = strtoull(argv[3], NULL, 10) * MIB;
	CUdevice d = setup();
	size_t fr, tot, dt;
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(tot == limit && fr == limit - ctx, "cuMemGetInfo %zu/%zu, want %llu/%llu", fr, tot,
	      (unsigned long long)(limit - ctx), (unsigned long long)limit);
	OK(cuDeviceTotalMem_v2(&dt, d));
	CHECK(dt == limit, "cuDeviceTotalMem %zu, want %llu", dt, (unsigned long long)limit);
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 100 * MIB));
	CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
	nvmlDevice_t h;
	nvmlMemory_t m;
	nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
	CHECK(nvmlDeviceGetHandleByIndex_v2(0, &h) == NVML_SUCCESS, "nvml handle 0");
	CHECK(nvmlDeviceGetMemoryInfo(h, &m) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo");
	CHECK(m.total == limit && m.used == ctx + 100 * MIB && m.free == limit - ctx - 100 * MIB,
	      "NVML memory %llu/%llu/%llu", m.total, m.used, m.free);
	CHECK(nvmlDeviceGetMemoryInfo_v2(h, &m2) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo_v2");
	CHECK(m2.total == limit && m2.used == ctx + 100 * MIB, "NVML v2 memory %llu/%llu", m2.total, m2.used);
	/* Through dlsym, as NVML bindings (pynvml, go-nvml) resolve it. */
	void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	nvmlReturn_t (*getmem)(nvmlDevice_t, nvmlMemory_t *) =
		(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(nv, "nvmlDeviceGetMemoryInfo");
	CHECK(getmem != NULL && getmem(h, &m) == NVML_SUCCESS && m.total == limit, "NVML through dlsym: total %llu",
	      m.total);
	printf("ok meminfo\n");
	return 0;
}

/* ---- poolcache: memory cached in a stream-ordered pool stays counted ------------ */

static int poolcache_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: poolcache <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctx = strtoull(argv[3], NULL, 10) * MIB;
	uint64_t big = (limit - ctx) * 6 / 10;
	CUdevice d = setup();
	CUmemoryPool pool;
	OK(cuDeviceGetMemPool(&pool, d));
	CUdeviceptr a, b;
	size_t fr, tot;
	OK(cuMemAllocAsync(&a, big, NULL));
	OK(cuMemFreeAsync(a, NULL));
	/* Freed, but still reserved by the pool on the GPU. */
	CHECK(stats().used[d] == big, "the fake's pool does not hold the freed memory");
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(fr == limit - ctx - big, "free %zu MiB with %llu MiB cached in the pool, want %llu", fr / (size_t)MIB,
	      (unsigned long long)(big / MIB), (unsigned long long)((limit - ctx - big) / MIB));
	CHECK(cuMemAlloc_v2(&b, big) == CUDA_ERROR_OUT_OF_MEMORY, "allocated past memory cached in a pool");
	/* The pool's next allocations reuse what it holds, without counting it twice. */
	OK(cuMemAllocAsync(&a, big / 2, NULL));
	OK(cuMemAllocFromPoolAsync(&b, big / 2, pool, NULL));
	CHECK(stats().used[d] == big, "the pool grew");
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(fr == limit - ctx - big, "free %zu MiB after reuse, want %llu", fr / (size_t)MIB,
	      (unsigned long long)((limit - ctx - big) / MIB));
	OK(cuMemFreeAsync(a, NULL));
	OK(cuMemFreeAsync(b, NULL));
	/* Trimming gives it back. */
	OK(cuMemPoolTrimTo(pool, 0));
	CHECK(stats().used[d] == 0, "the trim kept memory");
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(fr == limit - ctx, "free %zu MiB after the trim, want %llu", fr / (size_t)MIB,
	      (unsigned long long)((limit - ctx) / MIB));
	/* So does a synchronize (release threshold 0), seen when an allocation would
	 * otherwise be refused. */
	OK(cuMemAllocAsync(&a, big, NULL));
	OK(cuMemFreeAsync(a, NULL));
	OK(cuCtxSynchronize());
	OK(cuMemAlloc_v2(&b, big));
	OK(cuMemFree_v2(b));
	printf("ok poolcache: %llu MiB cached in the pool stayed counted until trimmed\n", (unsigned long long)(big / MIB));
	return 0;
}

/* ---- graphmem: CUDA-graph memory nodes count when the graph is launched ----------- */

CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuDeviceGraphMemTrim(CUdevice);

/* A graph that allocates bytes on d and frees them again; nested inside a child graph
 * when child is set. */
static CUgraph alloc_graph(CUdevice d, uint64_t bytes, int child)
{
	CUgraph g;
	CUgraphNode a, f;
	CUDA_MEM_ALLOC_NODE_PARAMS p;
	memset(&p, 0, sizeof(p));
	p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.poolProps.location.id = d;
	p.bytesize = bytes;
	OK(cuGraphCreate(&g, 0));
	OK(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p));
	OK(cuGraphAddMemFreeNode(&f, g, &a, 1, p.dptr));
	if (!child)
		return g;
	CUgraph outer;
	OK(cuGraphCreate(&outer, 0));
	OK(cuGraphAddChildGraphNode(&a, outer, NULL, 0, g));
	return outer;
}

static uint64_t free_now(void)
{
	size_t fr, tot;
	OK(cuMemGetInfo_v2(&fr, &tot));
	return fr;
}

static int graphmem_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: graphmem <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctx = strtoull(argv[3], NULL, 10) * MIB;
	uint64_t room = limit - ctx, chunk = 256 * MIB;
	CUdevice d = setup();
	CUgraphExec a, b, c;
	CUdeviceptr p;
	/* Instantiating maps nothing; the launch does, and it counts. */
	OK(cuGraphInstantiateWithFlags(&a, alloc_graph(d, chunk, 0), 0));
	CHECK(stats().used[d] == 0 && free_now() == room, "instantiation took memory");
	OK(cuGraphLaunch(a, NULL));
	CHECK(stats().used[d] == chunk, "the fake did not map the graph's memory");
	CHECK(free_now() == room - chunk, "free %llu MiB after the launch, want %llu",
	      (unsigned long long)(free_now() / MIB), (unsigned long long)((room - chunk) / MIB));
	/* Fill the container up to half a chunk below its limit. */
	OK(cuMemAlloc_v2(&p, room - chunk - chunk / 2));
	/* Relaunching the graph takes nothing new and is not refused. */
	OK(cuGraphLaunch(a, NULL));
	OK(cuGraphLaunch(a, NULL));
	/* A second graph's chunk does not fit: refused before the driver maps it. */
	OK(cuGraphInstantiateWithFlags(&b, alloc_graph(d, chunk, 1), 0));
	CHECK(cuGraphLaunch(b, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "a graph launched past the limit");
	CHECK(cuGraphUpload(b, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "a graph uploaded past the limit");
	CUDA_GRAPH_INSTANTIATE_PARAMS ip;
	memset(&ip, 0, sizeof(ip));
	ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
	CHECK(cuGraphInstantiateWithParams(&c, alloc_graph(d, chunk, 0), &ip) == CUDA_ERROR_OUT_OF_MEMORY,
	      "a graph instantiated with upload past the limit");
	CHECK(stats().peak[d] <= room, "the driver held %llu MiB, limit %llu",
	      (unsigned long long)(stats().peak[d] / MIB), (unsigned long long)(room / MIB));
	/* A trim gives the idle graph's memory back; then the second graph fits, and the
	 * first no longer does. */
	OK(cuDeviceGraphMemTrim(d));
	CHECK(free_now() == chunk / 2 + chunk, "free %llu MiB after the trim, want %llu",
	      (unsigned long long)(free_now() / MIB), (unsigned long long)((chunk / 2 + chunk) / MIB));
	OK(cuGraphLaunch(b, NULL));
	CHECK(cuGraphLaunch(a, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "the first graph launched again past the limit");
	OK(cuGraphLaunch(b, NULL));
	/* Captured stream-ordered allocations are graph memory too: nothing counts at
	 * capture, the launch does. */
	OK(cuMemFree_v2(p));
	OK(cuGraphExecDestroy(a));
	OK(cuGraphExecDestroy(b));
	OK(cuDeviceGraphMemTrim(d));
	CHECK(free_now() == room && stats().used[d] == 0, "memory left after destroying the graphs and a trim");
	CUgraph g;
	CUdeviceptr q;
	OK(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
	OK(cuMemAllocAsync(&q, chunk, NULL));
	OK(cuMemFreeAsync(q, NULL));
	OK(cuStreamEndCapture(NULL, &g));
	CHECK(free_now() == room, "a captured allocation counted at capture");
	OK(cuGraphInstantiateWithFlags(&c, g, 0));
	OK(cuMemAlloc_v2(&p, room - chunk / 2));
	CHECK(cuGraphLaunch(c, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "a captured graph launched past the limit");
	OK(cuMemFree_v2(p));
	OK(cuGraphLaunch(c, NULL));
	CHECK(free_now() == room - chunk, "free %llu MiB after the captured graph ran, want %llu",
	      (unsigned long long)(free_now() / MIB), (unsigned long long)((room - chunk) / MIB));
	CHECK(cuMemAlloc_v2(&p, room - chunk / 2) == CUDA_ERROR_OUT_OF_MEMORY, "allocated past graph memory");
	/* Uploading at instantiation maps and counts too. */
	OK(cuGraphInstantiateWithParams(&a, alloc_graph(d, chunk, 0), &ip));
	CHECK(free_now() == room - 2 * chunk, "free %llu MiB after an instantiate-with-upload, want %llu",
	      (unsigned long long)(free_now() / MIB), (unsigned long long)((room - 2 * chunk) / MIB));
	CHECK(stats().peak[d] <= room, "the driver held %llu MiB, limit %llu",
	      (unsigned long long)(stats().peak[d] / MIB), (unsigned long long)(room / MIB));
	printf("ok graphmem: graph memory counted at launch and upload, refused past the limit, given back at a trim\n");
	return 0;
}

/* ---- devices: only the container's, in its order -------------------------------- */

static void uuid_of(CUdevice d, char *out)
{
	CUuuid u;
	OK(cuDeviceGetUuid_v2(&u, d));
	sprintf(out, "%02x", (unsigned char)u.bytes[15]);
}

static int devices_main(void)
{
	/* run.sh assigns fake GPUs ...03 then ...01: the driver's devices 2 and 0. */
	int n;
	CUdevice d;
	char u[8];
	OK(cuInit(0));
	OK(cuDeviceGetCount(&n));
	CHECK(n == 2, "cuDeviceGetCount %d, want 2", n);
	OK(cuDeviceGet(&d, 0));
	uuid_of(d, u);
	CHECK(strcmp(u, "03") == 0, "device 0 is ...%s, want ...03", u);
	OK(cuDeviceGet(&d, 1));
	uuid_of(d, u);
	CHECK(strcmp(u, "01") == 0, "device 1 is ...%s, want ...01", u);
	CHECK(cuDeviceGet(&d, 2) == CUDA_ERROR_INVALID_DEVICE, "device 2 exists");
	CHECK(cuDeviceGetByPCIBusId(&d, "0000:02:00.0") != CUDA_SUCCESS, "found an unassigned GPU by PCI id");
	CUcontext c;
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	CHECK(vis != NULL && strcmp(vis, "GPU-fa4e0000-0000-0000-0000-000000000003,GPU-fa4e0000-0000-0000-0000-000000000001") == 0,
	      "CUDA_VISIBLE_DEVICES=%s, want the container's UUIDs in its order", vis ? vis : "(unset)");
	OK(cuDeviceGetByPCIBusId(&d, "0000:03:00.0"));
	if (getenv("FAKE_CUDA_IGNORE_VISIBLE") != NULL) {
		/* A driver that shows every GPU: the hook alone hides the others. */
		CHECK(d == 2, "PCI 03 is device %d, want the driver's 2", d);
		CHECK(cuDevicePrimaryCtxRetain(&c, 1) == CUDA_ERROR_INVALID_DEVICE, "made a context on an unassigned GPU");
	} else {
		/* The driver shows only the container's GPUs, renumbered in its order. */
		CHECK(d == 0, "PCI 03 is device %d, want 0", d);
		CHECK(cuDevicePrimaryCtxRetain(&c, 2) != CUDA_SUCCESS, "made a context on a third GPU");
	}
	unsigned int nn;
	nvmlDevice_t h;
	char s[96];
	CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
	CHECK(nvmlDeviceGetCount_v2(&nn) == NVML_SUCCESS && nn == 2, "NVML count %u, want 2", nn);
	CHECK(nvmlDeviceGetHandleByIndex_v2(0, &h) == NVML_SUCCESS, "NVML handle 0");
	nvmlDeviceGetUUID(h, s, sizeof(s));
	CHECK(strcmp(s, "GPU-fa4e0000-0000-0000-0000-000000000003") == 0, "NVML device 0 is %s", s);
	CHECK(nvmlDeviceGetHandleByIndex_v2(1, &h) == NVML_SUCCESS, "NVML handle 1");
	nvmlDeviceGetUUID(h, s, sizeof(s));
	CHECK(strcmp(s, "GPU-fa4e0000-0000-0000-0000-000000000001") == 0, "NVML device 1 is %s", s);
	CHECK(nvmlDeviceGetHandleByIndex_v2(2, &h) != NVML_SUCCESS, "NVML device 2 exists");
	CHECK(nvmlDeviceGetHandleByUUID("GPU-fa4e0000-0000-0000-0000-000000000002", &h) == NVML_ERROR_NOT_FOUND,
	      "NVML found an unassigned GPU by UUID");
	CHECK(nvmlDeviceGetHandleByPciBusId_v2("0000:01:00.0", &h) == NVML_SUCCESS, "NVML did not find PCI 01");
	printf("ok devices\n");
	return 0;
}

/* ---- visible: the tenant's CUDA_VISIBLE_DEVICES narrows the container's view ---- */

/* want: the UUID suffixes (last byte, hex) the process must see, in order, comma
 * separated; "none" when it must see no GPU. */
static int visible_main(const char *want)
{
	if (strcmp(want, "none") == 0) {
		CUresult rc = cuInit(0);
		CHECK(rc == CUDA_ERROR_NO_DEVICE, "cuInit = %d, want CUDA_ERROR_NO_DEVICE", rc);
		printf("ok visible none\n");
		return 0;
	}
	int n, i = 0;
	OK(cuInit(0));
	OK(cuDeviceGetCount(&n));
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", want);
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save), i++) {
		CUdevice d;
		char u[8];
		CHECK(i < n, "%d devices, want %s", n, want);
		OK(cuDeviceGet(&d, i));
		uuid_of(d, u);
		CHECK(strcmp(u, t) == 0, "device %d is ...%s, want ...%s", i, u, t);
	}
	CHECK(i == n, "%d devices, want %s", n, want);
	printf("ok visible %s\n", want);
	return 0;
}

/* ---- procaddr: every resolution path gives the hook ----------------------------- */

/* The driver's own function: read from its symbol table, as the dynamic linker would,
 * since every lookup by name answers the hook (a process going around the hook can
 * do this too; docs/cuda-hook.md, "What the hook cannot see"). */
static void *driver_sym(const char *name)
{
	return tessera_elf_lookup((const struct link_map *)libcuda(), name);
}

static int procaddr_main(void)
{
	static const char *const hooked[][2] = {
		{"cuInit", "cuInit"},
		{"cuDeviceGet", "cuDeviceGet"},
		{"cuDeviceGetCount", "cuDeviceGetCount"},
		{"cuDeviceTotalMem", "cuDeviceTotalMem_v2"},
		{"cuMemGetInfo", "cuMemGetInfo_v2"},
		{"cuMemAlloc", "cuMemAlloc_v2"},
		{"cuMemFree", "cuMemFree_v2"},
		{"cuMemAllocPitch", "cuMemAllocPitch_v2"},
		{"cuMemAllocManaged", "cuMemAllocManaged"},
		{"cuMemCreate", "cuMemCreate"},
		{"cuArrayCreate", "cuArrayCreate_v2"},
		{"cuLaunchKernel", "cuLaunchKernel"},
		{"cuLaunchKernelEx", "cuLaunchKernelEx"},
		{"cuGraphLaunch", "cuGraphLaunch"},
		{"cuGraphInstantiate", "cuGraphInstantiate_v2"}, /* what the CUDA 13 driver answers */
		{"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"},
		{"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams"},
		{"cuGraphUpload", "cuGraphUpload"},
		{"cuGraphExecDestroy", "cuGraphExecDestroy"},
		{"cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim"},
		{"cuGetProcAddress", "cuGetProcAddress_v2"},
		{"cuCtxCreate", "cuCtxCreate_v4"},
	};
	static const char *const ptsz[][2] = {
		{"cuLaunchKernel", "cuLaunchKernel_ptsz"},
		{"cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
		{"cuGraphLaunch", "cuGraphLaunch_ptsz"},
		{"cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
		{"cuGraphUpload", "cuGraphUpload_ptsz"},
		{"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"},
		{"cuStreamBeginCapture", "cuStreamBeginCapture_v2_ptsz"},
	};
	OK(cuInit(0));
	for (size_t i = 0; i < sizeof(hooked) / sizeof(hooked[0]); i++) {
		void *hook = dlsym(RTLD_DEFAULT, hooked[i][1]); /* the preloaded hook comes first */
		void *real = driver_sym(hooked[i][1]);
		CHECK(hook != NULL && hook != real, "%s: the hook does not export it", hooked[i][1]);
		CHECK(procaddr(hooked[i][0], 0) == hook, "cuGetProcAddress(%s) is not the hook", hooked[i][0]);
		CHECK(dlsym(libcuda(), hooked[i][1]) == hook, "dlsym(libcuda, %s) is not the hook", hooked[i][1]);
	}
	/* The first driver API's launches and the deprecated multi-device one: exported by
	 * drivers for old binaries; whether cuGetProcAddress answers for them is the
	 * driver's choice, and where it does it must answer with the hook. */
	static const char *const first_api[] = {"cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync",
						"cuLaunchCooperativeKernelMultiDevice"};
	for (size_t i = 0; i < sizeof(first_api) / sizeof(first_api[0]); i++) {
		void *hook = dlsym(RTLD_DEFAULT, first_api[i]);
		CHECK(hook != NULL && hook != driver_sym(first_api[i]), "%s: the hook does not export it", first_api[i]);
		CHECK(dlsym(libcuda(), first_api[i]) == hook, "dlsym(libcuda, %s) is not the hook", first_api[i]);
		gpa_fn gpa = (gpa_fn)dlsym(libcuda(), "cuGetProcAddress_v2");
		void *p = NULL;
		CHECK(gpa != NULL, "no cuGetProcAddress_v2");
		if (gpa(first_api[i], &p, 13000, 0, NULL) == CUDA_SUCCESS)
			CHECK(p == hook, "cuGetProcAddress(%s) is not the hook", first_api[i]);
	}
	for (size_t i = 0; i < sizeof(ptsz) / sizeof(ptsz[0]); i++)
		CHECK(procaddr(ptsz[i][0], CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) == dlsym(RTLD_DEFAULT, ptsz[i][1]),
		      "cuGetProcAddress(%s, per-thread stream) is not the hook's %s", ptsz[i][0], ptsz[i][1]);
	/* Functions the hook does not touch come straight from the driver. */
	void *real = driver_sym("cuCtxSetCurrent");
	CHECK(real != NULL && procaddr("cuCtxSetCurrent", 0) == real, "cuCtxSetCurrent did not pass through");
	CHECK(dlsym(libcuda(), "cuCtxSetCurrent") == real, "dlsym(cuCtxSetCurrent) did not pass through");
	/* RTLD_NEXT from this program finds the next definition after it: the hook's. */
	CHECK(dlsym(RTLD_NEXT, "cuMemAlloc_v2") == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "RTLD_NEXT lookup");
	CHECK(dlsym(RTLD_NEXT, "strlen") != NULL, "RTLD_NEXT lookup of a libc function");
	CHECK(dlsym(libcuda(), "cuNoSuchFunction") == NULL, "found a function that does not exist");
	/* dlvsym answers like dlsym. The fake's symbols have version TESSERA_FAKE_CUDA; an
	 * object with version information answers dlvsym only for its own versions. */
	if (dlsym(libcuda(), "fake_cuda_stats") != NULL) {
		const char *v = "TESSERA_FAKE_CUDA";
		CHECK(dlvsym(libcuda(), "cuMemAlloc_v2", v) == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"),
		      "dlvsym(libcuda, cuMemAlloc_v2) is not the hook");
		CHECK(dlvsym(libcuda(), "cuLaunchKernel", v) == dlsym(RTLD_DEFAULT, "cuLaunchKernel"),
		      "dlvsym(libcuda, cuLaunchKernel) is not the hook");
		CHECK(dlvsym(libcuda(), "cuCtxSetCurrent", v) == real, "dlvsym(cuCtxSetCurrent) did not pass through");
		CHECK(dlvsym(RTLD_NEXT, "cuMemAlloc_v2", v) == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "dlvsym(RTLD_NEXT) lookup");
	}
	CHECK(dlvsym(libcuda(), "cuMemAlloc_v2", "NO_SUCH_VERSION") == NULL, "dlvsym found a version that does not exist");
	printf("ok procaddr\n");
	return 0;
}

/* ---- lookup: no lookup by name hands out the driver's own functions ------------ */

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef void *(*dl_sym_fn)(void *, const char *, void *);
typedef void *(*dl_vsym_fn)(void *, const char *, const char *, void *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

/* glibc's versions of dlsym and dlvsym: the current one, and the first of each target
 * (x86-64, aarch64, i386). */
static const char *const glibc_versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
#define NVERSIONS (sizeof(glibc_versions) / sizeof(glibc_versions[0]))

static const char *route;
static uint64_t route_limit;
static int route_tries;

/* An allocation function a route handed out must be the hook's: the whole grant is
 * refused (the context's charge is on it too), and a small allocation works. */
static void must_be_hook(const char *how, void *fn)
{
	CHECK(fn != NULL, "%s: %s found nothing", route, how);
	alloc_fn a = (alloc_fn)fn;
	CUdeviceptr p;
	CUresult rc = a(&p, route_limit);
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
	      "%s: %s allocated the whole %llu MiB grant (rc %d): the route reached the driver's own cuMemAlloc_v2", route,
	      how, (unsigned long long)(route_limit / MIB), rc);
	OK(a(&p, MIB));
	OK(cuMemFree_v2(p));
	CHECK(fn == (void *)cuMemAlloc_v2, "%s: %s is not the hook's cuMemAlloc_v2", route, how);
	route_tries++;
}

/* What a dlsym-shaped function found by the route gives: the driver's functions by
 * name, and through cuGetProcAddress. */
static void through_dlsym(const char *how, dlsym_fn f)
{
	char what[256];
	CHECK(f != NULL, "%s: %s found nothing", route, how);
	snprintf(what, sizeof(what), "%s then (libcuda, cuMemAlloc_v2)", how);
	must_be_hook(what, f(libcuda(), "cuMemAlloc_v2"));
	snprintf(what, sizeof(what), "%s then (RTLD_DEFAULT, cuMemAlloc_v2)", how);
	must_be_hook(what, f(RTLD_DEFAULT, "cuMemAlloc_v2"));
	gpa_fn gpa = (gpa_fn)f(libcuda(), "cuGetProcAddress_v2");
	CHECK(gpa == (gpa_fn)cuGetProcAddress_v2, "%s: %s then cuGetProcAddress_v2 is not the hook's", route, how);
	void *p = NULL;
	OK(gpa("cuMemAlloc", &p, 13000, 0, NULL));
	snprintf(what, sizeof(what), "%s then cuGetProcAddress_v2(cuMemAlloc)", how);
	must_be_hook(what, p);
	gpa1_fn gpa1 = (gpa1_fn)f(libcuda(), "cuGetProcAddress");
	CHECK(gpa1 != NULL, "%s: %s then cuGetProcAddress found nothing", route, how);
	p = NULL;
	OK(gpa1("cuMemAlloc", &p, 12000, 0));
	snprintf(what, sizeof(what), "%s then cuGetProcAddress(cuMemAlloc)", how);
	must_be_hook(what, p);
	CHECK(f == (dlsym_fn)dlsym, "%s: %s is not the hook's dlsym", route, how);
}

/* A dlvsym-shaped function: asked for dlsym at each of glibc's versions. */
static void through_dlvsym(const char *how, dlvsym_fn f)
{
	char what[256];
	CHECK(f != NULL, "%s: %s found nothing", route, how);
	int found = 0;
	for (size_t i = 0; i < NVERSIONS; i++) {
		dlsym_fn d = (dlsym_fn)f(RTLD_DEFAULT, "dlsym", glibc_versions[i]);
		if (d == NULL)
			continue;
		snprintf(what, sizeof(what), "%s then (RTLD_DEFAULT, dlsym, %s)", how, glibc_versions[i]);
		through_dlsym(what, d);
		found++;
	}
	CHECK(found > 0, "%s: %s found dlsym at none of glibc's versions", route, how);
	CHECK(f == (dlvsym_fn)dlvsym, "%s: %s is not the hook's dlvsym", route, how);
}

/* lookup <route> <limit-mib>: a program asks the loader, by name, for a lookup
 * function (libc's dlsym, dlvsym, glibc's private lookups) or for the driver's
 * functions through one, every way there is; each answer must be the hook's and an
 * allocation through it held to the grant. A route this glibc lacks is skipped, and
 * at least one lookup must have been checked. */
static int lookup_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: lookup <route> <limit-mib>");
	route = argv[2];
	route_limit = strtoull(argv[3], NULL, 10) * MIB;
	setup();
	void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
	void *libdl = dlopen("libdl.so.2", RTLD_LAZY);
	CHECK(libc != NULL, "libc.so.6 is not loaded");
	char what[256];
	if (strcmp(route, "dlsym") == 0) {
		/* dlsym asked for dlsym, from every handle. */
		through_dlsym("dlsym(RTLD_DEFAULT, dlsym)", (dlsym_fn)dlsym(RTLD_DEFAULT, "dlsym"));
		through_dlsym("dlsym(RTLD_NEXT, dlsym)", (dlsym_fn)dlsym(RTLD_NEXT, "dlsym"));
		through_dlsym("dlsym(libc.so.6, dlsym)", (dlsym_fn)dlsym(libc, "dlsym"));
		if (libdl != NULL && dlsym(libdl, "dlsym") != NULL)
			through_dlsym("dlsym(libdl.so.2, dlsym)", (dlsym_fn)dlsym(libdl, "dlsym"));
	} else if (strcmp(route, "dlvsym") == 0) {
		/* dlvsym asked for dlsym at each version, from every handle: the route that
		 * held 8000 MiB under a 1024 MiB grant. */
		void *handles[] = {RTLD_DEFAULT, RTLD_NEXT, libc, libdl};
		const char *names[] = {"RTLD_DEFAULT", "RTLD_NEXT", "libc.so.6", "libdl.so.2"};
		for (size_t h = 0; h < 4; h++) {
			if (handles[h] == NULL && h == 3)
				continue;
			for (size_t i = 0; i < NVERSIONS; i++) {
				dlsym_fn d = (dlsym_fn)dlvsym(handles[h], "dlsym", glibc_versions[i]);
				if (d == NULL)
					continue;
				snprintf(what, sizeof(what), "dlvsym(%s, dlsym, %s)", names[h], glibc_versions[i]);
				through_dlsym(what, d);
			}
		}
	} else if (strcmp(route, "dlvsym-dlvsym") == 0) {
		/* dlsym or dlvsym asked for dlvsym. */
		through_dlvsym("dlsym(RTLD_DEFAULT, dlvsym)", (dlvsym_fn)dlsym(RTLD_DEFAULT, "dlvsym"));
		through_dlvsym("dlsym(libc.so.6, dlvsym)", (dlvsym_fn)dlsym(libc, "dlvsym"));
		for (size_t i = 0; i < NVERSIONS; i++) {
			dlvsym_fn v = (dlvsym_fn)dlvsym(libc, "dlvsym", glibc_versions[i]);
			if (v == NULL)
				continue;
			snprintf(what, sizeof(what), "dlvsym(libc.so.6, dlvsym, %s)", glibc_versions[i]);
			through_dlvsym(what, v);
		}
	} else if (strcmp(route, "private") == 0) {
		/* glibc's private lookups (exported by glibc 2.28 to 2.33, GLIBC_PRIVATE),
		 * asked for by name or by version, and called as a program would. */
		static const char *const priv[] = {"_dl_sym", "_dl_vsym", "__libc_dlsym", "__libc_dlvsym"};
		for (size_t k = 0; k < 4; k++) {
			void *cands[3] = {dlsym(RTLD_DEFAULT, priv[k]), dlvsym(RTLD_DEFAULT, priv[k], "GLIBC_PRIVATE"),
					  dlvsym(libc, priv[k], "GLIBC_PRIVATE")};
			for (size_t c = 0; c < 3; c++) {
				void *f = cands[c];
				if (f == NULL)
					continue;
				snprintf(what, sizeof(what), "%s (lookup %zu)", priv[k], c);
				void *self = (void *)lookup_main; /* a `who` inside the program */
				switch (k) {
				case 0:
					must_be_hook(what, ((dl_sym_fn)f)(libcuda(), "cuMemAlloc_v2", self));
					through_dlsym(what, (dlsym_fn)((dl_sym_fn)f)(libc, "dlsym", self));
					/* A `who` inside the hook does not make the answer the real one. */
					must_be_hook(what, ((dl_sym_fn)f)(libcuda(), "cuMemAlloc_v2", (void *)cuMemAlloc_v2));
					break;
				case 1:
					for (size_t i = 0; i < NVERSIONS; i++) {
						dlsym_fn d = (dlsym_fn)((dl_vsym_fn)f)(libc, "dlsym", glibc_versions[i], self);
						if (d != NULL)
							through_dlsym(what, d);
					}
					break;
				case 2:
					must_be_hook(what, ((dlsym_fn)f)(libcuda(), "cuMemAlloc_v2"));
					through_dlsym(what, (dlsym_fn)((dlsym_fn)f)(libc, "dlsym"));
					break;
				case 3:
					for (size_t i = 0; i < NVERSIONS; i++) {
						dlsym_fn d = (dlsym_fn)((dlvsym_fn)f)(libc, "dlsym", glibc_versions[i]);
						if (d != NULL)
							through_dlsym(what, d);
					}
					break;
				}
			}
		}
	} else if (strcmp(route, "procaddr") == 0) {
		/* cuGetProcAddress asked for itself, then for an allocation. */
		void *p = NULL;
		gpa_fn gpa = (gpa_fn)procaddr("cuGetProcAddress", 0);
		CHECK(gpa == (gpa_fn)cuGetProcAddress_v2, "cuGetProcAddress(cuGetProcAddress) is not the hook's");
		OK(gpa("cuMemAlloc", &p, 13000, 0, NULL));
		must_be_hook("cuGetProcAddress(cuGetProcAddress) then (cuMemAlloc)", p);
		gpa1_fn gpa1 = (gpa1_fn)dlsym(libcuda(), "cuGetProcAddress");
		p = NULL;
		OK(gpa1("cuGetProcAddress", &p, 12000, 0));
		CHECK(p == (void *)cuGetProcAddress_v2, "cuGetProcAddress v1 (cuGetProcAddress) is not the hook's");
		must_be_hook("dlsym(libcuda, cuMemAlloc_v2)", dlsym(libcuda(), "cuMemAlloc_v2"));
	} else {
		CHECK(0, "unknown route %s", route);
	}
	CHECK(route_tries > 0, "%s: no lookup of this route exists here, nothing was checked", route);
	printf("ok lookup %s: %d allocation functions found, each the hook's and held to the grant\n", route, route_tries);
	return 0;
}

/* ---- processes ----------------------------------------------------------------- */

static int try_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: try <mib> ok|oom");
	setup();
	CUdeviceptr p;
	CUresult rc = cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10) * MIB);
	CUresult want = strcmp(argv[3], "ok") == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	CHECK(rc == want, "allocating %s MiB gave %d, want %d", argv[2], rc, want);
	printf("ok try %s %s\n", argv[2], argv[3]);
	return 0;
}

static int hold_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: hold <mib> <ready-file>");
	setup();
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10) * MIB));
	FILE *f = fopen(argv[3], "w");
	CHECK(f != NULL, "cannot write %s", argv[3]);
	fclose(f);
	for (;;)
		pause();
}

/* Holds memory until go-file appears (the suite damages the region meanwhile), then
 * checks that the hook refuses rather than trusting or crashing. */
static int damaged_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: damaged <ready-file> <go-file>");
	setup();
	CUdeviceptr a, b;
	OK(cuMemAlloc_v2(&a, 64 * MIB));
	FILE *f = fopen(argv[2], "w");
	CHECK(f != NULL, "cannot write %s", argv[2]);
	fclose(f);
	for (int i = 0; access(argv[3], F_OK) != 0; i++) {
		CHECK(i < 2000, "%s never appeared", argv[3]);
		usleep(10000);
	}
	CHECK(cuMemAlloc_v2(&b, MIB) == CUDA_ERROR_OUT_OF_MEMORY, "an allocation after the region was damaged was not refused");
	size_t fr = 1, tot = 0;
	CUresult rc = cuMemGetInfo_v2(&fr, &tot);
	CHECK(rc != CUDA_SUCCESS || fr == 0, "cuMemGetInfo reports %llu MiB free from a damaged region", (unsigned long long)(fr / MIB));
	OK(cuMemFree_v2(a));
	CHECK(cuMemAlloc_v2(&b, MIB) == CUDA_ERROR_OUT_OF_MEMORY, "an allocation was refused, then allowed");
	printf("ok damaged\n");
	return 0;
}

/* A process started after the region was damaged: refused at its first call, or at
 * its first reservation (a region whose header holds but whose usage does not). */
static int damaged_new_main(void)
{
	CUdevice d;
	CUcontext c;
	CUdeviceptr p;
	CUresult rc = cuInit(0);
	if (rc == CUDA_ERROR_OPERATING_SYSTEM) {
		printf("ok damaged-new: refused at cuInit\n");
		return 0;
	}
	OK(rc);
	OK(cuDeviceGet(&d, 0));
	rc = cuDevicePrimaryCtxRetain(&c, d);
	if (rc == CUDA_SUCCESS) {
		OK(cuCtxSetCurrent(c));
		rc = cuMemAlloc_v2(&p, MIB);
	}
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a reservation from a damaged region gave %d", rc);
	printf("ok damaged-new: refused at the first reservation\n");
	return 0;
}

/* Creates contexts on device 0, each with chunk MiB allocated in it (green contexts:
 * no allocation), until the hook refuses: the driver never holds more than the limit,
 * at least two fit, and destroying them gives their charge back. */
static int contexts_main(int argc, char **argv)
{
	CHECK(argc == 6, "usage: contexts <create|green> <limit-mib> <context-mib> <chunk-mib>");
	int green = strcmp(argv[2], "green") == 0;
	uint64_t limit = strtoull(argv[3], NULL, 10) * MIB, chunk = strtoull(argv[5], NULL, 10) * MIB;
	CUdevice d = setup();
	void *made[64];
	int n = 0;
	CUresult rc = CUDA_SUCCESS;
	while (n < 64) {
		if (green) {
			rc = cuGreenCtxCreate((CUgreenCtx *)&made[n], NULL, d, 0);
		} else if ((rc = cuCtxCreate_v4((CUcontext *)&made[n], NULL, 0, d)) == CUDA_SUCCESS) {
			CUdeviceptr p;
			OK(cuCtxSetCurrent((CUcontext)made[n]));
			rc = cuMemAlloc_v2(&p, chunk);
			if (rc != CUDA_SUCCESS)
				n++; /* the context itself was made */
		}
		if (rc != CUDA_SUCCESS)
			break;
		n++;
	}
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "creation ended with %d, want CUDA_ERROR_OUT_OF_MEMORY", rc);
	struct fake_cuda_stats s = stats();
	CHECK(s.peak[0] <= limit, "the driver held %llu MiB under a %llu MiB limit with %d contexts",
	      (unsigned long long)(s.peak[0] / MIB), (unsigned long long)(limit / MIB), n);
	CHECK(n >= 2, "only %d contexts fit", n);
	uint64_t peak = s.peak[0];
	for (int i = 0; i < n; i++)
		OK(green ? cuGreenCtxDestroy((CUgreenCtx)made[i]) : cuCtxDestroy_v2((CUcontext)made[i]));
	for (int i = 0; i < n - 1; i++)
		OK(green ? cuGreenCtxCreate((CUgreenCtx *)&made[i], NULL, d, 0) : cuCtxCreate_v4((CUcontext *)&made[i], NULL, 0, d));
	printf("ok contexts %s: %d contexts, the driver held at most %llu MiB of %llu; destroyed, %d made again\n", argv[2], n,
	       (unsigned long long)(peak / MIB), (unsigned long long)(limit / MIB), n - 1);
	return 0;
}

/* Loads modules whose globals take module-mib each until the hook refuses: the driver
 * never holds more than the limit, and unloading gives the charge back. */
static int modules_main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: modules <module|library> <limit-mib> <module-mib>");
	int lib = strcmp(argv[2], "library") == 0;
	uint64_t limit = strtoull(argv[3], NULL, 10) * MIB;
	char image[64];
	snprintf(image, sizeof(image), "fake-module %s", argv[4]);
	setup();
	void *m[256];
	int n = 0;
	CUresult rc = CUDA_SUCCESS;
	while (n < 256 && rc == CUDA_SUCCESS) {
		rc = lib ? cuLibraryLoadData((CUlibrary *)&m[n], image, NULL, NULL, 0, NULL, NULL, 0)
			 : cuModuleLoadData((CUmodule *)&m[n], image);
		if (rc == CUDA_SUCCESS)
			n++;
	}
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "loading ended with %d, want CUDA_ERROR_OUT_OF_MEMORY", rc);
	struct fake_cuda_stats s = stats();
	CHECK(s.used[0] <= limit && n >= 1, "the driver holds %llu MiB under a %llu MiB limit with %d modules",
	      (unsigned long long)(s.used[0] / MIB), (unsigned long long)(limit / MIB), n);
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, strtoull(argv[4], NULL, 10) * MIB) == CUDA_ERROR_OUT_OF_MEMORY, "module memory not counted");
	OK(lib ? cuLibraryUnload((CUlibrary)m[0]) : cuModuleUnload((CUmodule)m[0]));
	OK(cuMemAlloc_v2(&p, strtoull(argv[4], NULL, 10) * MIB));
	printf("ok modules %s: %d loaded, the driver holds %llu MiB of %llu; an unload gives its memory back\n", argv[2], n,
	       (unsigned long long)(s.used[0] / MIB), (unsigned long long)(limit / MIB));
	return 0;
}

/* A context's teardown frees what was made in it, and the hook gives that back:
 * cudaDeviceReset's cuDevicePrimaryCtxReset (looked up through cuGetProcAddress, as
 * the runtime does) its allocations, managed memory, modules and raised limits; a
 * created context's destroy its allocations; the primary context's last release
 * everything in it. A VMM handle belongs to no context: counted until released. */
static int teardown_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: teardown <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctxb = strtoull(argv[3], NULL, 10) * MIB;
	CUdevice d = setup();
	uint64_t q = (limit - ctxb) / 4, vmm_bytes = 32 * MIB, x;
	CUdeviceptr p;
	CUmodule m;
	char image[64];
	snprintf(image, sizeof(image), "fake-module %llu", (unsigned long long)(q / 4 / MIB));
	/* The primary context nearly filled: three quarters allocated (a quarter of it
	 * managed memory in the first round), a sixteenth as a module's and as much as
	 * raised heap, and a VMM handle. */
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 3; i++)
			OK(round == 0 && i == 2 ? a_managed(q, &x) : cuMemAlloc_v2(&p, q));
		OK(cuModuleLoadData(&m, image));
		OK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (8 << 20) + q / 4));
		if (round == 0)
			OK(a_vmm(vmm_bytes, &x));
		CHECK(cuMemAlloc_v2(&p, q) == CUDA_ERROR_OUT_OF_MEMORY, "round %d: past the limit allowed", round);
		if (round == 1)
			break;
		CUresult (*reset)(CUdevice) = (CUresult(*)(CUdevice))procaddr("cuDevicePrimaryCtxReset", 0);
		OK(reset(d));
		struct fake_cuda_stats s = stats();
		CHECK(s.used[0] == vmm_bytes, "after the reset the driver holds %llu MiB, want the VMM handle's %llu",
		      (unsigned long long)(s.used[0] / MIB), (unsigned long long)(vmm_bytes / MIB));
		size_t fr, tot;
		OK(cuMemGetInfo_v2(&fr, &tot));
		CHECK(fr == limit - ctxb - vmm_bytes, "after the reset %llu MiB shown free, want %llu (the context's and the VMM "
		      "handle's still counted)", (unsigned long long)(fr / MIB), (unsigned long long)((limit - ctxb - vmm_bytes) / MIB));
	}
	/* The same filled again: the reset's memory was given back. Then the VMM handle. */
	OK(f_vmm(x));
	/* A created context's allocation goes with it. */
	CUcontext pc, cc;
	OK(cuDevicePrimaryCtxRetain(&pc, d));
	OK(cuCtxCreate_v4(&cc, NULL, 0, d));
	OK(cuCtxSetCurrent(cc));
	OK(cuMemAlloc_v2(&p, vmm_bytes));
	OK(cuCtxDestroy_v2(cc));
	OK(cuCtxSetCurrent(pc));
	OK(cuMemAlloc_v2(&p, vmm_bytes + ctxb));
	CHECK(cuMemAlloc_v2(&p, q) == CUDA_ERROR_OUT_OF_MEMORY, "after the destroy: past the limit allowed");
	/* The primary context's last release: everything in it given back. */
	OK(cuDevicePrimaryCtxRelease_v2(d));
	OK(cuDevicePrimaryCtxRelease_v2(d));
	struct fake_cuda_stats s = stats();
	CHECK(s.used[0] == 0, "after the last release the driver holds %llu MiB", (unsigned long long)(s.used[0] / MIB));
	OK(cuDevicePrimaryCtxRetain(&pc, d));
	OK(cuCtxSetCurrent(pc));
	OK(cuMemAlloc_v2(&p, limit - ctxb));
	printf("ok teardown: a reset, a destroy and the last release each gave back what the driver freed with the context\n");
	return 0;
}

/* The ABI before CUDA 3.2, 4.0 and 11.0, which the driver still exports, looked up by
 * name: its allocations refused (none reaches the driver), its context creation
 * charged, its destroy, primary release and reset giving back as the current ones do. */
static int v1abi_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: v1abi <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctxb = strtoull(argv[3], NULL, 10) * MIB;
	CUdevice d = setup();
	typedef CUresult (*alloc1_fn)(unsigned int *, unsigned int);
	typedef CUresult (*pitch1_fn)(unsigned int *, unsigned int *, unsigned int, unsigned int, unsigned int);
	typedef CUresult (*array1_fn)(CUarray *, const void *);
	typedef CUresult (*create1_fn)(CUcontext *, unsigned int, CUdevice);
	typedef CUresult (*ctx1_fn)(CUcontext);
	typedef CUresult (*dev1_fn)(CUdevice);
	alloc1_fn alloc1 = (alloc1_fn)dlsym(libcuda(), "cuMemAlloc");
	pitch1_fn pitch1 = (pitch1_fn)dlsym(libcuda(), "cuMemAllocPitch");
	array1_fn arr1 = (array1_fn)dlsym(libcuda(), "cuArrayCreate"), arr3 = (array1_fn)dlsym(libcuda(), "cuArray3DCreate");
	create1_fn create1 = (create1_fn)dlsym(libcuda(), "cuCtxCreate");
	ctx1_fn destroy1 = (ctx1_fn)dlsym(libcuda(), "cuCtxDestroy");
	dev1_fn release1 = (dev1_fn)dlsym(libcuda(), "cuDevicePrimaryCtxRelease"), reset1 = (dev1_fn)dlsym(libcuda(), "cuDevicePrimaryCtxReset");
	CHECK(alloc1 && pitch1 && arr1 && arr3 && create1 && destroy1 && release1 && reset1, "a CUDA 3.1-11.0 ABI symbol not found");
	CHECK((void *)alloc1 != driver_sym("cuMemAlloc") && (void *)create1 != driver_sym("cuCtxCreate") &&
	      (void *)reset1 != driver_sym("cuDevicePrimaryCtxReset"), "dlsym handed out the driver's own old-ABI function");
	unsigned int p1 = 0, pitch = 0;
	CUarray a;
	CHECK(alloc1(&p1, 64 << 20) == CUDA_ERROR_NOT_SUPPORTED, "cuMemAlloc (CUDA 3.1 ABI) not refused");
	CHECK(pitch1(&p1, &pitch, 4096, 4096, 4) == CUDA_ERROR_NOT_SUPPORTED, "cuMemAllocPitch (CUDA 3.1 ABI) not refused");
	CHECK(arr1(&a, NULL) == CUDA_ERROR_NOT_SUPPORTED && arr3(&a, NULL) == CUDA_ERROR_NOT_SUPPORTED,
	      "cuArrayCreate / cuArray3DCreate (CUDA 3.1 ABI) not refused");
	struct fake_cuda_stats s = stats();
	CHECK(s.used[0] == 0, "the old ABI's allocations reached the driver: it holds %llu MiB", (unsigned long long)(s.used[0] / MIB));
	/* Its memory figures are the limit's, not the GPU's. */
	typedef CUresult (*info1_fn)(unsigned int *, unsigned int *);
	typedef CUresult (*total1_fn)(unsigned int *, CUdevice);
	info1_fn info1 = (info1_fn)dlsym(libcuda(), "cuMemGetInfo");
	total1_fn total1 = (total1_fn)dlsym(libcuda(), "cuDeviceTotalMem");
	unsigned int fr1 = 0, tot1 = 0, dt1 = 0;
	CHECK(info1 != NULL && total1 != NULL, "cuMemGetInfo / cuDeviceTotalMem (CUDA 3.1 ABI) not found");
	OK(info1(&fr1, &tot1));
	OK(total1(&dt1, d));
	CHECK(tot1 == limit && dt1 == limit && fr1 == limit - ctxb, "the CUDA 3.1 ABI's memory figures are %u / %u free / total, "
	      "%u total, want the %llu MiB limit's", fr1, tot1, dt1, (unsigned long long)(limit / MIB));
	/* Contexts through cuCtxCreate (before 3.2): charged, refused past the limit. */
	CUcontext made[64], pc;
	int n = 0;
	CUresult rc;
	while (n < 64 && (rc = create1(&made[n], 0, d)) == CUDA_SUCCESS)
		n++;
	CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY && (uint64_t)(n + 1) * ctxb <= limit,
	      "cuCtxCreate (before 3.2): %d contexts of %llu MiB beside the primary under %llu MiB, ended with %d", n,
	      (unsigned long long)(ctxb / MIB), (unsigned long long)(limit / MIB), rc);
	OK(destroy1(made[0]));
	OK(create1(&made[0], 0, d));
	for (int i = 0; i < n; i++)
		OK(destroy1(made[i]));
	/* The primary context's reset and last release (before 11.0). */
	OK(cuDevicePrimaryCtxRetain(&pc, d));
	OK(cuCtxSetCurrent(pc));
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, limit - ctxb));
	OK(reset1(d));
	OK(cuMemAlloc_v2(&p, limit - ctxb));
	OK(release1(d));
	OK(release1(d));
	s = stats();
	CHECK(s.used[0] == 0, "after the last release the driver holds %llu MiB", (unsigned long long)(s.used[0] / MIB));
	OK(cuDevicePrimaryCtxRetain(&pc, d));
	OK(cuCtxSetCurrent(pc));
	OK(cuMemAlloc_v2(&p, limit - ctxb));
	printf("ok v1abi: the 3.1 ABI's allocations refused; %d contexts through cuCtxCreate charged; the old reset and release "
	       "give back\n", n);
	return 0;
}

/* Raising the malloc heap, printf FIFO or stack past what the limit leaves is
 * refused; within it, counted; lowering it gives the memory back. */
static int devlimits_main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: devlimits <limit-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB;
	setup();
	CUdeviceptr p;
	CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 2 * limit) == CUDA_ERROR_OUT_OF_MEMORY, "a heap past the limit was allowed");
	CHECK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 2 * limit) == CUDA_ERROR_OUT_OF_MEMORY, "a FIFO past the limit was allowed");
	CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 64 << 10) == CUDA_ERROR_OUT_OF_MEMORY, "a 64 KiB stack (16.5 GiB) was allowed");
	OK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, limit / 2));
	CHECK(cuMemAlloc_v2(&p, limit / 2) == CUDA_ERROR_OUT_OF_MEMORY, "the heap was not counted");
	OK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20));
	OK(cuMemAlloc_v2(&p, limit / 2));
	OK(cuMemFree_v2(p));
	OK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048)); /* +264 MiB */
	struct fake_cuda_stats s = stats();
	CHECK(s.peak[0] <= limit, "the driver held %llu MiB under a %llu MiB limit", (unsigned long long)(s.peak[0] / MIB),
	      (unsigned long long)(limit / MIB));
	printf("ok devlimits: heap, FIFO and stack counted and refused past the limit (peak %llu MiB of %llu)\n",
	       (unsigned long long)(s.peak[0] / MIB), (unsigned long long)(limit / MIB));
	return 0;
}

static int fork_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: fork <limit-mib> <context-mib>");
	uint64_t limit = strtoull(argv[2], NULL, 10) * MIB, ctx = strtoull(argv[3], NULL, 10) * MIB;
	setup();
	CUdeviceptr a, b;
	uint64_t half = (limit - 2 * ctx) / 2;
	OK(cuMemAlloc_v2(&a, half));
	pid_t pid = fork();
	if (pid == 0) {
		scenario = "fork (child)";
		setup(); /* a child makes its own context, charged to it */
		OK(cuMemAlloc_v2(&b, half - MIB));
		CHECK(cuMemAlloc_v2(&b, 2 * MIB) == CUDA_ERROR_OUT_OF_MEMORY, "the child went past the shared limit");
		exit(0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
	/* The child's usage left with it, and the parent's is intact. */
	OK(cuMemAlloc_v2(&b, half));
	CHECK(cuMemAlloc_v2(&b, ctx + MIB) == CUDA_ERROR_OUT_OF_MEMORY, "the parent went past the limit");
	OK(cuMemFree_v2(a));
	printf("ok fork\n");
	return 0;
}

/* ---- orphan: a dead process's memory stays counted while its child holds it ----- */

/* A new process of the container allocates mib through the hook, makes a holder that
 * keeps the inherited driver descriptors and does nothing else, sends the holder's pid
 * and exits without freeing anything. Odd generations fork the holder and leave
 * through _exit (no exit handlers); even ones make it with a raw clone system call,
 * which runs no atfork handler, and leave through exit (the hook's exit handler). */
__attribute__((noreturn)) static void orphan_allocator(int gen, uint64_t mib, const int info[2], const int release[2])
{
	scenario = "orphan (allocator)";
	/* Only the test writes release: a holder sees its end when the test goes. */
	close(info[0]);
	close(release[1]);
	int info_fd = info[1], release_fd = release[0];
	setup();
	CUdeviceptr p;
	CUresult rc = cuMemAlloc_v2(&p, mib);
	CHECK(rc == CUDA_SUCCESS,
	      "generation %d: allocating %llu MiB gave %d (the usage of the generation before was not given back after its holder exited)",
	      gen, (unsigned long long)(mib / MIB), rc);
	pid_t h = gen % 2 ? fork() : (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
	CHECK(h >= 0, "making the holder failed");
	if (h == 0) {
		char c;
		_exit(read(release_fd, &c, 1) == 1 ? 0 : 2);
	}
	CHECK(write(info_fd, &h, sizeof(h)) == sizeof(h), "cannot send the holder's pid");
	if (gen % 2)
		_exit(0);
	exit(0);
}

/* A new process of the container asks for mib (with a context of its own): 0 when it
 * got it, 1 when the hook refused it (CUDA_ERROR_OUT_OF_MEMORY at the context or the
 * allocation), 3 on any other error. */
static int orphan_probe(uint64_t mib)
{
	pid_t c = fork();
	CHECK(c >= 0, "fork failed");
	if (c == 0) {
		CUdevice d;
		CUcontext ctx;
		CUdeviceptr p;
		if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS)
			_exit(3);
		CUresult rc = cuDevicePrimaryCtxRetain(&ctx, d);
		if (rc == CUDA_SUCCESS && (rc = cuCtxSetCurrent(ctx)) == CUDA_SUCCESS)
			rc = cuMemAlloc_v2(&p, mib);
		_exit(rc == CUDA_SUCCESS ? 0 : rc == CUDA_ERROR_OUT_OF_MEMORY ? 1 : 3);
	}
	int st;
	CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st), "the probe did not exit");
	return WEXITSTATUS(st);
}

/* orphan <generations> <mib> <limit-mib>: the fork-orphan attack, generation after
 * generation. Each generation is a new process that allocates mib, leaves a holder of
 * its driver descriptors and exits; while the holder lives, a new process of the
 * container must be refused (the driver still holds the dead process's memory: the
 * hook must keep it counted); once the holder has exited, a new process must get mib
 * (the usage is given back), and so must the next generation. Choose mib so that two
 * processes holding it (with their contexts) exceed the grant and one fits.
 *
 * This process (a subreaper, with no CUDA of its own) reaps them all. On the fake
 * driver with FAKE_CUDA_TALLY, which keeps a dead process's memory while its
 * descriptors are held, it also checks that the memory was held while the holder
 * lived and that the container never held more than its grant at once. */
static int orphan_main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: orphan <generations> <mib> <limit-mib>");
	int n = atoi(argv[2]);
	uint64_t mib = strtoull(argv[3], NULL, 10) * MIB, limit = strtoull(argv[4], NULL, 10) * MIB;
	CHECK(n >= 2 && mib > 0 && mib <= limit, "want 2 or more generations of at most the grant each");
	CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "cannot become a subreaper");
	int tally = getenv("FAKE_CUDA_TALLY") != NULL && dlsym(libcuda(), "fake_cuda_stats") != NULL;
	for (int g = 1; g <= n; g++) {
		int info[2], release[2], st;
		CHECK(pipe(info) == 0 && pipe(release) == 0, "pipe failed");
		pid_t a = fork();
		CHECK(a >= 0, "fork failed");
		if (a == 0)
			orphan_allocator(g, mib, info, release);
		close(info[1]);
		close(release[0]);
		pid_t holder;
		CHECK(read(info[0], &holder, sizeof(holder)) == sizeof(holder), "generation %d failed before its holder", g);
		CHECK(waitpid(a, &st, 0) == a && WIFEXITED(st) && WEXITSTATUS(st) == 0, "generation %d's allocator failed", g);
		const char *how = g % 2 ? "forked" : "raw-cloned";
		if (tally) {
			struct fake_cuda_stats s = stats();
			CHECK(s.all_used[0] >= mib, "generation %d: the fake driver freed the dead allocator's memory while its %s holder lived", g, how);
		}
		int rc = orphan_probe(mib);
		CHECK(rc == 1, "generation %d: a new process %s %llu MiB while the dead allocator's %s holder kept its memory on the GPU (grant %llu MiB)",
		      g, rc == 0 ? "got" : "failed (not refused) asking for", (unsigned long long)(mib / MIB), how,
		      (unsigned long long)(limit / MIB));
		CHECK(write(release[1], "x", 1) == 1, "cannot release the holder");
		CHECK(waitpid(holder, &st, 0) == holder && WIFEXITED(st) && WEXITSTATUS(st) == 0, "generation %d's holder failed", g);
		close(info[0]);
		close(release[1]);
		rc = orphan_probe(mib);
		CHECK(rc == 0, "generation %d: a new process was %s %llu MiB after the %s holder exited (the usage was not given back)", g,
		      rc == 1 ? "refused" : "failed asking for", (unsigned long long)(mib / MIB), how);
	}
	if (tally) {
		struct fake_cuda_stats s = stats();
		CHECK(s.all_peak[0] <= limit, "the generations held %llu MiB at once, over the %llu MiB grant",
		      (unsigned long long)(s.all_peak[0] / MIB), (unsigned long long)(limit / MIB));
		CHECK(s.all_used[0] == 0, "%llu MiB still held after every process exited", (unsigned long long)(s.all_used[0] / MIB));
		printf("ok orphan: %d generations of %s MiB, each refused to a new process while its holder lived and given back after; "
		       "at most %llu MiB held at once under %s MiB\n",
		       n, argv[3], (unsigned long long)(s.all_peak[0] / MIB), argv[4]);
	} else
		printf("ok orphan: %d generations of %s MiB under %s MiB, each refused to a new process while its holder lived and given back after\n",
		       n, argv[3], argv[4]);
	return 0;
}

/* ---- threads: no race past the limit -------------------------------------------- */

static uint64_t thread_limit;
static CUcontext thread_ctx;

static void *churn(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	CUdeviceptr held[32] = {0};
	OK(cuCtxSetCurrent(thread_ctx));
	for (int i = 0; i < 3000; i++) {
		int k = rand_r(&seed) % 32;
		if (held[k]) {
			OK(cuMemFree_v2(held[k]));
			held[k] = 0;
		} else {
			CUresult rc = cuMemAlloc_v2(&held[k], (1 + rand_r(&seed) % 64) * MIB);
			CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_OUT_OF_MEMORY, "alloc gave %d", rc);
			if (rc != CUDA_SUCCESS)
				held[k] = 0;
		}
	}
	for (int k = 0; k < 32; k++)
		if (held[k])
			OK(cuMemFree_v2(held[k]));
	return NULL;
}

/* n threads churn under the limit in this process; alone (together 0) the process
 * must come near the limit, beside other processes sharing it (one of which may hold
 * most of it throughout) only within it. */
static int threads_churn(int n, int together)
{
	CUdevice d = setup();
	OK(cuDevicePrimaryCtxRetain(&thread_ctx, d));
	pthread_t t[64];
	for (int i = 0; i < n && i < 64; i++)
		pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < n && i < 64; i++)
		pthread_join(t[i], NULL);
	struct fake_cuda_stats s = stats();
	CHECK(s.peak[d] <= thread_limit, "peak %llu MiB over the %llu MiB limit", (unsigned long long)(s.peak[d] / MIB),
	      (unsigned long long)(thread_limit / MIB));
	CHECK(together || s.peak[d] > thread_limit / 2, "peak %llu MiB: the test never came near the limit",
	      (unsigned long long)(s.peak[d] / MIB));
	CHECK(s.used[d] == 0, "%llu bytes leaked", (unsigned long long)s.used[d]);
	size_t fr, tot;
	OK(cuMemGetInfo_v2(&fr, &tot));
	printf("ok threads: peak %llu MiB of %llu\n", (unsigned long long)(s.peak[d] / MIB),
	       (unsigned long long)(thread_limit / MIB));
	return 0;
}

/* threads <n> <limit-mib> [<procs>]: n threads churn under the limit. With procs,
 * that many processes of n threads each, forked from here, race for the one limit at
 * once; what they all held at once on the container's first GPU (the fake driver's
 * FAKE_CUDA_TALLY file) must stay within the limit, come near it, and be given back. */
static int threads_main(int argc, char **argv)
{
	CHECK(argc == 4 || argc == 5, "usage: threads <n> <limit-mib> [<procs>]");
	int n = atoi(argv[2]);
	thread_limit = strtoull(argv[3], NULL, 10) * MIB;
	if (argc == 4)
		return threads_churn(n, 0);
	int procs = atoi(argv[4]);
	CHECK(procs >= 2 && procs <= 16, "procs %d", procs);
	CHECK(getenv("FAKE_CUDA_TALLY") != NULL, "processes racing need FAKE_CUDA_TALLY=<file>");
	pid_t pids[16];
	for (int i = 0; i < procs; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0, "fork");
		if (pids[i] == 0) {
			scenario = "threads (process)";
			exit(threads_churn(n, 1)); /* through the hook's exit handler, as a process of its own */
		}
	}
	for (int i = 0; i < procs; i++) {
		int st;
		CHECK(waitpid(pids[i], &st, 0) == pids[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d failed", i);
	}
	CUdevice d = setup();
	struct fake_cuda_stats s = stats();
	CHECK(s.all_peak[d] <= thread_limit, "the processes held %llu MiB at once, over the %llu MiB limit",
	      (unsigned long long)(s.all_peak[d] / MIB), (unsigned long long)(thread_limit / MIB));
	CHECK(s.all_peak[d] > thread_limit / 2, "the processes held at most %llu MiB at once: they never came near the limit",
	      (unsigned long long)(s.all_peak[d] / MIB));
	CHECK(s.all_used[d] == 0, "%llu bytes still held", (unsigned long long)s.all_used[d]);
	printf("ok threads: %d processes held at most %llu MiB of %llu at once\n", procs,
	       (unsigned long long)(s.all_peak[d] / MIB), (unsigned long long)(thread_limit / MIB));
	return 0;
}

/* ---- fail closed ---------------------------------------------------------------- */

static int refused_main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: refused <cuda-error>");
	CUresult want = (CUresult)atoi(argv[2]);
	CUdeviceptr p;
	CHECK(cuInit(0) == want, "cuInit did not fail with %d", want);
	CHECK(cuMemAlloc_v2(&p, MIB) == want, "cuMemAlloc did not fail with %d", want);
	void *pfn = NULL;
	gpa_fn gpa = (gpa_fn)dlsym(libcuda(), "cuGetProcAddress_v2");
	CHECK(gpa != NULL && gpa("cuMemAlloc", &pfn, 13000, 0, NULL) == want, "cuGetProcAddress did not fail");
	CHECK(nvmlInit_v2() == NVML_ERROR_NO_PERMISSION, "nvmlInit_v2 was not refused");
	printf("ok refused\n");
	return 0;
}

/* An MPS client: the driver saw the MPS variables from the limits file at cuInit
 * whatever the tenant had set; the tenant raising its share after cuInit is undone
 * before a context is created; execution affinity is held to the share; without an
 * MPS server CUDA is refused, and stays refused. */
static int mps_main(int argc, char **argv)
{
	CHECK(argc == 3 || argc == 6, "usage: mps <percent> <pipe> <pinned> <granted> | mps refused");
	if (argc == 3) {
		CUdeviceptr p;
		CHECK(cuInit(0) == CUDA_ERROR_MPS_CONNECTION_FAILED, "cuInit without an MPS server did not fail with 805");
		CUdevice d = 0;
		CUcontext c;
		CHECK(cuCtxCreate_v4(&c, NULL, 0, d) == CUDA_ERROR_MPS_CONNECTION_FAILED, "a context was created outside MPS");
		CHECK(cuMemAlloc_v2(&p, MIB) == CUDA_ERROR_MPS_CONNECTION_FAILED, "memory was allocated outside MPS");
		printf("ok mps refused\n");
		return 0;
	}
	OK(cuInit(0));
	fake_cuda_mps_fn seen = (fake_cuda_mps_fn)dlsym(libcuda(), "fake_cuda_mps");
	CHECK(seen != NULL, "the fake driver has no fake_cuda_mps");
	struct fake_cuda_mps m;
	seen(&m);
	CHECK(m.enabled, "the driver did not connect to the MPS server");
	CHECK(strcmp(m.percent, argv[2]) == 0, "driver saw CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s, want %s", m.percent, argv[2]);
	CHECK(strcmp(m.pipe, argv[3]) == 0, "driver saw CUDA_MPS_PIPE_DIRECTORY=%s, want %s", m.pipe, argv[3]);
	CHECK(strcmp(m.pinned, argv[4]) == 0, "driver saw CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s, want %s", m.pinned, argv[4]);
	/* The client's SMs are its share, in TPCs of 2 (the fake has 132 SMs). A context
	 * asking for all of them through execution affinity would read back every SM of
	 * the GPU, as on the H200: the hook makes it again without affinity. */
	unsigned int want = 2 * (unsigned int)(132 * strtod(argv[2], NULL) / 200);
	CUdevice d;
	OK(cuDeviceGet(&d, 0));
	int sms = 0;
	OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
	CHECK((unsigned int)sms == want, "the client has %d SMs, want %u", sms, want);
	CUexecAffinityParam a = {.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT, .param.smCount.val = 132}, got;
	CUcontext c;
	OK(cuCtxCreate_v3(&c, &a, 1, 0, d));
	CHECK(a.param.smCount.val == 132, "the caller's parameters were changed");
	seen(&m);
	CHECK(m.ctx_sms <= want, "cuCtxCreate_v3 asking for 132 SMs reached the driver with %u, more than %u", m.ctx_sms, want);
	OK(cuCtxGetExecAffinity(&got, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
	CHECK(got.param.smCount.val == want, "the context asking for every SM has %u, want %u", got.param.smCount.val, want);
	OK(cuCtxDestroy_v2(c));
	/* The tenant raises its share after cuInit: set back before the next context. */
	setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100", 1);
	setenv("CUDA_MPS_PIPE_DIRECTORY", "/nowhere", 1);
	CUctxCreateParams cp = {.execAffinityParams = &a, .numExecAffinityParams = 1};
	OK(cuCtxCreate_v4(&c, &cp, 0, d));
	CHECK(strcmp(getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), argv[5]) == 0 && strcmp(getenv("CUDA_MPS_PIPE_DIRECTORY"), argv[3]) == 0,
	      "the environment was not set back before the context: %s %s", getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
	      getenv("CUDA_MPS_PIPE_DIRECTORY"));
	OK(cuCtxGetExecAffinity(&got, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
	CHECK(got.param.smCount.val == want, "cuCtxCreate_v4 asking for every SM has %u, want %u", got.param.smCount.val, want);
	OK(cuCtxDestroy_v2(c));
	/* A smaller share than the client's is the caller's to take. */
	a.param.smCount.val = 5;
	OK(cuCtxCreate_v4(&c, &cp, 0, d));
	seen(&m);
	OK(cuCtxGetExecAffinity(&got, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
	CHECK(m.ctx_sms == 5 && got.param.smCount.val == 6, "asking for 5 SMs: %u reached the driver, the context has %u", m.ctx_sms,
	      got.param.smCount.val);
	OK(cuCtxDestroy_v2(c));
	printf("ok mps percent=%s sms=%u\n", argv[2], want);
	return 0;
}

static int total_is_main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: total-is <mib>");
	setup();
	size_t fr, tot;
	OK(cuMemGetInfo_v2(&fr, &tot));
	CHECK(tot == strtoull(argv[2], NULL, 10) * MIB, "total %zu MiB, want %s", tot / (size_t)MIB, argv[2]);
	printf("ok total-is %s\n", argv[2]);
	return 0;
}

/* ---- pacing ----------------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* bwd<us>'s second thread: the step's backward pass, launched on the thread that
 * PyTorch's autograd engine runs it on, while the step's own thread waits for it. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int go, done;
	unsigned us;
	CUcontext ctx;
} bwd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, NULL};

static void *bwd_thread(void *arg)
{
	(void)arg;
	if (cuCtxSetCurrent(bwd.ctx) != CUDA_SUCCESS)
		abort();
	for (;;) {
		pthread_mutex_lock(&bwd.mu);
		while (!bwd.go)
			pthread_cond_wait(&bwd.cv, &bwd.mu);
		bwd.go = 0;
		pthread_mutex_unlock(&bwd.mu);
		/* Twice the forward's long kernel, then 20 short ones, their own functions. */
		CUresult rc = cuLaunchKernel((CUfunction)(uintptr_t)0x7e8000, 2 * bwd.us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		for (unsigned k = 0; k < 20 && rc == CUDA_SUCCESS; k++)
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7e9000 + 0x40 * (k % 4)), 20, 1, 1, 1, 1, 1, 0, NULL, NULL,
					    NULL);
		if (rc != CUDA_SUCCESS)
			abort();
		pthread_mutex_lock(&bwd.mu);
		bwd.done = 1;
		pthread_cond_broadcast(&bwd.cv);
		pthread_mutex_unlock(&bwd.mu);
	}
	return NULL;
}

/* One bwd<us> step: the forward (20 kernels of 20 us and one of us), the backward on
 * the second thread, then a synchronize, as a step that reads its loss ends. */
static CUresult bwd_step(unsigned us)
{
	if (bwd.ctx == NULL) {
		pthread_t t;
		OK(cuCtxGetCurrent(&bwd.ctx));
		bwd.us = us;
		CHECK(pthread_create(&t, NULL, bwd_thread, NULL) == 0, "no thread for the backward pass");
		pthread_detach(t);
	}
	CUresult rc = CUDA_SUCCESS;
	for (unsigned k = 0; k < 20 && rc == CUDA_SUCCESS; k++)
		rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7e6000 + 0x40 * (k % 4)), 20, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	if (rc == CUDA_SUCCESS)
		rc = cuLaunchKernel((CUfunction)(uintptr_t)0x7e5000, us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&bwd.mu);
	bwd.done = 0;
	bwd.go = 1;
	pthread_cond_broadcast(&bwd.cv);
	while (!bwd.done)
		pthread_cond_wait(&bwd.cv, &bwd.mu);
	pthread_mutex_unlock(&bwd.mu);
	return cuCtxSynchronize();
}

/* Launches 200 us kernels back to back through one path for the given time and
 * returns the share of wall time the simulated GPU was busy. */
static double run_launches(const char *path, double seconds)
{
	CUresult (*k_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			   void **, void **) = NULL;
	if (strcmp(path, "kernel-ptsz") == 0)
		k_ptsz = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				      CUstream, void **, void **))procaddr("cuLaunchKernel",
									   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	CUlaunchConfig cfg = {.gridDimX = 200, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1};
	/* The deprecated multi-device launch, one entry: on a stream of the current
	 * context (multi), or of the container's second GPU's context while the first's is
	 * current (multi-other: the entry is paced on its stream's GPU, and the caller's
	 * context is current again after). */
	CUDA_LAUNCH_PARAMS mp = {.gridDimX = 200, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1};
	CUcontext mine = NULL;
	if (strncmp(path, "multi", 5) == 0) {
		OK(cuCtxGetCurrent(&mine));
		if (strcmp(path, "multi-other") == 0) {
			CUdevice d1;
			CUcontext c1;
			OK(cuDeviceGet(&d1, 1));
			OK(cuDevicePrimaryCtxRetain(&c1, d1));
			OK(cuCtxSetCurrent(c1));
		}
		OK(cuStreamCreate(&mp.hStream, 0));
		OK(cuCtxSetCurrent(mine));
	}
	uint64_t busy0 = stats().busy_ns;
	double t0 = now_s();
	while (now_s() - t0 < seconds) {
		CUresult rc;
		if (strcmp(path, "kernel") == 0)
			rc = cuLaunchKernel(NULL, 200, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else if (k_ptsz != NULL)
			rc = k_ptsz(NULL, 200, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else if (strcmp(path, "ex") == 0)
			rc = cuLaunchKernelEx(&cfg, NULL, NULL, NULL);
		else if (strcmp(path, "coop") == 0)
			rc = cuLaunchCooperativeKernel(NULL, 200, 1, 1, 1, 1, 1, 0, NULL, NULL);
		else if (strcmp(path, "graph") == 0)
			rc = cuGraphLaunch((CUgraphExec)(uintptr_t)200, NULL);
		else if (strcmp(path, "grid") == 0) /* the first driver API's launches */
			rc = cuLaunchGrid(NULL, 200, 1);
		else if (strcmp(path, "grid-async") == 0)
			rc = cuLaunchGridAsync(NULL, 200, 1, NULL);
		else if (mine != NULL) {
			rc = cuLaunchCooperativeKernelMultiDevice(&mp, 1, 0);
			CUcontext now = NULL;
			OK(cuCtxGetCurrent(&now));
			CHECK(now == mine, "the multi-device launch left another context current");
		} else if (strcmp(path, "small") == 0) /* 10 us kernels */
			rc = cuLaunchKernel(NULL, 10, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else if (strcmp(path, "long") == 0) /* 20 ms kernels: one period each */
			rc = cuLaunchKernel(NULL, 20000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else if (strcmp(path, "mixed") == 0) /* 20 us and 1 ms kernels, mixed at random */
			rc = cuLaunchKernel(NULL, rand() % 8 ? 20 : 1000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else if (strncmp(path, "hostmix", 7) == 0 && atoi(path + 7 + 2 * (path[7] == 'f')) > 0) {
			/* hostmix<us>: mixed after 64 launches of 20 us (the estimate settles on
			 * the short kernels), each launch followed by that many us of host work:
			 * a host that keeps about the GPU's pace, so the queue stays shallow and
			 * the GPU waits for the host now and then. hostmixfn<us>: the same of one
			 * function on one grid, whose length its block's size sets (the fake runs
			 * a block of more than one thread its size in us): a kernel whose work
			 * its data decides, one per-kernel entry for lengths of 20 us and 1 ms. */
			static unsigned i;
			int fn = path[7] == 'f';
			unsigned us = i++ < 64 || rand() % 8 ? 20 : 1000;
			rc = fn ? cuLaunchKernel((CUfunction)(uintptr_t)0x7c1000, 100, 1, 1, us, 1, 1, 0, NULL, NULL, NULL)
				: cuLaunchKernel(NULL, us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			for (double s0 = now_s(); now_s() - s0 < atoi(path + 7 + 2 * fn) * 1e-6;)
				;
		} else if (strcmp(path, "mixedfn") == 0) /* mixed, of one function: two grids */
			rc = cuLaunchKernel((CUfunction)(uintptr_t)0x7f8000, rand() % 8 ? 20 : 1000, 1, 1, 1, 1, 1, 0, NULL, NULL,
					    NULL);
		else if (strncmp(path, "dyn", 3) == 0) {
			/* dyn, dynsync: one function at a grid of 20-2000 us at random, nearly
			 * every launch another (dynamic shapes: more grids than the hook's
			 * per-kernel table holds); dynsync synchronizes every 40 launches. */
			static unsigned i;
			rc = cuLaunchKernel((CUfunction)(uintptr_t)0x7f9000, 20 + (unsigned)rand() % 1981, 1, 1, 1, 1, 1, 0, NULL,
					    NULL, NULL);
			if (strcmp(path, "dynsync") == 0 && i++ % 40 == 39 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "fresh", 5) == 0 && atoi(path + 5) > 1) {
			/* fresh<us>: 20 us kernels, and every eighth a kernel of that many us
			 * at a grid never launched before (the fake runs a block of more than
			 * one thread its block's size in us): each long kernel has no entry of
			 * its own when launched, and is charged its class's estimate. */
			static unsigned i;
			unsigned k = i++;
			rc = k % 8 == 7 ? cuLaunchKernel((CUfunction)(uintptr_t)0x7fa000, 100 + k / 8, 1, 1,
							 (unsigned)atoi(path + 5), 1, 1, 0, NULL, NULL, NULL)
					: cuLaunchKernel((CUfunction)(uintptr_t)0x7fb000, 20, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		} else if (strncmp(path, "rare", 4) == 0 && atoi(path + 4) > 0) {
			/* rare<us>: 20 us kernels and, every 100th launch, one of that many us, all
			 * of one handle-less function: few launch samples meet the long ones. */
			static unsigned i;
			rc = cuLaunchKernel(NULL, i++ % 100 == 99 ? (unsigned)atoi(path + 4) : 20, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		} else if (strcmp(path, "mixedsync") == 0) {
			/* mixed, with a synchronize every 40 launches, as a step that reads its
			 * loss ends. */
			static unsigned i;
			rc = cuLaunchKernel(NULL, rand() % 8 ? 20 : 1000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			if (i++ % 40 == 39 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		}
		else if (strncmp(path, "attn", 4) == 0 && atoi(path + 4) > 0) {
			/* attn<us>: an attention training step's shape, one kernel of that many us
			 * and 40 of 20 us, each length its own functions (the fake runs a launch
			 * gridDimX us whatever its function; the hook sees the handles only), then
			 * a synchronize, as a step that reads its loss ends. */
			static unsigned i;
			unsigned attn_long_us = (unsigned)atoi(path + 4);
			uintptr_t long_fn = 0x7e5000, short_fn = 0x7e6000 + 0x40 * (i % 4);
			rc = i % 41 == 0 ? cuLaunchKernel((CUfunction)long_fn, attn_long_us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)
					 : cuLaunchKernel((CUfunction)short_fn, 20, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			if (i++ % 41 == 40 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "slowhost", 8) == 0 && atoi(path + 8) > 0) {
			/* slowhost<us>: attn<us>'s step whose host issues the 40 short kernels
			 * slower than the GPU runs them (25 us of host work after each launch of
			 * a 20 us kernel: the GPU waits about 5 us each), then the long kernel,
			 * queued when the step synchronizes, as an attention training step's
			 * forward pass is host-bound and its backward's flash kernels are long:
			 * the step's bursts end with a deep queue yet hold idle gaps. */
			static unsigned i;
			unsigned long_us = (unsigned)atoi(path + 8);
			rc = i % 41 == 40 ? cuLaunchKernel((CUfunction)(uintptr_t)0x7eb000, long_us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL)
					  : cuLaunchKernel((CUfunction)(uintptr_t)(0x7ec000 + 0x40 * (i % 4)), 20, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			if (i % 41 != 40)
				for (double s0 = now_s(); now_s() - s0 < 25e-6;)
					;
			if (i++ % 41 == 40 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "decode", 6) == 0 && atoi(path + 6) > 0) {
			/* decode<us>: an LLM decode step's shape, kernels of that many us of four
			 * functions, the host busy twice as long after each of the first 32
			 * launches of every 40 (the GPU waits for it), the last 8 issued back to
			 * back (queued behind each other), then a synchronize: each function is
			 * launched mostly on an idle stream, sometimes queued. */
			static unsigned i;
			unsigned us = (unsigned)atoi(path + 6);
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7ed000 + 0x40 * (i % 4)), us, 1, 1, 1, 1, 1, 0, NULL,
					    NULL, NULL);
			if (i % 40 < 32)
				for (double s0 = now_s(); now_s() - s0 < 2e-6 * us;)
					;
			if (i++ % 40 == 39 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "bwd", 3) == 0 && atoi(path + 3) > 0) {
			rc = bwd_step((unsigned)atoi(path + 3));
		} else if (strncmp(path, "streams", 7) == 0 && atoi(path + 7) > 0) {
			/* streams<us>: kernels of that many us on two streams at once, each
			 * stream its own function, joined by a synchronize every 40 launches
			 * (the fake's FAKE_CUDA_STREAMS runs the two streams' kernels at once:
			 * the GPU is busy half their summed lengths). */
			static CUstream st[2];
			static unsigned i;
			if (st[0] == NULL) {
				OK(cuStreamCreate(&st[0], 0));
				OK(cuStreamCreate(&st[1], 0));
			}
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7e7000 + 0x40 * (i % 2)), (unsigned)atoi(path + 7), 1, 1,
					    1, 1, 1, 0, st[i % 2], NULL, NULL);
			if (i++ % 40 == 39 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "poll", 4) == 0 && atoi(path + 5) > 0 && (path[4] == 'e' || path[4] == 's')) {
			/* polle<us>, polls<us>: streams<us> whose program waits by polling, every
			 * 40 launches: an event recorded on each stream queried until both have
			 * run (polle, as TensorFlow's event manager waits), or each stream
			 * queried until it is idle (polls); 20 us of host work between polls. */
			static CUstream st[2];
			static CUevent ev[2];
			static unsigned i;
			if (st[0] == NULL) {
				for (int k = 0; k < 2; k++) {
					OK(cuStreamCreate(&st[k], 0));
					OK(cuEventCreate(&ev[k], 0));
				}
			}
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7e9000 + 0x40 * (i % 2)), (unsigned)atoi(path + 5), 1, 1,
					    1, 1, 1, 0, st[i % 2], NULL, NULL);
			if (i++ % 40 == 39 && rc == CUDA_SUCCESS) {
				for (int k = 0; k < 2 && rc == CUDA_SUCCESS; k++) {
					if (path[4] == 'e')
						rc = cuEventRecord(ev[k], st[k]);
					while (rc == CUDA_SUCCESS) {
						rc = path[4] == 'e' ? cuEventQuery(ev[k]) : cuStreamQuery(st[k]);
						if (rc != CUDA_ERROR_NOT_READY)
							break;
						rc = CUDA_SUCCESS;
						for (double s0 = now_s(); now_s() - s0 < 20e-6;)
							;
					}
				}
			}
		} else if (strncmp(path, "copy", 4) == 0 && atoi(path + 4) > 0) {
			/* copy<us>: streams<us> whose program reads a result back every 40
			 * launches with a synchronous copy (cuMemcpyDtoH on the legacy stream,
			 * which waits for both streams' work), as numba's copy_to_host and a C
			 * program's cudaMemcpy wait, not with a synchronize. */
			static CUstream st[2];
			static unsigned i;
			static float result;
			if (st[0] == NULL) {
				OK(cuStreamCreate(&st[0], 0));
				OK(cuStreamCreate(&st[1], 0));
			}
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7ea000 + 0x40 * (i % 2)), (unsigned)atoi(path + 4), 1, 1,
					    1, 1, 1, 0, st[i % 2], NULL, NULL);
			if (i++ % 40 == 39 && rc == CUDA_SUCCESS)
				rc = cuMemcpyDtoH_v2(&result, (CUdeviceptr)0x1000, sizeof result);
		} else if (strncmp(path, "cold", 4) == 0 && atoi(path + 4) > 0) {
			/* cold<n>: a launch-bound step of n functions of 5 us each, the host
			 * busy 20 us after each launch (the GPU about a fifth busy), as a small
			 * model's training step launches many kernels a few times each; with the
			 * fake's FAKE_CUDA_COLD_US each function's first launch runs long. */
			static unsigned i;
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7f0000 + 0x40 * (i++ % (unsigned)atoi(path + 4))), 5, 1, 1, 1,
					    1, 1, 0, NULL, NULL, NULL);
			for (double s0 = now_s(); now_s() - s0 < 20e-6;)
				;
		} else if (strncmp(path, "gmix", 4) == 0 && atoi(path + 4) > 0) {
			/* gmix<us>: a CUDA graph's replay of that many us, then six eager kernels
			 * of 5 us (three functions) on its output, each after 40 us of host work,
			 * and a synchronize, as a step that replays a captured forward pass and
			 * runs its loss, backward and update eagerly: its host paces it. */
			static unsigned i;
			unsigned k = i % 7;
			if (k == 0)
				rc = cuGraphLaunch((CUgraphExec)(uintptr_t)(unsigned)atoi(path + 4), NULL);
			else {
				for (double s0 = now_s(); now_s() - s0 < 40e-6;)
					;
				rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x7d0000 + 0x40 * (k % 3)), 5, 1, 1, 1, 1, 1, 0, NULL, NULL,
						    NULL);
			}
			if (i++ % 7 == 6 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "lb", 2) == 0 && atoi(path + 2) > 0) {
			/* lb<us>: a launch-bound loop, 32 kernels of that many us and a
			 * synchronize (B7's launch tenant: a small training step's shape). */
			static unsigned i;
			rc = cuLaunchKernel((CUfunction)(uintptr_t)0x7fc000, (unsigned)atoi(path + 2), 1, 1, 1, 1, 1, 0, NULL, NULL,
					    NULL);
			if (i++ % 32 == 31 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "model", 5) == 0 && atoi(path + 5) > 0) {
			/* model<n>: a large model's step, n kernels each its own function, in
			 * the same order every step, then a synchronize: every 16th a long one
			 * (500-1300 us, as attention's or a large matmul's), the others 5-40 us
			 * (elementwise, norms, small matmuls). More kernels than the hook's
			 * per-kernel table has room for without collisions. */
			static unsigned i;
			unsigned n = (unsigned)atoi(path + 5), k = i % n;
			unsigned us = k % 16 == 15 ? 500 + 200 * (k / 16 % 5) : 5 + (k * 7) % 36;
			rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x800000 + 0x40 * k), us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			if (i++ % n == n - 1 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (strncmp(path, "llm", 3) == 0 && atoi(path + 3) > 0) {
			/* llm<us>: an LLM's inference step, a prefill of 16 kernels of that
			 * many us (four functions, as its matmuls and attention), issued at once,
			 * then 32 decode steps of 12 kernels of 3-4 us (the same four functions
			 * at a small grid, and eight more), each after 17 us of host work (its
			 * host issues decode slower than the GPU runs it), and a synchronize:
			 * decode's launches queue behind the prefill, then the GPU waits for the
			 * host (about 77 % of the GPU alone with llm250). */
			static unsigned i;
			unsigned k = i % 400;
			if (k < 16)
				rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x810000 + 0x40 * (k % 4)), (unsigned)atoi(path + 3), 1,
						    1, 1, 1, 1, 0, NULL, NULL, NULL);
			else {
				unsigned d = (k - 16) % 12;
				rc = cuLaunchKernel((CUfunction)(uintptr_t)(0x810000 + 0x40 * d), d < 4 ? 4 : 3, 1, 1, 1, 1, 1, 0,
						    NULL, NULL, NULL);
				for (double s0 = now_s(); now_s() - s0 < 17e-6;)
					;
			}
			if (i++ % 400 == 399 && rc == CUDA_SUCCESS)
				rc = cuCtxSynchronize();
		} else if (path[0] == 'k' && atoi(path + 1) > 0) /* k<us>: kernels of that many us */
			rc = cuLaunchKernel(NULL, (unsigned)atoi(path + 1), 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		else
			CHECK(0, "unknown launch path %s", path);
		CHECK(rc == CUDA_SUCCESS, "launch gave %d", rc);
	}
	OK(cuCtxSynchronize());
	double wall = now_s() - t0;
	return (double)(stats().busy_ns - busy0) / 1e9 / wall * 100.0;
}

static int pace_main(int argc, char **argv)
{
	CHECK(argc >= 5 && argc <= 7, "usage: pace <path> <cores> <seconds> [<least share> [<most share>]]");
	int cores = atoi(argv[3]);
	setup();
	/* Past each function's first (cold) launch: what follows is what is judged. */
	if (strncmp(argv[2], "cold", 4) == 0)
		run_launches(argv[2], 0.3);
	double share = run_launches(argv[2], atof(argv[4]));
	printf("pace %s: cores %d, share %.1f%%\n", argv[2], cores, share);
	/* A paced graph launch's samples start behind a memset of the hook's own word
	 * (pace_measure.c, lead_make); a kernel launch's do not. */
	if (cores > 0 && cores < 100 && strcmp(argv[2], "graph") == 0) {
		uint64_t led = stats().memsets;
		CHECK(led > 0, "no graph launch sample was led in by a memset");
		/* Once the word is gone (a context reset frees it with the program's memory,
		 * and its address may be the program's next), it is never set again. */
		fake_cuda_free_all_fn free_all = (fake_cuda_free_all_fn)dlsym(libcuda(), "fake_cuda_free_all");
		CHECK(free_all != NULL, "fake_cuda_free_all not found");
		free_all();
		run_launches(argv[2], 0.2);
		CHECK(stats().memsets == led, "%llu memsets of a freed word", (unsigned long long)(stats().memsets - led));
	}
	if (strcmp(argv[2], "kernel") == 0)
		CHECK(stats().memsets == 0, "%llu memsets among kernel launches", (unsigned long long)stats().memsets);
	/* A _ptsz launch's stream 0 is the thread's own stream: pacing records nothing on
	 * the legacy one, which would wait for every blocking stream's work. */
	if (strcmp(argv[2], "kernel-ptsz") == 0)
		CHECK(stats().legacy_events == 0, "%llu events recorded on the legacy stream for launches on the per-thread one",
		      (unsigned long long)stats().legacy_events);
	/* A floor where the check is about a loss (run under "timed" on a busy machine). */
	if (argc >= 6)
		CHECK(share >= atof(argv[5]), "share %.1f%%, want at least %s%%", share, argv[5]);
	/* A ceiling tighter than the one below, where the check is about an overrun let go. */
	if (argc == 7)
		CHECK(share <= atof(argv[6]), "share %.1f%%, want at most %s%%", share, argv[6]);
	if (cores == 0 || cores == 100)
		CHECK(share > 90, "unpaced share %.1f%%", share);
	else
		/* The cap must hold however busy the machine is; how close pacing comes to it
		 * is measured on a GPU (make bench-gpu), since on a shared CI machine a
		 * descheduled launch thread idles the simulated GPU (with eight runnable
		 * threads per core it got 1% of 30%). The floor only catches pacing that lets
		 * nothing through. */
		CHECK(share <= cores + 8 && share > 0, "share %.1f%%, want at most %d%% + 8 and some", share, cores);
	return 0;
}

/* A saturating program alone gets its share of the GPU's time within <margin> points,
 * on both sides, once past its first samples: for programs whose kernels differ in
 * length by orders of magnitude (attn), whose long kernels a charge of the mean
 * launch under-bills. */
static int pace_near_main(int argc, char **argv)
{
	CHECK(argc == 6, "usage: pace-near <path> <cores> <seconds> <margin>");
	int cores = atoi(argv[3]);
	double margin = atof(argv[5]);
	setup();
	run_launches(argv[2], 0.3); /* past the estimate's first samples */
	uint64_t k0 = stats().kernel_ns;
	double t0 = now_s();
	double share = run_launches(argv[2], atof(argv[4]));
	double kernels = (double)(stats().kernel_ns - k0) / 1e9 / (now_s() - t0) * 100.0;
	printf("pace-near %s: cores %d, share %.1f%% (kernels %.1f%%)\n", argv[2], cores, share, kernels);
	CHECK(share <= cores + margin && share >= cores - margin, "share %.1f%%, want %d%% +- %.0f", share, cores, margin);
	return 0;
}

/* A saturating program beside other work on the GPU gets its share of the GPU's
 * time, not its share less the other's turns:
 *  - pace-turns: another context's turns (the fake's FAKE_CUDA_OTHER) run inside
 *    this one's bursts;
 *  - pace-share: one of two containers on the fake's time-sliced GPU
 *    (FAKE_CUDA_SHARED_GPU), both saturating; where their work meets, each one's
 *    bursts span the other's turns.
 * Billing those turns as its own took 30/70 to 25/65.5 here and 24.9/69.3 on an
 * H200. pace-share's floor is a point tighter: its other tenant is paced too. A launch
 * path (hooktest's run_launches) other than 200 us kernels may follow the seconds. */
static int pace_beside_main(int argc, char **argv)
{
	int turns = strcmp(argv[1], "pace-turns") == 0;
	CHECK(argc == 4 || argc == 5, "usage: %s <cores> <seconds> [<launch path>]", argv[1]);
	int cores = atoi(argv[2]), margin = turns ? 5 : 4;
	const char *what = turns ? "context" : "container", *path = argc == 5 ? argv[4] : "kernel";
	setup();
	run_launches(path, 0.3); /* past the estimate's first samples */
	double share = run_launches(path, atof(argv[3]));
	printf("%s: cores %d, share %.1f%% of %s beside another %s\n", argv[1], cores, share, path, what);
	CHECK(share >= cores - margin, "share %.1f%%, want at least %d%% - %d: billed the other %s's turns", share,
	      cores, margin, what);
	CHECK(share <= cores + 8, "share %.1f%%, want at most %d%% + 8", share, cores);
	return 0;
}

/* A tenant that takes a GPU's turn and never lets it go (it writes the turn file as
 * any tenant on the GPU can), saying every 10 ms that it holds it for the longest a
 * holder may (or for <ahead-seconds>: a file left from before a reboot says times
 * far ahead of the new boot's clock) and that it is a container of long kernels. The
 * paced containers beside it give up waiting and are time-sliced with it, or take a
 * word too far ahead for void (run.sh checks their shares). No CUDA. */
static int turn_hog_main(int argc, char **argv)
{
	CHECK(argc == 4 || argc == 5, "usage: turn-hog <turn-file> <seconds> [<ahead-seconds>]");
	int64_t ahead = argc == 5 ? (int64_t)(atof(argv[4]) * 1e9) : TESSERA_TURN_HOLD_MAX_NS;
	int fd = open(argv[2], O_RDWR);
	CHECK(fd >= 0, "open %s", argv[2]);
	struct tessera_turn *t = mmap(NULL, TESSERA_TURN_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(t != MAP_FAILED, "mmap %s", argv[2]);
	const uint64_t hog = 0x4855474855474801ULL;
	double t0 = now_s();
	do {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
		atomic_store(&t->owner, hog);
		atomic_store(&t->last_owner, hog);
		atomic_store(&t->taken_ns, now);
		atomic_store(&t->until_ns, now + ahead);
		atomic_store(&t->long_seen_ns, now);
		usleep(10000);
	} while (now_s() - t0 < atof(argv[3]));
	return 0;
}

/* A work-conserving container (its limits' work-conserving line) saturating alone
 * takes the idle GPU beyond its share; once another container has work on the GPU
 * (run.sh starts one after the alone window), it is held to its share again, and
 * takes the idle GPU again 2 s after the other has gone. */
static int pace_wc_main(int argc, char **argv)
{
	CHECK(argc >= 5 && argc <= 7, "usage: pace-wc <cores> <alone-seconds> <together-seconds> [<launch path> [<most together>]]");
	int cores = atoi(argv[2]);
	const char *path = argc >= 6 ? argv[5] : "kernel";
	/* Where the other containers are there for part of the second window only, the
	 * most this one may get in it is given. */
	double most = argc == 7 ? atof(argv[6]) : cores + 8;
	setup();
	run_launches(path, 0.3);
	double alone = run_launches(path, atof(argv[3]));
	double together = run_launches(path, atof(argv[4]));
	printf("pace-wc: cores %d, share %.1f%% alone, %.1f%% beside another container\n", cores, alone, together);
	CHECK(alone >= 80, "share %.1f%% alone, want at least 80%%: the idle GPU was not used", alone);
	CHECK(together <= most, "share %.1f%% beside another container, want at most %.0f%%: not held to its share", together, most);
	return 0;
}

/* Writes a GPU's share file as the node agent does: a new file renamed over the old. */
static void write_share(const char *path, const char *content)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	CHECK(f != NULL, "create %s", tmp);
	fputs(content, f);
	CHECK(fclose(f) == 0 && rename(tmp, path) == 0, "write %s", path);
}

/* A container granted no cores (its limits say cores 0) follows its GPU's share file
 * while it runs: not paced while nothing is reserved (share 100), held to 30 % once a
 * 70 % reservation comes, kept there when the file turns to garbage (the last share
 * read well), and not paced again once the reservation is gone. The scenario writes
 * the file itself, as the node agent would. */
static int pace_follow_main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: pace-follow <share-file>");
	const char *file = argv[2];
	const char *free_gpu = "version 1\nreserved 0\ncontainers 1\nshare 100\nphase 0\n";
	write_share(file, free_gpu);
	setup();
	run_launches("kernel", 0.3);
	double alone = run_launches("kernel", 1);
	write_share(file, "version 1\nreserved 70\ncontainers 1\nshare 30\nphase 70\n");
	run_launches("kernel", 0.3);
	double held = run_launches("kernel", 1.5);
	write_share(file, "version 1\nreserved 70\nshare 100\n");
	run_launches("kernel", 0.3);
	double garbage = run_launches("kernel", 1);
	write_share(file, free_gpu);
	run_launches("kernel", 0.3);
	double again = run_launches("kernel", 1);
	printf("pace-follow: %.1f%% with nothing reserved, %.1f%% beside 70%%, %.1f%% with a malformed file, %.1f%% with "
	       "nothing reserved again\n",
	       alone, held, garbage, again);
	CHECK(alone > 90, "share %.1f%% with nothing reserved, want more than 90%%: paced", alone);
	CHECK(held <= 38 && held >= 20, "share %.1f%% beside a 70%% reservation, want 30%% (20..38)", held);
	CHECK(garbage <= 38, "share %.1f%% with a malformed file, want the last good 30%% (at most 38)", garbage);
	CHECK(again > 90, "share %.1f%% once the reservation left, want more than 90%%: still paced", again);
	return 0;
}

/* B4's phases (gpu/b4-classes.sh, B4_PARTS=phases) on the fake driver: a container
 * granted no cores whose share file the bench moves between <cap> and 100, four rounds
 * of a capped and an unpaced phase of 0.5 s each after 0.15 s to settle, in the order
 * capped, unpaced, unpaced, capped: the capped phases get the cap, the unpaced ones
 * more, each phase from its start (the bench judges a workload's capped phases
 * against its unpaced ones in the same process). */
static int pace_phases_main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: pace-phases <share-file> <path> <cap>");
	const char *file = argv[2], *path = argv[3];
	int cap = atoi(argv[4]);
	char capped[256];
	snprintf(capped, sizeof(capped), "version 1\nreserved %d\ncontainers 1\nshare %d\nphase 0\n", 100 - cap, cap);
	const char *free_gpu = "version 1\nreserved 0\ncontainers 1\nshare 100\nphase 0\n";
	write_share(file, capped);
	setup();
	run_launches(path, 0.3);
	double sum[2] = {0, 0}, lo = 100, hi = 0;
	for (int r = 0; r < 4; r++)
		for (int j = 0; j < 2; j++) {
			int unpaced = (r + j) % 2;
			write_share(file, unpaced ? free_gpu : capped);
			run_launches(path, 0.15);
			double v = run_launches(path, 0.5);
			sum[unpaced] += v / 4;
			if (!unpaced && v < lo)
				lo = v;
			if (!unpaced && v > hi)
				hi = v;
		}
	write_share(file, free_gpu);
	printf("pace-phases %s: cap %d: capped %.1f%% (phases %.1f-%.1f), unpaced %.1f%%\n", path, cap, sum[0], lo, hi, sum[1]);
	CHECK(sum[0] >= cap - 3 && sum[0] <= cap + 3, "capped phases %.1f%%, want %d%% +- 3", sum[0], cap);
	CHECK(lo >= cap - 6 && hi <= cap + 6, "a capped phase at %.1f-%.1f%%, want each within %d%% +- 6", lo, hi, cap);
	CHECK(sum[1] >= cap + 10, "unpaced phases %.1f%%, want well over the cap (%d%% + 10): still paced", sum[1], cap);
	return 0;
}

/* A program that launches, then leaves its stream idle for a while (asleep, waiting
 * for a request, for a start time) and then saturates the GPU gets its share from the
 * start: the burst its first launch opened spans the pause, in which the GPU idled,
 * and must not be billed as GPU time (it was, once: the burst ended with its queue
 * full, which read as back to back, and the program owed a second, the most a burst
 * may owe, and then waited for it). */
static int pace_pause_main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: pace-pause <cores> <pause-seconds> <seconds>");
	int cores = atoi(argv[2]);
	setup();
	OK(cuLaunchKernel(NULL, 200, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	OK(cuCtxSynchronize());
	double pause = atof(argv[3]);
	struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
	nanosleep(&ts, NULL);
	double share = run_launches("kernel", atof(argv[4]));
	printf("pace-pause: cores %d, share %.1f%% right after a %.1f s pause\n", cores, share, pause);
	CHECK(share >= cores - 5, "share %.1f%%, want at least %d%% - 5: the pause was billed", share, cores);
	CHECK(share <= cores + 8, "share %.1f%%, want at most %d%% + 8", share, cores);
	return 0;
}

/* A program that needs less GPU time than its share is not slowed: 100 us kernels
 * with 400 us of host work between them need 20% of the GPU. Under a cap of 50% it
 * must run at the rate its host work allows; under a cap below 20% it is held, and
 * must still get its cap. The host work spins on the clock, so a
 * descheduled thread slows it alike with or without pacing; the bound still tells a
 * pacer that holds it to its share's wall time (half the rate) apart. */
static int light_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: light <cores> <seconds>");
	int cores = atoi(argv[2]);
	double seconds = atof(argv[3]);
	setup();
	double t0 = now_s(), spun = 0;
	long n = 0;
	uint64_t busy0 = stats().busy_ns;
	while (now_s() - t0 < seconds) {
		OK(cuLaunchKernel(NULL, 100, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		double s0 = now_s();
		while (now_s() - s0 < 400e-6)
			;
		spun += now_s() - s0;
		n++;
	}
	OK(cuCtxSynchronize());
	double wall = now_s() - t0;
	double share = (double)(stats().busy_ns - busy0) / 1e9 / wall * 100.0;
	/* The rate against what the spinning alone allows. */
	double rate = spun / wall * 100.0;
	printf("light: cores %d, %ld launches, GPU %.1f%%, host work %.1f%% of the time\n", cores, n, share, rate);
	if (cores >= 25)
		CHECK(rate >= 80, "the host work got %.1f%% of the time, want at least 80%%: held under its share", rate);
	else
		/* Held at its cap, it still gets its cap: the wall time its bursts span
		 * (mostly its own host work) is not owed as GPU time. Charging it took the
		 * program to 4-12% at cap 15 on a loaded machine. */
		CHECK(share >= cores - 5, "share %.1f%%, want at least %d%% - 5: held below its cap", share, cores);
	CHECK(share <= cores + 8, "share %.1f%%, want at most %d%% + 8", share, cores);
	return 0;
}

/* A program whose work changes from long kernels to short ones (a warm-up or a batch
 * job of large matmuls, then small requests or a launch-bound training loop) is not
 * slowed once it needs less than its share: its launches were charged the long
 * kernels' estimate until the estimate followed them down. Phase 1 saturates with
 * 2 ms kernels; phase 2 runs steps of 20 kernels of 3 us, a synchronize and 500 us of
 * host work, which need about 10% of the GPU. */
static int pace_shift_main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: pace-shift <cores> <seconds>");
	int cores = atoi(argv[2]);
	double seconds = atof(argv[3]);
	setup();
	run_launches("k2000", seconds);
	/* A step's launches and synchronize take about 100 us in the fake driver; one
	 * that took 4 ms waited for a refill (up to 20 ms; a thread descheduled on a
	 * loaded machine is out for less, mostly). What the long kernels' estimate holds
	 * is held right after them: the first 400 ms are checked (the estimate coming
	 * down by a quarter a burst held 240-270 ms of them, restarted 60-80). Later
	 * holds, spread over the window, are a loaded machine's (a sanitizer build beside
	 * other work held 236-371 ms of 1.5 s, nearly all after the first 400 ms). */
	double t0 = now_s(), held = 0, held_early = 0, last_held = 0;
	long n = 0;
	while (now_s() - t0 < seconds) {
		double l0 = now_s();
		for (int i = 0; i < 20; i++)
			OK(cuLaunchKernel(NULL, 3, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
		OK(cuCtxSynchronize());
		double s0 = now_s();
		if (s0 - l0 > 4e-3) {
			held += s0 - l0;
			last_held = s0 - t0;
			if (s0 - t0 <= 0.4)
				held_early += s0 - l0;
		}
		while (now_s() - s0 < 500e-6)
			;
		n++;
	}
	double wall = now_s() - t0;
	printf("pace-shift: cores %d, %ld steps after the long kernels, %.0f ms of %.0f held (%.0f in the first 400), the last %.0f ms in\n",
	       cores, n, held * 1e3, wall * 1e3, held_early * 1e3, last_held * 1e3);
	CHECK(held_early <= 0.15, "held %.0f ms of the first 400, want at most 150: the long kernels' estimate held the short ones",
	      held_early * 1e3);
	return 0;
}

/* Processes of one container share its compute share: children forked from here
 * launch at the same time, each on its own simulated queue (the fake's queue is per
 * process, so their work overlaps as on a GPU under MPS), and together they get the
 * container's share, not one each. Pacing each process on its own gives each the full
 * share here (measured 70-84% together at 50%). */
static int pace_procs_main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: pace-procs <procs> <cores> <seconds>");
	int n = atoi(argv[2]), cores = atoi(argv[3]);
	double seconds = atof(argv[4]);
	CHECK(n >= 1 && n <= 16, "procs %d", n);
	int fds[2];
	CHECK(pipe(fds) == 0, "pipe");
	pid_t pids[16];
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0, "fork");
		if (pids[i] == 0) {
			scenario = "pace-procs (child)";
			setup();
			double share = run_launches("kernel", seconds);
			CHECK(write(fds[1], &share, sizeof(share)) == (ssize_t)sizeof(share), "write");
			_exit(0);
		}
	}
	close(fds[1]);
	double total = 0, share;
	char each[256] = "";
	for (int i = 0; i < n; i++) {
		int st;
		CHECK(waitpid(pids[i], &st, 0) == pids[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed", i);
	}
	for (int i = 0; i < n; i++) {
		CHECK(read(fds[0], &share, sizeof(share)) == (ssize_t)sizeof(share), "child %d sent no share", i);
		total += share;
		snprintf(each + strlen(each), sizeof(each) - strlen(each), "%s%.1f%%", i ? " + " : "", share);
	}
	printf("pace-procs: %d processes, cores %d, shares %s = %.1f%%\n", n, cores, each, total);
	/* Wider than pace's bound: two launching processes on a 2-core CI machine are
	 * descheduled more, a window one closes late the other has already used, and each
	 * process of the fake driver has a simulated GPU of its own, so one's drain does
	 * not see the other's queue (measured 46-69% here). Windows of their own would give
	 * each its 50%, about 100% together: the bound still tells the two apart. */
	CHECK(total <= cores + 25 && total > 0, "together %.1f%%, want at most %d%% + 25 and some", total, cores);
	return 0;
}

static int capture_main(void)
{
	setup();
	double t0 = now_s();
	OK(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
	for (int i = 0; i < 20000; i++)
		OK(cuLaunchKernel(NULL, 200, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	CUgraph g;
	OK(cuStreamEndCapture(NULL, &g));
	double captured = now_s() - t0;
	struct fake_cuda_stats s = stats();
	CHECK(s.bad_syncs == 0, "the hook synchronized %llu times during a capture", (unsigned long long)s.bad_syncs);
	CHECK(captured < 0.5, "capturing 20000 launches took %.2f s: paced as if they ran", captured);
	/* After the capture, launches are paced again. */
	double share = run_launches("kernel", 0.5);
	CHECK(share < 50, "share %.1f%% after the capture, want about 30%%", share);
	printf("ok capture (%.3f s, then share %.1f%%)\n", captured, share);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: hooktest <scenario> ...\n");
		return 2;
	}
	scenario = argv[1];
	if (strcmp(scenario, "alloc") == 0)
		return alloc_main(argc, argv);
	if (strcmp(scenario, "meminfo") == 0)
		return meminfo_main(argc, argv);
	if (strcmp(scenario, "poolcache") == 0)
		return poolcache_main(argc, argv);
	if (strcmp(scenario, "devices") == 0)
		return devices_main();
	if (strcmp(scenario, "visible") == 0 && argc == 3)
		return visible_main(argv[2]);
	if (strcmp(scenario, "procaddr") == 0)
		return procaddr_main();
	if (strcmp(scenario, "lookup") == 0)
		return lookup_main(argc, argv);
	if (strcmp(scenario, "try") == 0)
		return try_main(argc, argv);
	if (strcmp(scenario, "hold") == 0)
		return hold_main(argc, argv);
	if (strcmp(scenario, "fork") == 0)
		return fork_main(argc, argv);
	if (strcmp(scenario, "orphan") == 0)
		return orphan_main(argc, argv);
	if (strcmp(scenario, "damaged") == 0)
		return damaged_main(argc, argv);
	if (strcmp(scenario, "damaged-new") == 0)
		return damaged_new_main();
	if (strcmp(scenario, "contexts") == 0)
		return contexts_main(argc, argv);
	if (strcmp(scenario, "teardown") == 0)
		return teardown_main(argc, argv);
	if (strcmp(scenario, "v1abi") == 0)
		return v1abi_main(argc, argv);
	if (strcmp(scenario, "modules") == 0)
		return modules_main(argc, argv);
	if (strcmp(scenario, "devlimits") == 0)
		return devlimits_main(argc, argv);
	if (strcmp(scenario, "threads") == 0)
		return threads_main(argc, argv);
	if (strcmp(scenario, "refused") == 0)
		return refused_main(argc, argv);
	if (strcmp(scenario, "mps") == 0)
		return mps_main(argc, argv);
	if (strcmp(scenario, "total-is") == 0)
		return total_is_main(argc, argv);
	if (strcmp(scenario, "pace") == 0)
		return pace_main(argc, argv);
	if (strcmp(scenario, "pace-near") == 0)
		return pace_near_main(argc, argv);
	if (strcmp(scenario, "pace-procs") == 0)
		return pace_procs_main(argc, argv);
	if (strcmp(scenario, "light") == 0)
		return light_main(argc, argv);
	if (strcmp(scenario, "pace-shift") == 0)
		return pace_shift_main(argc, argv);
	if (strcmp(scenario, "pace-turns") == 0 || strcmp(scenario, "pace-share") == 0)
		return pace_beside_main(argc, argv);
	if (strcmp(scenario, "turn-hog") == 0)
		return turn_hog_main(argc, argv);
	if (strcmp(scenario, "pace-pause") == 0)
		return pace_pause_main(argc, argv);
	if (strcmp(scenario, "pace-wc") == 0)
		return pace_wc_main(argc, argv);
	if (strcmp(scenario, "pace-follow") == 0)
		return pace_follow_main(argc, argv);
	if (strcmp(scenario, "pace-phases") == 0)
		return pace_phases_main(argc, argv);
	if (strcmp(scenario, "graphmem") == 0)
		return graphmem_main(argc, argv);
	if (strcmp(scenario, "capture") == 0)
		return capture_main();
	fprintf(stderr, "unknown scenario %s\n", scenario);
	return 2;
}

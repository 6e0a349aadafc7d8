/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a context takes on the GPU outside any allocation call, charged against the
 * container's limit (docs/cuda-hook.md, "Context overhead, device limits and module
 * globals"):
 *
 *   - every context: context-mib for each cuCtxCreate and green context, for as long
 *     as it lives; the primary context once per GPU while it is retained;
 *   - device limits (cuCtxSetLimit): what the malloc heap, the printf FIFO and the
 *     stack (per thread, times every thread the GPU can hold) are raised above the
 *     value the context had when the hook first saw the limit changed;
 *   - modules (cuModuleLoad*, cuLibraryLoad*): what the driver's free memory dropped
 *     by across the load on the current context's GPU; a load that does not fit is
 *     undone and refused.
 *
 * Creation past the limit fails with CUDA_ERROR_OUT_OF_MEMORY before the driver is
 * asked. Destroying a context or unloading a module gives its charge back.
 *
 * A context's teardown frees what was made in it: destroying a created context, the
 * primary context's last release and its reset (cuDevicePrimaryCtxReset_v2, what
 * cudaDeviceReset calls) give back its allocations (memory.c), its modules and, for
 * a reset, its raised limits (the context keeps its own charge while retained).
 */
#define _GNU_SOURCE
#include <string.h>

#include "devices.h"
#include "fork.h"
#include "interpose.h"
#include "log.h"
#include "memory.h"
#include "mps.h"
#include "pacing.h"
#include "state.h"

#define NLIMITS 3 /* CU_LIMIT_STACK_SIZE, _PRINTF_FIFO_SIZE, _MALLOC_HEAP_SIZE */

/* A context this process created or retained. */
struct ctx {
	void *handle; /* CUcontext or CUgreenCtx; NULL: free entry */
	int gpu;
	int primary;
	int green;
	size_t base[NLIMITS];     /* each limit's value when first changed through the hook */
	int base_known[NLIMITS];
	uint64_t charged[NLIMITS]; /* bytes charged for raising it */
};

/* A loaded module or library and what its load was charged. */
struct mod {
	void *handle; /* NULL: free entry */
	void *ctx;    /* a module's context, unloaded with it; NULL: a library (every context's) */
	int gpu;
	uint64_t bytes;
};

/* Enough for any program; past it a creation or load is refused rather than left
 * uncounted. */
#define MAX_CTX 1024
#define MAX_MOD 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER; /* one measured load at a time */
static struct ctx ctxs[MAX_CTX];
static struct mod mods[MAX_MOD];
static int primary_refs[TESSERA_MAX_GPUS];

static void after_fork(void)
{
	/* A child starts with no contexts or modules of its own. */
	pthread_mutex_init(&mu, NULL);
	pthread_mutex_init(&load_mu, NULL);
	memset(ctxs, 0, sizeof(ctxs));
	memset(mods, 0, sizeof(mods));
	memset(primary_refs, 0, sizeof(primary_refs));
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_CONTEXT, after_fork);
}

static CUresult charge(int gpu, uint64_t bytes, const char *what)
{
	CUresult rc = tessera_reserve(gpu, bytes);
	if (rc != CUDA_SUCCESS)
		tessera_log(TESSERA_LOG_WARN, "no room for %s (%llu MiB) on GPU %s within its %llu MiB limit", what,
			    (unsigned long long)((bytes + MIB - 1) / MIB), tessera.limits.gpus[gpu].uuid,
			    (unsigned long long)tessera.limits.gpus[gpu].memory_mib);
	return rc;
}

static void uncharge(int gpu, uint64_t bytes)
{
	if (bytes > 0)
		tessera_region_release(tessera.region, gpu, bytes);
}

static uint64_t context_bytes(void)
{
	return tessera.limits.context_mib * MIB;
}

/* Finds the entry of handle, or a free one when handle is NULL. Caller holds mu. */
static struct ctx *ctx_find(const void *handle)
{
	for (int i = 0; i < MAX_CTX; i++)
		if (ctxs[i].handle == handle)
			return &ctxs[i];
	return NULL;
}

/* Everything a context's entry holds, given back and the entry freed. Caller holds mu. */
static void ctx_drop(struct ctx *c)
{
	uint64_t bytes = c->primary ? 0 : context_bytes();
	for (int l = 0; l < NLIMITS; l++)
		bytes += c->charged[l];
	int gpu = c->gpu;
	memset(c, 0, sizeof(*c));
	uncharge(gpu, bytes);
}

/* Gives back the modules loaded in ctx, which its teardown unloaded. Caller holds mu. */
static void mods_drop_ctx(const void *ctx)
{
	for (int i = 0; ctx != NULL && i < MAX_MOD; i++)
		if (mods[i].handle != NULL && mods[i].ctx == ctx) {
			uncharge(mods[i].gpu, mods[i].bytes);
			memset(&mods[i], 0, sizeof(mods[i]));
		}
}

/* After a teardown of ctx that the driver has done (caller holds mu and the memory
 * map's lock across the driver's call): its allocations and modules given back, its
 * managed memory too where the teardown is a reset (memory.c, cuMemAllocManaged). */
static void torn_down(void *ctx, int gpu, const char *what, int reset)
{
	uint64_t bytes = tessera_memory_forget_ctx_locked((CUcontext)ctx, reset);
	mods_drop_ctx(ctx);
	if (bytes > 0)
		tessera_log(TESSERA_LOG_INFO, "%s on GPU %s freed %llu MiB of allocations made in it: given back", what,
			    tessera.limits.gpus[gpu].uuid, (unsigned long long)((bytes + MIB - 1) / MIB));
}

static CUresult device_gpu(CUdevice dev, int *gpu)
{
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	*gpu = tessera_gpu_of_device(dev);
	return *gpu < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

/* ---- created contexts: charged each ---------------------------------------- */

/* Charges a new context on dev and takes an entry for it; *slot is the entry. */
static CUresult created_admit(CUdevice dev, int *gpu, struct ctx **slot)
{
	tessera_mps_env();
	CUresult rc = device_gpu(dev, gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&mu);
	*slot = ctx_find(NULL);
	if (*slot == NULL) {
		pthread_mutex_unlock(&mu);
		tessera_log(TESSERA_LOG_ERROR, "more than %d contexts in one process: refused", MAX_CTX);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	(*slot)->handle = (void *)slot; /* reserved until the driver answers */
	(*slot)->gpu = *gpu;
	pthread_mutex_unlock(&mu);
	if ((rc = charge(*gpu, context_bytes(), "a context")) != CUDA_SUCCESS) {
		pthread_mutex_lock(&mu);
		memset(*slot, 0, sizeof(**slot));
		pthread_mutex_unlock(&mu);
	}
	return rc;
}

static CUresult created_settle(struct ctx *slot, int gpu, CUresult rc, void *handle, int green)
{
	pthread_mutex_lock(&mu);
	if (rc == CUDA_SUCCESS && handle != NULL) {
		slot->handle = handle;
		slot->green = green;
	} else {
		memset(slot, 0, sizeof(*slot));
		uncharge(gpu, context_bytes());
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

#define CREATE_HOOK(name, dev, out, call, green)                                    \
	HOOK_ENTER();                                                               \
	HOOK_REAL(name);                                                            \
	int gpu;                                                                    \
	struct ctx *slot;                                                           \
	CUresult rc = created_admit(dev, &gpu, &slot);                              \
	if (rc != CUDA_SUCCESS)                                                     \
		return rc;                                                          \
	rc = call;                                                                  \
	return created_settle(slot, gpu, rc, rc == CUDA_SUCCESS && (out) ? (void *)*(out) : NULL, green)

/* An MPS client's execution affinity is held to its share of the SMs (mps.c). */
#define MAX_AFFINITY 8

/* A context without execution affinity: the MPS client's own share of the SMs. */
static CUresult create_plain(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	if (REAL(cuCtxCreate_v4) != NULL)
		return REAL(cuCtxCreate_v4)(pctx, NULL, flags, dev);
	return REAL(cuCtxCreate_v2) != NULL ? REAL(cuCtxCreate_v2)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
}

static CUresult create_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
	if (params == NULL || params->execAffinityParams == NULL || params->numExecAffinityParams <= 0)
		return REAL(cuCtxCreate_v4)(pctx, params, flags, dev);
	CUexecAffinityParam copy[MAX_AFFINITY];
	CUctxCreateParams p = *params;
	CUresult rc = tessera_mps_affinity(dev, params->execAffinityParams, params->numExecAffinityParams, copy,
					   MAX_AFFINITY, &p.execAffinityParams);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = REAL(cuCtxCreate_v4)(pctx, &p, flags, dev);
	if (rc == CUDA_SUCCESS && tessera_mps_too_wide(dev, *pctx))
		rc = create_plain(pctx, flags, dev);
	return rc;
}

static CUresult create_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev)
{
	CUexecAffinityParam copy[MAX_AFFINITY], *use;
	CUresult rc = tessera_mps_affinity(dev, params, n, copy, MAX_AFFINITY, &use);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = REAL(cuCtxCreate_v3)(pctx, use, n, flags, dev);
	if (rc == CUDA_SUCCESS && params != NULL && n > 0 && tessera_mps_too_wide(dev, *pctx))
		rc = create_plain(pctx, flags, dev);
	return rc;
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
	CREATE_HOOK(cuCtxCreate_v4, dev, pctx, create_v4(pctx, params, flags, dev), 0);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev)
{
	CREATE_HOOK(cuCtxCreate_v3, dev, pctx, create_v3(pctx, paramsArray, numParams, flags, dev), 0);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CREATE_HOOK(cuCtxCreate_v2, dev, pctx, REAL(cuCtxCreate_v2)(pctx, flags, dev), 0);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CREATE_HOOK(cuCtxCreate, dev, pctx, REAL(cuCtxCreate)(pctx, flags, dev), 0);
}

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
	CREATE_HOOK(cuGreenCtxCreate, dev, phCtx, REAL(cuGreenCtxCreate)(phCtx, desc, dev, flags), 1);
}

static CUresult destroyed(void *handle, CUresult rc)
{
	if (rc != CUDA_SUCCESS || handle == NULL)
		return rc;
	tessera_pacing_forget_ctx((CUcontext)handle);
	pthread_mutex_lock(&mu);
	struct ctx *c = ctx_find(handle);
	if (c != NULL && !c->primary)
		ctx_drop(c);
	pthread_mutex_unlock(&mu);
	return rc;
}

/* A created context destroyed through call: what was made in it given back. */
static CUresult ctx_destroy(CUcontext ctx, CUresult (*call)(CUcontext))
{
	pthread_mutex_lock(&mu);
	struct ctx *c = ctx != NULL ? ctx_find(ctx) : NULL;
	int gpu = c != NULL ? c->gpu : -1;
	tessera_memory_lock();
	CUresult rc = call(ctx);
	if (rc == CUDA_SUCCESS && gpu >= 0 && !c->primary)
		torn_down(ctx, gpu, "a destroyed context", 0);
	tessera_memory_unlock();
	pthread_mutex_unlock(&mu);
	return destroyed(ctx, rc);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	HOOK_ENTER();
	HOOK_REAL(cuCtxDestroy_v2);
	return ctx_destroy(ctx, REAL(cuCtxDestroy_v2));
}

CUresult cuCtxDestroy(CUcontext ctx)
{
	HOOK_ENTER();
	HOOK_REAL(cuCtxDestroy);
	return ctx_destroy(ctx, REAL(cuCtxDestroy));
}

CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
	HOOK_ENTER();
	HOOK_REAL(cuGreenCtxDestroy);
	return destroyed(hCtx, REAL(cuGreenCtxDestroy)(hCtx));
}

/* ---- the primary context: charged once per GPU while retained --------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	HOOK_ENTER();
	HOOK_REAL(cuDevicePrimaryCtxRetain);
	tessera_mps_env();
	int gpu;
	CUresult rc = device_gpu(dev, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&mu);
	int first = primary_refs[gpu] == 0;
	if (first && (rc = charge(gpu, context_bytes(), "the primary context")) != CUDA_SUCCESS) {
		pthread_mutex_unlock(&mu);
		return rc;
	}
	rc = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
	if (rc == CUDA_SUCCESS) {
		primary_refs[gpu]++;
		if (ctx_find(*pctx) == NULL) {
			struct ctx *c = ctx_find(NULL);
			if (c != NULL) /* else its limits are refused, never uncounted */
				*c = (struct ctx){.handle = *pctx, .gpu = gpu, .primary = 1};
		}
	} else if (first) {
		uncharge(gpu, context_bytes());
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* The entry of gpu's primary context, or NULL (caller holds mu). */
static struct ctx *primary_of(int gpu)
{
	for (int i = 0; i < MAX_CTX; i++)
		if (ctxs[i].handle != NULL && ctxs[i].primary && ctxs[i].gpu == gpu)
			return &ctxs[i];
	return NULL;
}

/* The primary context's release (reset 0) or reset (reset 1) through the driver's
 * call: the driver destroys the context with its last release, and a reset destroys
 * every allocation and all state of it, the context still retained (its charge
 * kept) and its limits back at the driver's defaults. What went with it is given
 * back. */
static CUresult primary_teardown(CUdevice dev, CUresult (*call)(CUdevice), int reset)
{
	int gpu;
	CUresult rc = device_gpu(dev, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&mu);
	tessera_memory_lock();
	rc = call(dev);
	struct ctx *c = rc == CUDA_SUCCESS ? primary_of(gpu) : NULL;
	void *gone = NULL;
	if (reset && c != NULL) {
		gone = c->handle;
		torn_down(gone, gpu, "cuDevicePrimaryCtxReset", 1);
		for (int l = 0; l < NLIMITS; l++) {
			uncharge(gpu, c->charged[l]);
			c->charged[l] = 0;
			c->base_known[l] = 0;
		}
	} else if (!reset && rc == CUDA_SUCCESS && primary_refs[gpu] > 0 && --primary_refs[gpu] == 0) {
		if (c != NULL) {
			gone = c->handle;
			torn_down(gone, gpu, "the primary context's last release", 0);
			ctx_drop(c);
		}
		uncharge(gpu, context_bytes());
	}
	tessera_memory_unlock();
	pthread_mutex_unlock(&mu);
	/* Pools (stream-ordered, graph memory) counted at what the driver says they still
	 * reserve. */
	if (reset && rc == CUDA_SUCCESS)
		tessera_memory_settle(gpu);
	/* Its events and streams are gone: pacing starts the context afresh. */
	if (gone != NULL)
		tessera_pacing_forget_ctx((CUcontext)gone);
	return rc;
}

/* The primary context's release (reset 0) or reset (reset 1) through name. */
#define PRIMARY_HOOK(name, reset)                                      \
	CUresult name(CUdevice dev)                                    \
	{                                                              \
		HOOK_ENTER();                                          \
		HOOK_REAL(name);                                       \
		return primary_teardown(dev, REAL(name), reset);       \
	}

PRIMARY_HOOK(cuDevicePrimaryCtxRelease_v2, 0)
PRIMARY_HOOK(cuDevicePrimaryCtxReset_v2, 1) /* cudaDeviceReset's call */
PRIMARY_HOOK(cuDevicePrimaryCtxRelease, 0)  /* before CUDA 11.0 */
PRIMARY_HOOK(cuDevicePrimaryCtxReset, 1)

/* ---- device limits ----------------------------------------------------------- */

/* Device memory a limit's value takes on gpu: the stack is per thread, for every
 * thread the GPU can hold at once. 0 when it cannot be known (caller refuses). */
static uint64_t limit_bytes(CUlimit limit, size_t value, int gpu, int *ok)
{
	*ok = 1;
	if (limit != CU_LIMIT_STACK_SIZE)
		return value;
	int sms = 0, threads = 0;
	CUdevice dev = tessera.real_dev[gpu];
	if (REAL(cuDeviceGetAttribute) == NULL ||
	    REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
	    REAL(cuDeviceGetAttribute)(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
	    sms <= 0 || threads <= 0) {
		*ok = 0;
		return 0;
	}
	uint64_t per = (uint64_t)sms * (uint64_t)threads;
	return value > UINT64_MAX / per ? UINT64_MAX : (uint64_t)value * per;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	HOOK_ENTER();
	HOOK_REAL(cuCtxSetLimit);
	if (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_PRINTF_FIFO_SIZE && limit != CU_LIMIT_MALLOC_HEAP_SIZE)
		return REAL(cuCtxSetLimit)(limit, value);
	CUcontext cur = NULL;
	int gpu;
	CUresult rc = tessera_current_gpu(&gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (REAL(cuCtxGetCurrent) == NULL || REAL(cuCtxGetLimit) == NULL ||
	    (rc = REAL(cuCtxGetCurrent)(&cur)) != CUDA_SUCCESS)
		return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	struct ctx *c = ctx_find(cur);
	if (c == NULL || cur == NULL) {
		pthread_mutex_unlock(&mu);
		tessera_log(TESSERA_LOG_WARN, "cuCtxSetLimit on a context the hook does not know: refused");
		return CUDA_ERROR_NOT_PERMITTED;
	}
	if (!c->base_known[limit]) {
		size_t v = 0;
		if ((rc = REAL(cuCtxGetLimit)(&v, limit)) != CUDA_SUCCESS) {
			pthread_mutex_unlock(&mu);
			return rc;
		}
		c->base[limit] = v;
		c->base_known[limit] = 1;
	}
	int ok1, ok2;
	uint64_t want = limit_bytes(limit, value, gpu, &ok1), base = limit_bytes(limit, c->base[limit], gpu, &ok2);
	if (!ok1 || !ok2) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_NOT_PERMITTED;
	}
	uint64_t need = want > base ? want - base : 0, had = c->charged[limit];
	if (need > had && (rc = charge(gpu, need - had, "a raised device limit")) != CUDA_SUCCESS) {
		pthread_mutex_unlock(&mu);
		return rc;
	}
	rc = REAL(cuCtxSetLimit)(limit, value);
	if (rc != CUDA_SUCCESS) {
		if (need > had)
			uncharge(gpu, need - had);
	} else {
		if (need < had)
			uncharge(gpu, had - need);
		c->charged[limit] = need;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* ---- modules and libraries: what the load took ------------------------------- */

/* The driver's free memory on the current context's GPU; -1 without a context. */
static int driver_free(int *gpu, size_t *fr)
{
	size_t total;
	if (tessera_current_gpu(gpu) != CUDA_SUCCESS || REAL(cuMemGetInfo_v2) == NULL ||
	    REAL(cuMemGetInfo_v2)(fr, &total) != CUDA_SUCCESS)
		return -1;
	return 0;
}

/* After a load (caller holds load_mu): charges what the driver's free memory dropped
 * by, and records it with the module; a load that does not fit is undone by unload
 * and refused. */
static CUresult loaded(CUresult rc, void *handle, int measured, int gpu, size_t before, CUresult (*unload)(void *),
		       void *ctx)
{
	if (rc != CUDA_SUCCESS || handle == NULL)
		return rc;
	size_t after;
	int gpu2;
	uint64_t bytes = 0;
	if (measured && driver_free(&gpu2, &after) == 0 && gpu2 == gpu && after < before)
		bytes = before - after;
	pthread_mutex_lock(&mu);
	struct mod *m = NULL;
	for (int i = 0; i < MAX_MOD && m == NULL; i++)
		if (mods[i].handle == NULL)
			m = &mods[i];
	if (m == NULL)
		tessera_log(TESSERA_LOG_ERROR, "more than %d modules in one process: refused", MAX_MOD);
	else if (bytes > 0 && charge(gpu, bytes, "a module's code and globals") != CUDA_SUCCESS)
		m = NULL;
	if (m != NULL)
		*m = (struct mod){.handle = handle, .ctx = ctx, .gpu = gpu, .bytes = bytes};
	pthread_mutex_unlock(&mu);
	if (m == NULL) {
		unload(handle);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

static void unloaded(void *handle)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_MOD; i++)
		if (mods[i].handle == handle) {
			uncharge(mods[i].gpu, mods[i].bytes);
			memset(&mods[i], 0, sizeof(mods[i]));
			break;
		}
	pthread_mutex_unlock(&mu);
}

static CUresult unload_module(void *h)
{
	return REAL(cuModuleUnload)((CUmodule)h);
}

static CUresult unload_library(void *h)
{
	return REAL(cuLibraryUnload)((CUlibrary)h);
}

#define LOAD_HOOK(name, out, call, unload)                                             \
	HOOK_ENTER();                                                                  \
	HOOK_REAL(name);                                                               \
	if ((unload) == unload_module ? REAL(cuModuleUnload) == NULL : REAL(cuLibraryUnload) == NULL) \
		return CUDA_ERROR_NOT_FOUND;                                           \
	int gpu = -1;                                                                  \
	size_t before = 0;                                                             \
	pthread_mutex_lock(&load_mu);                                                  \
	int measured = driver_free(&gpu, &before) == 0;                                \
	CUresult rc = call;                                                            \
	rc = loaded(rc, rc == CUDA_SUCCESS && (out) ? (void *)*(out) : NULL, measured, gpu, before, unload, \
		    (unload) == unload_module ? (void *)tessera_current_ctx() : NULL);                 \
	pthread_mutex_unlock(&load_mu);                                                \
	return rc

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
	LOAD_HOOK(cuModuleLoad, module, REAL(cuModuleLoad)(module, fname), unload_module);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	LOAD_HOOK(cuModuleLoadData, module, REAL(cuModuleLoadData)(module, image), unload_module);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
			    void **optionValues)
{
	LOAD_HOOK(cuModuleLoadDataEx, module, REAL(cuModuleLoadDataEx)(module, image, numOptions, options, optionValues),
		  unload_module);
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
	LOAD_HOOK(cuModuleLoadFatBinary, module, REAL(cuModuleLoadFatBinary)(module, fatCubin), unload_module);
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
			   unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
			   unsigned int numLibraryOptions)
{
	LOAD_HOOK(cuLibraryLoadData, library,
		  REAL(cuLibraryLoadData)(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
					  libraryOptionValues, numLibraryOptions),
		  unload_library);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
			       void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
			       void **libraryOptionValues, unsigned int numLibraryOptions)
{
	LOAD_HOOK(cuLibraryLoadFromFile, library,
		  REAL(cuLibraryLoadFromFile)(library, fileName, jitOptions, jitOptionsValues, numJitOptions,
					      libraryOptions, libraryOptionValues, numLibraryOptions),
		  unload_library);
}

CUresult cuModuleUnload(CUmodule hmod)
{
	HOOK_ENTER();
	HOOK_REAL(cuModuleUnload);
	CUresult rc = REAL(cuModuleUnload)(hmod);
	if (rc == CUDA_SUCCESS)
		unloaded(hmod);
	return rc;
}

CUresult cuLibraryUnload(CUlibrary library)
{
	HOOK_ENTER();
	HOOK_REAL(cuLibraryUnload);
	CUresult rc = REAL(cuLibraryUnload)(library);
	if (rc == CUDA_SUCCESS)
		unloaded(library);
	return rc;
}

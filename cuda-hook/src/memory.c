/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device-memory accounting: every allocation path of symbols.def reserves its size in
 * the container's region before the driver allocates, and the matching free releases
 * it. A map from pointer or handle to size remembers what each free gives back.
 *
 * Stream-ordered pools are the exception: memory freed into a pool stays reserved by
 * it, on the GPU, until the pool trims. So a pool is counted as a whole, at the larger
 * of what is allocated from it and what it reserved when last looked at; a free only
 * lowers the first. What the pool really reserves is looked at when the program asks
 * for memory info, trims the pool, or would otherwise be refused an allocation.
 * CUDA-graph memory nodes have a pool of their own: graph.c.
 *
 * An allocation is recorded with the context current when it was made: the driver
 * frees it with that context (cuCtxDestroy, the primary context's last release,
 * cuDevicePrimaryCtxReset), and context.c gives it back then. A VMM handle belongs to
 * no context and stays counted until cuMemRelease.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "devices.h"
#include "fork.h"
#include "graph.h"
#include "interpose.h"
#include "log.h"
#include "memory.h"
#include "state.h"

enum kind { K_PTR = 1, K_HANDLE, K_ARRAY, K_MIPMAP };

struct entry {
	uint64_t key;
	uint64_t bytes;
	uint64_t pool; /* the stream-ordered pool it came from (K_PTR), 0 if none */
	uint64_t ctx;  /* the context it was made in, freed with it; 0: none (K_HANDLE) */
	int16_t pool_slot; /* its index in pools */
	int16_t gpu;
	uint8_t kind; /* 0: empty; 0xff: deleted */
	uint8_t managed; /* cuMemAllocManaged's: given back only by a reset (below) */
};

#define DELETED 0xff

static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry *map;
static size_t map_cap, map_used; /* used counts deleted slots too */

static size_t hash(uint64_t key, enum kind k)
{
	uint64_t h = (key ^ ((uint64_t)k << 56)) * 0x9e3779b97f4a7c15ULL;
	return (size_t)(h >> 17);
}

static int map_grow(void)
{
	size_t cap = map_cap ? map_cap * 2 : 1024;
	struct entry *m = calloc(cap, sizeof(*m));
	if (m == NULL)
		return -1;
	for (size_t i = 0; i < map_cap; i++) {
		struct entry *e = &map[i];
		if (e->kind == 0 || e->kind == DELETED)
			continue;
		size_t j = hash(e->key, e->kind) & (cap - 1);
		while (m[j].kind != 0)
			j = (j + 1) & (cap - 1);
		m[j] = *e;
	}
	free(map);
	map = m;
	map_cap = cap;
	size_t live = 0;
	for (size_t i = 0; i < cap; i++)
		live += m[i].kind != 0;
	map_used = live;
	return 0;
}

/* Records e, a copy of what a lookup took or a new entry. */
static int map_put_entry(const struct entry *e)
{
	pthread_mutex_lock(&map_mu);
	if ((map_used + 1) * 10 > map_cap * 7 && map_grow() < 0) {
		pthread_mutex_unlock(&map_mu);
		return -1;
	}
	size_t j = hash(e->key, (enum kind)e->kind) & (map_cap - 1);
	while (map[j].kind != 0 && map[j].kind != DELETED)
		j = (j + 1) & (map_cap - 1);
	if (map[j].kind == 0)
		map_used++;
	map[j] = *e;
	pthread_mutex_unlock(&map_mu);
	return 0;
}

static int map_put_pool(uint64_t key, enum kind k, int gpu, uint64_t bytes, uint64_t pool, int slot, uint64_t ctx)
{
	return map_put_entry(&(struct entry){
		.key = key, .bytes = bytes, .pool = pool, .ctx = ctx, .pool_slot = (int16_t)slot, .gpu = (int16_t)gpu, .kind = (uint8_t)k});
}

/* The calling thread's current context, which an allocation call allocates in; 0 if
 * it cannot be told (the entry then outlives every context, counted until freed). */
static uint64_t current_ctx(void)
{
	return (uint64_t)(uintptr_t)tessera_current_ctx();
}

/* Removes and returns the entry for key; 0 if unknown (allocated before the hook, or
 * by another process image). */
static int map_take(uint64_t key, enum kind k, struct entry *out)
{
	int found = 0;
	pthread_mutex_lock(&map_mu);
	if (map_cap > 0) {
		size_t j = hash(key, k) & (map_cap - 1);
		for (size_t n = 0; n < map_cap && map[j].kind != 0; n++, j = (j + 1) & (map_cap - 1)) {
			if (map[j].kind == k && map[j].key == key) {
				*out = map[j];
				map[j].kind = DELETED;
				found = 1;
				break;
			}
		}
	}
	pthread_mutex_unlock(&map_mu);
	return found;
}

/* ---- stream-ordered pools ---------------------------------------------------- */

#define MAX_POOLS 64

struct pool {
	uint64_t handle; /* 0: free entry */
	int gpu;
	int destroyed;    /* destroyed with allocations outstanding: no more caching */
	uint64_t live;    /* allocated from it and not freed */
	uint64_t counted; /* counted in the region for it; never below live */
};

static struct pool pools[MAX_POOLS]; /* guarded by map_mu */

static struct pool *pool_find(uint64_t handle, int gpu, int create)
{
	struct pool *empty = NULL;
	for (int i = 0; i < MAX_POOLS; i++) {
		if (pools[i].handle == handle && !pools[i].destroyed)
			return &pools[i];
		if (pools[i].handle == 0 && empty == NULL)
			empty = &pools[i];
	}
	if (!create || empty == NULL)
		return NULL;
	*empty = (struct pool){.handle = handle, .gpu = gpu};
	return empty;
}

static void pool_forget_if_idle(struct pool *p)
{
	if (p->live == 0 && p->counted == 0 && p->destroyed)
		memset(p, 0, sizeof(*p));
}

/* Lowers the count of each pool on gpu (every GPU if gpu < 0) to what the pool still
 * reserves; returns the bytes released. */
static uint64_t pools_settle(int gpu)
{
	uint64_t freed = 0;
	if (REAL(cuMemPoolGetAttribute) == NULL)
		return 0;
	for (int i = 0; i < MAX_POOLS; i++) {
		pthread_mutex_lock(&map_mu);
		uint64_t h = pools[i].handle;
		int skip = h == 0 || pools[i].destroyed || (gpu >= 0 && pools[i].gpu != gpu);
		pthread_mutex_unlock(&map_mu);
		if (skip)
			continue;
		cuuint64_t reserved;
		if (REAL(cuMemPoolGetAttribute)((CUmemoryPool)(uintptr_t)h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
		    CUDA_SUCCESS)
			continue;
		pthread_mutex_lock(&map_mu);
		struct pool *p = &pools[i];
		if (p->handle == h && !p->destroyed) {
			uint64_t target = p->live > reserved ? p->live : reserved;
			if (target < p->counted) {
				tessera_region_release(tessera.region, p->gpu, p->counted - target);
				freed += p->counted - target;
				p->counted = target;
			}
		}
		pthread_mutex_unlock(&map_mu);
	}
	return freed;
}

static void after_fork(void)
{
	/* The parent's allocations are not the child's to free. */
	pthread_mutex_init(&map_mu, NULL);
	free(map);
	map = NULL;
	map_cap = map_used = 0;
	memset(pools, 0, sizeof(pools));
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_MEMORY, after_fork);
}

void tessera_memory_lock(void)
{
	pthread_mutex_lock(&map_mu);
}

void tessera_memory_unlock(void)
{
	pthread_mutex_unlock(&map_mu);
}

/* An entry's memory freed (caller holds map_mu): a pool's allocation goes back to its
 * pool and stays counted there unless the pool was destroyed; any other is given back.
 * Returns the bytes given back. */
static uint64_t entry_freed_locked(const struct entry *e)
{
	struct pool *p = e->pool_slot >= 0 ? &pools[e->pool_slot] : NULL;
	if (p != NULL && p->handle == e->pool) {
		p->live -= e->bytes;
		if (!p->destroyed)
			return 0;
		p->counted -= e->bytes;
		tessera_region_release(tessera.region, e->gpu, e->bytes);
		pool_forget_if_idle(p);
		return e->bytes;
	}
	tessera_region_release(tessera.region, e->gpu, e->bytes);
	return e->bytes;
}

uint64_t tessera_memory_forget_ctx_locked(CUcontext ctx, int managed_too)
{
	uint64_t key = (uint64_t)(uintptr_t)ctx, freed = 0;
	if (key == 0)
		return 0;
	for (size_t i = 0; i < map_cap; i++) {
		struct entry *e = &map[i];
		if (e->kind == 0 || e->kind == DELETED || e->ctx != key || (e->managed && !managed_too))
			continue;
		/* A pool's allocation stays counted with its pool at what the pool reserves
		 * until its next settling reads what the driver holds. */
		freed += entry_freed_locked(e);
		e->kind = DELETED;
	}
	return freed;
}

uint64_t tessera_memory_settle(int gpu)
{
	return pools_settle(gpu) + tessera_graph_settle(gpu);
}

/* Reserves bytes on gpu; before refusing, gives back what pools have trimmed. */
CUresult tessera_reserve(int gpu, uint64_t bytes)
{
	CUresult rc = tessera_region_reserve(tessera.region, gpu, bytes, tessera_limit_bytes(gpu));
	if (rc == CUDA_ERROR_OUT_OF_MEMORY && tessera_memory_settle(gpu) > 0)
		rc = tessera_region_reserve(tessera.region, gpu, bytes, tessera_limit_bytes(gpu));
	return rc;
}

static CUresult reserve(int gpu, uint64_t bytes)
{
	return tessera_reserve(gpu, bytes);
}

/* Reserves bytes on the current context's GPU. */
static CUresult reserve_current(uint64_t bytes, int *gpu)
{
	CUresult rc = tessera_current_gpu(gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = reserve(*gpu, bytes);
	if (rc != CUDA_SUCCESS)
		tessera_log(TESSERA_LOG_INFO, "allocation of %llu bytes refused: GPU %s would exceed its %llu MiB limit",
			    (unsigned long long)bytes, tessera.limits.gpus[*gpu].uuid,
			    (unsigned long long)tessera.limits.gpus[*gpu].memory_mib);
	return rc;
}

static void unreserve(int gpu, uint64_t bytes)
{
	tessera_region_release(tessera.region, gpu, bytes);
}

/* Records a successful allocation, as made in ctx (0: outliving every context), managed
 * memory or not; if the map cannot grow, undo it rather than lose track of it. */
static CUresult remember_in(uint64_t key, enum kind k, int gpu, uint64_t bytes, CUresult (*undo)(uint64_t), uint64_t ctx,
			    int managed)
{
	struct entry e = {.key = key, .bytes = bytes, .ctx = ctx, .pool_slot = -1, .gpu = (int16_t)gpu, .kind = (uint8_t)k,
			  .managed = (uint8_t)managed};
	if (map_put_entry(&e) == 0)
		return CUDA_SUCCESS;
	undo(key);
	unreserve(gpu, bytes);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Records an allocation made in the current context (a VMM handle: in none). */
static CUresult remember(uint64_t key, enum kind k, int gpu, uint64_t bytes, CUresult (*undo)(uint64_t))
{
	return remember_in(key, k, gpu, bytes, undo, k == K_HANDLE ? 0 : current_ctx(), 0);
}

static CUresult free_ptr(uint64_t p) { return REAL(cuMemFree_v2)((CUdeviceptr)p); }
static CUresult release_handle(uint64_t h) { return REAL(cuMemRelease)((CUmemGenericAllocationHandle)h); }
static CUresult destroy_array(uint64_t a) { return REAL(cuArrayDestroy)((CUarray)(uintptr_t)a); }
static CUresult destroy_mipmap(uint64_t a) { return REAL(cuMipmappedArrayDestroy)((CUmipmappedArray)(uintptr_t)a); }

/* The common shape of a counted allocation: reserve, allocate, remember (as made in
 * the current context; managed memory or not). */
#define COUNTED_ALLOC(name, bytes, key_expr, kind, undo, managed, call)        \
	HOOK_ENTER();                                                          \
	HOOK_REAL(name);                                                       \
	int gpu;                                                               \
	uint64_t want_ = (bytes);                                              \
	CUresult rc = reserve_current(want_, &gpu);                            \
	if (rc != CUDA_SUCCESS)                                                \
		return rc;                                                     \
	rc = call;                                                             \
	if (rc != CUDA_SUCCESS) {                                              \
		unreserve(gpu, want_);                                         \
		return rc;                                                     \
	}                                                                      \
	return remember_in((uint64_t)(key_expr), kind, gpu, want_, undo, current_ctx(), (managed))

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	COUNTED_ALLOC(cuMemAlloc_v2, bytesize, *dptr, K_PTR, free_ptr, 0, REAL(cuMemAlloc_v2)(dptr, bytesize));
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	/* Managed memory can live on the GPU in full, so it counts in full. It is counted
	 * until freed or its context is reset, which was seen to free it on a GPU (the
	 * GPU suite's managedreset); not at a created context's destroy or the primary
	 * context's last release, not yet seen to: giving back memory still held would
	 * let a program hold more than its limit. */
	COUNTED_ALLOC(cuMemAllocManaged, bytesize, *dptr, K_PTR, free_ptr, 1,
		      REAL(cuMemAllocManaged)(dptr, bytesize, flags));
}

/*
 * Stream-ordered allocations. Only what the pool's count does not already cover is
 * reserved: memory freed into the pool is still counted, and the next allocation from
 * the pool reuses it. A pool the hook cannot tell (no cuDeviceGetMemPool, or more
 * pools than it tracks) is counted per allocation, like cuMemAlloc.
 */
struct pool_ticket {
	int gpu;
	int slot; /* index in pools, -1: counted per allocation */
	uint64_t pool, bytes, need;
};

static CUresult pool_admit(int gpu, uint64_t pool, uint64_t bytes, struct pool_ticket *t)
{
	*t = (struct pool_ticket){.gpu = gpu, .slot = -1, .pool = pool, .bytes = bytes, .need = bytes};
	for (int attempt = 0;; attempt++) {
		CUresult rc;
		pthread_mutex_lock(&map_mu);
		struct pool *p = pool ? pool_find(pool, gpu, 1) : NULL;
		if (p == NULL) {
			pthread_mutex_unlock(&map_mu);
			if (pool)
				tessera_log(TESSERA_LOG_WARN, "more than %d memory pools: pool %#llx counted per allocation",
					    MAX_POOLS, (unsigned long long)pool);
			t->pool = 0;
			return reserve(gpu, bytes);
		}
		/* Reserved under map_mu, so that two threads cannot both count on the same
		 * cached bytes. */
		t->need = p->live + bytes > p->counted ? p->live + bytes - p->counted : 0;
		rc = t->need ? tessera_region_reserve(tessera.region, gpu, t->need, tessera_limit_bytes(gpu)) : CUDA_SUCCESS;
		if (rc == CUDA_SUCCESS) {
			p->live += bytes;
			p->counted += t->need;
			t->slot = (int)(p - pools);
		}
		pthread_mutex_unlock(&map_mu);
		if (rc != CUDA_ERROR_OUT_OF_MEMORY || attempt > 0 || tessera_memory_settle(gpu) == 0) {
			if (rc != CUDA_SUCCESS)
				tessera_log(TESSERA_LOG_INFO, "allocation of %llu bytes refused: GPU %s would exceed its %llu MiB limit",
					    (unsigned long long)bytes, tessera.limits.gpus[gpu].uuid,
					    (unsigned long long)tessera.limits.gpus[gpu].memory_mib);
			return rc;
		}
	}
}

static void pool_undo(const struct pool_ticket *t)
{
	if (t->slot < 0) {
		unreserve(t->gpu, t->need);
		return;
	}
	pthread_mutex_lock(&map_mu);
	struct pool *p = &pools[t->slot];
	if (p->handle == t->pool) {
		p->live -= t->bytes;
		p->counted -= t->need;
	}
	tessera_region_release(tessera.region, t->gpu, t->need);
	pthread_mutex_unlock(&map_mu);
}

static CUresult pool_done(const struct pool_ticket *t, CUresult rc, CUdeviceptr ptr)
{
	if (rc != CUDA_SUCCESS) {
		pool_undo(t);
		return rc;
	}
	if (map_put_pool(ptr, K_PTR, t->gpu, t->bytes, t->slot < 0 ? 0 : t->pool, t->slot, current_ctx()) == 0)
		return CUDA_SUCCESS;
	free_ptr(ptr);
	pool_undo(t);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* A free of a pool allocation: the memory stays in the pool, and counted, unless the
 * pool was destroyed. */
static void pool_freed(const struct entry *e)
{
	pthread_mutex_lock(&map_mu);
	entry_freed_locked(e);
	pthread_mutex_unlock(&map_mu);
}

static uint64_t current_pool(int gpu)
{
	CUmemoryPool pool;
	if (REAL(cuDeviceGetMemPool) == NULL || REAL(cuDeviceGetMemPool)(&pool, tessera.real_dev[gpu]) != CUDA_SUCCESS)
		return 0;
	return (uint64_t)(uintptr_t)pool;
}

/* A stream-ordered allocation on a stream being captured is not made: it becomes a
 * memory node of the graph, counted when the graph is launched (graph.c). */
static int capturing(CUstream s)
{
	CUstreamCaptureStatus st;
	return atomic_load(&tessera.captures) > 0 && REAL(cuStreamIsCapturing) != NULL &&
	       REAL(cuStreamIsCapturing)(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

#define POOL_ALLOC(name, pool_expr, call)                                      \
	HOOK_ENTER();                                                          \
	HOOK_REAL(name);                                                       \
	int gpu;                                                               \
	struct pool_ticket t_;                                                 \
	if (capturing(hStream))                                                \
		return call;                                                   \
	CUresult rc = tessera_current_gpu(&gpu);                               \
	if (rc != CUDA_SUCCESS)                                                \
		return rc;                                                     \
	if ((rc = pool_admit(gpu, (pool_expr), bytesize, &t_)) != CUDA_SUCCESS) \
		return rc;                                                     \
	rc = call;                                                             \
	return pool_done(&t_, rc, rc == CUDA_SUCCESS ? *dptr : 0)

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	POOL_ALLOC(cuMemAllocAsync, current_pool(gpu), REAL(cuMemAllocAsync)(dptr, bytesize, hStream));
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	POOL_ALLOC(cuMemAllocAsync_ptsz, current_pool(gpu), REAL(cuMemAllocAsync_ptsz)(dptr, bytesize, hStream));
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	POOL_ALLOC(cuMemAllocFromPoolAsync, (uint64_t)(uintptr_t)pool,
		   REAL(cuMemAllocFromPoolAsync)(dptr, bytesize, pool, hStream));
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, (uint64_t)(uintptr_t)pool,
		   REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytesize, pool, hStream));
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemPoolTrimTo);
	CUresult rc = REAL(cuMemPoolTrimTo)(pool, minBytesToKeep);
	if (rc == CUDA_SUCCESS)
		pools_settle(-1);
	return rc;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemPoolDestroy);
	CUresult rc = REAL(cuMemPoolDestroy)(pool);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Its cache is gone; allocations still outstanding are released at their free. */
	pthread_mutex_lock(&map_mu);
	struct pool *p = pool_find((uint64_t)(uintptr_t)pool, 0, 0);
	if (p != NULL) {
		tessera_region_release(tessera.region, p->gpu, p->counted - p->live);
		p->counted = p->live;
		p->destroyed = 1;
		pool_forget_if_idle(p);
	}
	pthread_mutex_unlock(&map_mu);
	return rc;
}

/* The pitch the driver will choose is not known before the call: reserve with the
 * widest alignment it uses, then settle on the real size. */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
			    unsigned int ElementSizeBytes)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemAllocPitch_v2);
	int gpu;
	uint64_t est = (((uint64_t)WidthInBytes + 511) & ~511ULL) * Height;
	CUresult rc = reserve_current(est, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	if (rc != CUDA_SUCCESS) {
		unreserve(gpu, est);
		return rc;
	}
	uint64_t real = (uint64_t)*pPitch * Height;
	if (real > est) {
		rc = reserve(gpu, real - est);
		if (rc != CUDA_SUCCESS) {
			REAL(cuMemFree_v2)(*dptr);
			unreserve(gpu, est);
			return rc;
		}
	} else if (real < est) {
		unreserve(gpu, est - real);
	}
	return remember(*dptr, K_PTR, gpu, real, free_ptr);
}

static CUresult free_counted(CUdeviceptr dptr, CUresult (*call)(CUdeviceptr, CUstream), CUstream s, int async)
{
	struct entry e;
	int known = map_take(dptr, K_PTR, &e);
	CUresult rc = async ? call(dptr, s) : REAL(cuMemFree_v2)(dptr);
	if (!known)
		return rc;
	if (rc != CUDA_SUCCESS)
		map_put_entry(&e);
	else if (e.pool != 0)
		pool_freed(&e);
	else
		unreserve(e.gpu, e.bytes);
	return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemFree_v2);
	return free_counted(dptr, NULL, NULL, 0);
}

/* Stream-ordered frees: the memory goes back to its pool, and stays counted there. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemFreeAsync);
	return free_counted(dptr, REAL(cuMemFreeAsync), hStream, 1);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemFreeAsync_ptsz);
	return free_counted(dptr, REAL(cuMemFreeAsync_ptsz), hStream, 1);
}

/* Virtual memory management: the physical allocation is what takes memory. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemCreate);
	if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return REAL(cuMemCreate)(handle, size, prop, flags); /* host memory: not ours to count */
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	int gpu = tessera_gpu_of_device(prop->location.id);
	if (gpu < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if ((rc = reserve(gpu, size)) != CUDA_SUCCESS)
		return rc;
	if ((rc = REAL(cuMemCreate)(handle, size, prop, flags)) != CUDA_SUCCESS) {
		unreserve(gpu, size);
		return rc;
	}
	return remember(*handle, K_HANDLE, gpu, size, release_handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemRelease);
	struct entry e;
	int known = map_take(handle, K_HANDLE, &e);
	CUresult rc = REAL(cuMemRelease)(handle);
	if (known) {
		if (rc == CUDA_SUCCESS)
			unreserve(e.gpu, e.bytes);
		else
			map_put_entry(&e);
	}
	return rc;
}

/* ---- arrays ----------------------------------------------------------------- */

static uint64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	default:
		return 4; /* FLOAT, INT32; the driver's own figure replaces this below */
	}
}

static uint64_t array_estimate(size_t w, size_t h, size_t d, CUarray_format f, unsigned int ch)
{
	return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * format_bytes(f) * (ch ? ch : 1);
}

/* After creation, the driver says how much the array really takes (padding, tiling);
 * settle the reservation on that. Returns non-zero if the extra does not fit. */
static CUresult settle(int gpu, uint64_t *reserved, uint64_t real)
{
	if (real > *reserved) {
		CUresult rc = reserve(gpu, real - *reserved);
		if (rc != CUDA_SUCCESS)
			return rc;
	} else if (real < *reserved) {
		unreserve(gpu, *reserved - real);
	}
	*reserved = real;
	return CUDA_SUCCESS;
}

static CUresult array_created(CUarray a, int gpu, uint64_t est)
{
	CUDA_ARRAY_MEMORY_REQUIREMENTS req;
	if (REAL(cuArrayGetMemoryRequirements) != NULL &&
	    REAL(cuArrayGetMemoryRequirements)(&req, a, tessera.real_dev[gpu]) == CUDA_SUCCESS &&
	    settle(gpu, &est, req.size) != CUDA_SUCCESS) {
		REAL(cuArrayDestroy)(a);
		unreserve(gpu, est);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return remember((uint64_t)(uintptr_t)a, K_ARRAY, gpu, est, destroy_array);
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
	HOOK_ENTER();
	HOOK_REAL(cuArrayCreate_v2);
	HOOK_REAL(cuArrayDestroy);
	if (d == NULL)
		return REAL(cuArrayCreate_v2)(pHandle, d);
	int gpu;
	uint64_t est = array_estimate(d->Width, d->Height, 1, d->Format, d->NumChannels);
	CUresult rc = reserve_current(est, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = REAL(cuArrayCreate_v2)(pHandle, d)) != CUDA_SUCCESS) {
		unreserve(gpu, est);
		return rc;
	}
	return array_created(*pHandle, gpu, est);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	HOOK_ENTER();
	HOOK_REAL(cuArray3DCreate_v2);
	HOOK_REAL(cuArrayDestroy);
	if (d == NULL)
		return REAL(cuArray3DCreate_v2)(pHandle, d);
	int gpu;
	uint64_t est = array_estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
	CUresult rc = reserve_current(est, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = REAL(cuArray3DCreate_v2)(pHandle, d)) != CUDA_SUCCESS) {
		unreserve(gpu, est);
		return rc;
	}
	return array_created(*pHandle, gpu, est);
}

CUresult cuArrayDestroy(CUarray hArray)
{
	HOOK_ENTER();
	HOOK_REAL(cuArrayDestroy);
	struct entry e;
	int known = map_take((uint64_t)(uintptr_t)hArray, K_ARRAY, &e);
	CUresult rc = REAL(cuArrayDestroy)(hArray);
	if (known) {
		if (rc == CUDA_SUCCESS)
			unreserve(e.gpu, e.bytes);
		else
			map_put_entry(&e);
	}
	return rc;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	HOOK_ENTER();
	HOOK_REAL(cuMipmappedArrayCreate);
	HOOK_REAL(cuMipmappedArrayDestroy);
	if (d == NULL)
		return REAL(cuMipmappedArrayCreate)(pHandle, d, levels);
	int gpu;
	/* All levels together take less than twice the first (a geometric series). */
	uint64_t base = array_estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
	uint64_t est = levels > 1 ? 2 * base : base;
	CUresult rc = reserve_current(est, &gpu);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = REAL(cuMipmappedArrayCreate)(pHandle, d, levels)) != CUDA_SUCCESS) {
		unreserve(gpu, est);
		return rc;
	}
	CUDA_ARRAY_MEMORY_REQUIREMENTS req;
	if (REAL(cuMipmappedArrayGetMemoryRequirements) != NULL &&
	    REAL(cuMipmappedArrayGetMemoryRequirements)(&req, *pHandle, tessera.real_dev[gpu]) == CUDA_SUCCESS &&
	    settle(gpu, &est, req.size) != CUDA_SUCCESS) {
		REAL(cuMipmappedArrayDestroy)(*pHandle);
		unreserve(gpu, est);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return remember((uint64_t)(uintptr_t)*pHandle, K_MIPMAP, gpu, est, destroy_mipmap);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
	HOOK_ENTER();
	HOOK_REAL(cuMipmappedArrayDestroy);
	struct entry e;
	int known = map_take((uint64_t)(uintptr_t)h, K_MIPMAP, &e);
	CUresult rc = REAL(cuMipmappedArrayDestroy)(h);
	if (known) {
		if (rc == CUDA_SUCCESS)
			unreserve(e.gpu, e.bytes);
		else
			map_put_entry(&e);
	}
	return rc;
}

/* ---- CUDA 3.1's allocations ------------------------------------------------------ */

/* The allocation calls of the ABI before CUDA 3.2 (32-bit device pointers and sizes)
 * are still exported by the driver for binaries of that age. None is counted: each is
 * refused, so that a program cannot reach the driver's allocator by their names. */
static CUresult v1_refused(const char *name)
{
	tessera_log(TESSERA_LOG_WARN, "%s (the 32-bit device pointer ABI of CUDA 3.1) is not supported: refused", name);
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
	HOOK_ENTER();
	(void)dptr;
	(void)bytesize;
	return v1_refused("cuMemAlloc");
}

CUresult cuMemAllocPitch(unsigned int *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
			 unsigned int ElementSizeBytes)
{
	HOOK_ENTER();
	(void)dptr;
	(void)pPitch;
	(void)WidthInBytes;
	(void)Height;
	(void)ElementSizeBytes;
	return v1_refused("cuMemAllocPitch");
}

CUresult cuArrayCreate(CUarray *pHandle, const void *pAllocateArray)
{
	HOOK_ENTER();
	(void)pHandle;
	(void)pAllocateArray;
	return v1_refused("cuArrayCreate");
}

CUresult cuArray3DCreate(CUarray *pHandle, const void *pAllocateArray)
{
	HOOK_ENTER();
	(void)pHandle;
	(void)pAllocateArray;
	return v1_refused("cuArray3DCreate");
}

/* ---- the memory the container sees ------------------------------------------ */

/* The memory the container sees on the current context's GPU: its limit, less its
 * usage, never more than the GPU has free. */
static CUresult mem_info(size_t *freeb, size_t *totalb)
{
	size_t rf, rt;
	CUresult rc = REAL(cuMemGetInfo_v2)(&rf, &rt);
	if (rc != CUDA_SUCCESS)
		return rc;
	int gpu;
	if ((rc = tessera_current_gpu(&gpu)) != CUDA_SUCCESS)
		return rc;
	uint64_t limit = tessera_limit_bytes(gpu);
	uint64_t total = rt < limit ? rt : limit;
	tessera_memory_settle(gpu);
	uint64_t used = tessera_region_used(tessera.region, gpu);
	uint64_t fr = used < total ? total - used : 0;
	if (fr > rf)
		fr = rf; /* other tenants may have taken what the limit would allow */
	if (freeb != NULL)
		*freeb = (size_t)fr;
	if (totalb != NULL)
		*totalb = (size_t)total;
	return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *freeb, size_t *totalb)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemGetInfo_v2);
	return mem_info(freeb, totalb);
}

/* CUDA 3.1's figures, 32-bit: the same, capped as the driver caps them. */
CUresult cuMemGetInfo(unsigned int *freeb, unsigned int *totalb)
{
	HOOK_ENTER();
	HOOK_REAL(cuMemGetInfo_v2);
	size_t f = 0, t = 0;
	CUresult rc = mem_info(&f, &t);
	if (rc == CUDA_SUCCESS) {
		if (freeb != NULL)
			*freeb = tessera_bytes32(f);
		if (totalb != NULL)
			*totalb = tessera_bytes32(t);
	}
	return rc;
}

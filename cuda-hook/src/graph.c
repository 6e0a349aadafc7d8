/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA-graph memory nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync captured into a
 * graph). Their memory comes from a per-process, per-device graph pool that the driver
 * fills when an executable graph is uploaded or launched, not when it is instantiated,
 * and keeps until cuDeviceGraphMemTrim (measured on an H200, docs/cuda-hook.md). An
 * allocation a graph frees inside itself stays mapped to the graph, so the pool's
 * reserved size is what the process holds, whatever the graph did with it.
 *
 * So: when a graph is instantiated, its memory nodes are read (child graphs included)
 * and the executable graph remembers what it allocates on each GPU. Before a launch or
 * upload of such a graph, that much is reserved in the container's region; a launch
 * that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY, as the driver refuses one
 * that does not fit the GPU. After it, the process's count for the graph pool is
 * settled on the pool's reserved size (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), which
 * is never more than it was plus the graph's allocations, and the reservation is given
 * back. A graph relaunched with nothing launched in between keeps its memory mapped,
 * so it is admitted without a reservation. Launches of graphs without memory nodes
 * cost one atomic load more.
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

#define MAX_GRAPH_DEPTH 8

struct gexec {
	uint64_t exec;
	uint64_t need[TESSERA_MAX_GPUS]; /* bytes its memory nodes allocate on each GPU */
	uint64_t gen[TESSERA_MAX_GPUS];  /* each GPU's generation at its last launch */
};

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static struct gexec *gexecs; /* executable graphs with memory nodes */
static size_t ngexecs, capgexecs;
_Atomic size_t tessera_graph_execs; /* ngexecs, read without gmu on every graph launch */

/* Per GPU, under gmu: what this process counts for its graph pool, the executable graph
 * launched last, and a generation that changes whenever mapped memory may have moved
 * between graphs (another graph launched, a trim, the pool shrinking). */
static uint64_t counted[TESSERA_MAX_GPUS];
static uint64_t last_exec[TESSERA_MAX_GPUS];
static uint64_t gen[TESSERA_MAX_GPUS];

static void after_fork(void)
{
	/* Graphs and their memory are the parent's. */
	pthread_mutex_init(&gmu, NULL);
	free(gexecs);
	gexecs = NULL;
	ngexecs = capgexecs = 0;
	atomic_store(&tessera_graph_execs, 0);
	memset(counted, 0, sizeof(counted));
	memset(last_exec, 0, sizeof(last_exec));
	memset(gen, 0, sizeof(gen));
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_GRAPH, after_fork);
}

/* Adds what graph g's memory nodes allocate to need, per GPU of the container. Returns
 * CUDA_SUCCESS, the driver's error reading the graph, or CUDA_ERROR_INVALID_DEVICE for
 * an allocation on a GPU the container does not have. */
static CUresult graph_need(CUgraph g, uint64_t *need, int depth)
{
	if (depth > MAX_GRAPH_DEPTH)
		return CUDA_SUCCESS;
	size_t n = 0;
	CUresult rc = REAL(cuGraphGetNodes)(g, NULL, &n);
	if (rc != CUDA_SUCCESS || n == 0)
		return rc;
	CUgraphNode *nodes = malloc(n * sizeof(*nodes));
	if (nodes == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if ((rc = REAL(cuGraphGetNodes)(g, nodes, &n)) != CUDA_SUCCESS)
		goto out;
	for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
		CUgraphNodeType t;
		if ((rc = REAL(cuGraphNodeGetType)(nodes[i], &t)) != CUDA_SUCCESS)
			break;
		if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
			CUDA_MEM_ALLOC_NODE_PARAMS p;
			if ((rc = REAL(cuGraphMemAllocNodeGetParams)(nodes[i], &p)) != CUDA_SUCCESS)
				break;
			int gpu = tessera_gpu_of_device(p.poolProps.location.id);
			if (gpu < 0) {
				rc = CUDA_ERROR_INVALID_DEVICE;
				break;
			}
			need[gpu] += p.bytesize;
		} else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
			CUgraph child;
			if ((rc = REAL(cuGraphChildGraphNodeGetGraph)(nodes[i], &child)) == CUDA_SUCCESS)
				rc = graph_need(child, need, depth + 1);
		}
	}
out:
	free(nodes);
	return rc;
}

/* What the executable graph built from g will allocate; *any says whether it allocates
 * at all. A driver that cannot tell leaves it at nothing. */
static CUresult read_need(CUgraph g, uint64_t *need, int *any)
{
	memset(need, 0, sizeof(uint64_t) * TESSERA_MAX_GPUS);
	*any = 0;
	if (REAL(cuGraphGetNodes) == NULL || REAL(cuGraphNodeGetType) == NULL ||
	    REAL(cuGraphMemAllocNodeGetParams) == NULL || REAL(cuGraphChildGraphNodeGetGraph) == NULL)
		return CUDA_SUCCESS;
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = graph_need(g, need, 0)) != CUDA_SUCCESS)
		return rc;
	for (int i = 0; i < tessera.limits.ngpus; i++)
		*any |= need[i] > 0;
	return CUDA_SUCCESS;
}

static struct gexec *find(uint64_t exec)
{
	for (size_t i = 0; i < ngexecs; i++)
		if (gexecs[i].exec == exec)
			return &gexecs[i];
	return NULL;
}

/* Forgets exec (caller holds gmu): its entry, and its claim to be the graph launched
 * last, which a new graph given the same handle must not inherit. */
static void forget_locked(uint64_t exec)
{
	struct gexec *e = find(exec);
	if (e != NULL)
		*e = gexecs[--ngexecs];
	for (int g = 0; g < tessera.limits.ngpus; g++)
		if (last_exec[g] == exec)
			last_exec[g] = 0;
	atomic_store(&tessera_graph_execs, ngexecs);
}

/* Remembers (or forgets, when it allocates nothing) what exec allocates. */
static CUresult remember_exec(uint64_t exec, const uint64_t *need, int any)
{
	pthread_mutex_lock(&gmu);
	if (!any) {
		forget_locked(exec);
		pthread_mutex_unlock(&gmu);
		return CUDA_SUCCESS;
	}
	struct gexec *e = find(exec);
	if (e == NULL) {
		if (ngexecs == capgexecs) {
			size_t cap = capgexecs ? 2 * capgexecs : 16;
			struct gexec *m = realloc(gexecs, cap * sizeof(*m));
			if (m == NULL) {
				pthread_mutex_unlock(&gmu);
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
			gexecs = m;
			capgexecs = cap;
		}
		e = &gexecs[ngexecs++];
		e->exec = exec;
	}
	memcpy(e->need, need, sizeof(e->need));
	memset(e->gen, 0xff, sizeof(e->gen)); /* never launched */
	atomic_store(&tessera_graph_execs, ngexecs);
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

/* Brings this process's count for the graph pool of gpu to what the pool reserves
 * (caller holds gmu). More than the limit is counted too: the memory is held. */
static void settle_locked(int gpu)
{
	cuuint64_t reserved;
	if (REAL(cuDeviceGetGraphMemAttribute) == NULL ||
	    REAL(cuDeviceGetGraphMemAttribute)(tessera.real_dev[gpu], CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
		    CUDA_SUCCESS)
		return;
	if (reserved > counted[gpu]) {
		tessera_region_reserve(tessera.region, gpu, reserved - counted[gpu], UINT64_MAX);
	} else if (reserved < counted[gpu]) {
		tessera_region_release(tessera.region, gpu, counted[gpu] - reserved);
		gen[gpu]++; /* memory left the pool: what stays mapped is not known */
	}
	counted[gpu] = reserved;
}

/* Settles the graph pool of gpu (every GPU if gpu < 0) if this process has used one;
 * returns the bytes given back. */
uint64_t tessera_graph_settle(int gpu)
{
	uint64_t freed = 0;
	if (tessera.status != CUDA_SUCCESS || !atomic_load_explicit(&tessera.dev_ready, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&gmu);
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		if ((gpu >= 0 && g != gpu) || tessera.real_dev[g] < 0 || (counted[g] == 0 && last_exec[g] == 0))
			continue;
		uint64_t before = counted[g];
		settle_locked(g);
		if (counted[g] < before)
			freed += before - counted[g];
	}
	pthread_mutex_unlock(&gmu);
	return freed;
}

/* Reserves what a launch or upload of exec needs, per GPU: none for a graph without
 * memory nodes, none on a GPU where it was the last graph launched and nothing may
 * have moved its memory since. need_in, when given, is the need of a graph being
 * instantiated and uploaded at once. */
static CUresult admit(uint64_t exec, const uint64_t *need_in, struct tessera_graph_ticket *a)
{
	a->any = 0;
	memset(a->held, 0, sizeof(uint64_t) * (size_t)tessera.limits.ngpus);
	a->exec = exec;
	uint64_t need[TESSERA_MAX_GPUS];
	pthread_mutex_lock(&gmu);
	struct gexec *e = need_in ? NULL : find(exec);
	if (need_in == NULL && e == NULL) {
		pthread_mutex_unlock(&gmu);
		return CUDA_SUCCESS;
	}
	a->any = 1;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		need[g] = need_in ? need_in[g] : e->need[g];
		if (e != NULL && last_exec[g] == exec && e->gen[g] == gen[g])
			need[g] = 0;
	}
	pthread_mutex_unlock(&gmu);
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		if (need[g] == 0)
			continue;
		CUresult rc = tessera_region_reserve(tessera.region, g, need[g], tessera_limit_bytes(g));
		if (rc == CUDA_ERROR_OUT_OF_MEMORY && (tessera_memory_settle(g) > 0))
			rc = tessera_region_reserve(tessera.region, g, need[g], tessera_limit_bytes(g));
		if (rc != CUDA_SUCCESS) {
			tessera_log(TESSERA_LOG_INFO,
				    "graph launch refused: its memory nodes allocate %llu bytes and GPU %s would exceed its %llu MiB limit",
				    (unsigned long long)need[g], tessera.limits.gpus[g].uuid,
				    (unsigned long long)tessera.limits.gpus[g].memory_mib);
			for (int h = 0; h < g; h++)
				tessera_region_release(tessera.region, h, a->held[h]);
			return rc;
		}
		a->held[g] = need[g];
	}
	return CUDA_SUCCESS;
}

/* After the launch or upload: count what the graph pools now hold, then give back the
 * admission's reservation. */
static void admitted(const struct tessera_graph_ticket *a, CUresult rc)
{
	if (!a->any)
		return;
	pthread_mutex_lock(&gmu);
	struct gexec *e = find(a->exec);
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		if (tessera.real_dev[g] < 0)
			continue;
		uint64_t need = e ? e->need[g] : a->held[g];
		if (need == 0)
			continue;
		settle_locked(g);
		if (last_exec[g] != a->exec) {
			gen[g]++;
			last_exec[g] = rc == CUDA_SUCCESS ? a->exec : 0;
		}
		if (e != NULL)
			e->gen[g] = gen[g];
	}
	pthread_mutex_unlock(&gmu);
	for (int g = 0; g < tessera.limits.ngpus; g++)
		if (a->held[g])
			tessera_region_release(tessera.region, g, a->held[g]);
}

/* ---- instantiation ------------------------------------------------------------ */

/* Instantiates through call; uploads when upload is set (the memory is mapped then). */
#define INSTANTIATE(name, graph, upload, call)                                         \
	HOOK_ENTER();                                                                  \
	HOOK_REAL(name);                                                               \
	uint64_t need_[TESSERA_MAX_GPUS];                                              \
	int any_;                                                                      \
	CUresult rc = read_need((graph), need_, &any_);                                \
	if (rc != CUDA_SUCCESS)                                                        \
		return rc;                                                             \
	struct tessera_graph_ticket a_ = {0};                                          \
	if (any_ && (upload) && (rc = admit(0, need_, &a_)) != CUDA_SUCCESS)           \
		return rc;                                                             \
	rc = call;                                                                     \
	if (rc == CUDA_SUCCESS && any_ && remember_exec((uint64_t)(uintptr_t)*phGraphExec, need_, 1) != CUDA_SUCCESS) { \
		REAL(cuGraphExecDestroy)(*phGraphExec);                                \
		rc = CUDA_ERROR_OUT_OF_MEMORY;                                         \
	}                                                                              \
	if (any_ && (upload)) {                                                        \
		a_.exec = rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*phGraphExec : 0;  \
		admitted(&a_, rc);                                                     \
	}                                                                              \
	return rc

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	INSTANTIATE(cuGraphInstantiateWithFlags, hGraph, 0, REAL(cuGraphInstantiateWithFlags)(phGraphExec, hGraph, flags));
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	INSTANTIATE(cuGraphInstantiateWithParams, hGraph, params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
		    REAL(cuGraphInstantiateWithParams)(phGraphExec, hGraph, params));
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
					   CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	INSTANTIATE(cuGraphInstantiateWithParams_ptsz, hGraph,
		    params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
		    REAL(cuGraphInstantiateWithParams_ptsz)(phGraphExec, hGraph, params));
}

/* The CUDA 11 ABI, still called by binaries built then. */
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
			       size_t bufferSize)
{
	INSTANTIATE(cuGraphInstantiate_v2, hGraph, 0,
		    REAL(cuGraphInstantiate_v2)(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
}

/* An update may change what the graph allocates; read it again. */
CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
	HOOK_ENTER();
	HOOK_REAL(cuGraphExecUpdate_v2);
	uint64_t need[TESSERA_MAX_GPUS];
	int any;
	CUresult rc = read_need(hGraph, need, &any);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = REAL(cuGraphExecUpdate_v2)(hGraphExec, hGraph, resultInfo)) == CUDA_SUCCESS)
		rc = remember_exec((uint64_t)(uintptr_t)hGraphExec, need, any);
	return rc;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	HOOK_ENTER();
	HOOK_REAL(cuGraphExecDestroy);
	CUresult rc = REAL(cuGraphExecDestroy)(hGraphExec);
	if (rc == CUDA_SUCCESS && atomic_load(&tessera_graph_execs) > 0) {
		pthread_mutex_lock(&gmu);
		forget_locked((uint64_t)(uintptr_t)hGraphExec);
		pthread_mutex_unlock(&gmu);
		tessera_graph_settle(-1);
	}
	return rc;
}

/* ---- launch, upload, trim ------------------------------------------------------ */

CUresult tessera_graph_admit_slow(CUgraphExec exec, struct tessera_graph_ticket *t)
{
	return admit((uint64_t)(uintptr_t)exec, NULL, t);
}

void tessera_graph_admitted_slow(const struct tessera_graph_ticket *t, CUresult rc)
{
	admitted(t, rc);
}

#define UPLOAD(name)                                                   \
	HOOK_ENTER();                                                  \
	HOOK_REAL(name);                                               \
	struct tessera_graph_ticket t_;                                \
	CUresult rc = tessera_graph_admit(hGraphExec, &t_);            \
	if (rc != CUDA_SUCCESS)                                        \
		return rc;                                             \
	rc = REAL(name)(hGraphExec, hStream);                          \
	tessera_graph_admitted(&t_, rc);                               \
	return rc

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
	UPLOAD(cuGraphUpload);
}

CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	UPLOAD(cuGraphUpload_ptsz);
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceGraphMemTrim);
	CUresult rc = REAL(cuDeviceGraphMemTrim)(device);
	int gpu = tessera_gpu_of_device(device);
	if (rc == CUDA_SUCCESS && gpu >= 0) {
		pthread_mutex_lock(&gmu);
		gen[gpu]++;
		last_exec[gpu] = 0;
		settle_locked(gpu);
		pthread_mutex_unlock(&gmu);
	}
	return rc;
}

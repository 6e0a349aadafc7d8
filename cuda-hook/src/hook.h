/* Internal interface between the hook's source files. Nothing here is exported. */
#ifndef TESSERA_HOOK_H
#define TESSERA_HOOK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "limits.h"
#include "region.h"
#include "tessera_cuda.h"

/* Paths are compile-time settings: a tenant must not be able to move them. */
#ifndef TESSERA_LIMITS_DIR
#define TESSERA_LIMITS_DIR "/run/tessera" /* api.ContainerLimitsDir */
#endif
#define TESSERA_LIMITS_PATH TESSERA_LIMITS_DIR "/limits"
#ifndef TESSERA_CONFIG_PATH
#define TESSERA_CONFIG_PATH "/etc/tessera/cuda-hook.conf"
#endif
/* Owner the administrator's config file must have (root in production). */
#ifndef TESSERA_CONFIG_OWNER
#define TESSERA_CONFIG_OWNER 0
#endif
#ifndef TESSERA_SHM_DIR
#define TESSERA_SHM_DIR "/dev/shm"
#endif
#define TESSERA_PACING_PERIOD_NS 20000000LL /* api.PacingPeriodMicros */

#define TESSERA_EXPORT __attribute__((visibility("default")))
#define MIB (1024ULL * 1024ULL)

/* The real-function table, generated from symbols.def. */
struct tessera_real {
#define TESSERA_CU_HOOK(name, proto, params) CUresult (*name) params;
#define TESSERA_CU_LEGACY(name, params) CUresult (*name) params;
#define TESSERA_CU_REAL(name, params) CUresult (*name) params;
#define TESSERA_NVML_HOOK(name, params) nvmlReturn_t (*name) params;
#define TESSERA_NVML_LEGACY(name, params) nvmlReturn_t (*name) params;
#define TESSERA_NVML_REAL(name, params) nvmlReturn_t (*name) params;
#include "symbols.def"
};

/* The hooks, exported under the driver's and NVML's own names. */
#define TESSERA_CU_HOOK(name, proto, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_CU_LEGACY(name, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_NVML_HOOK(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#define TESSERA_NVML_LEGACY(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#include "symbols.def"

/* This process's view of one GPU's pacing. */
struct tessera_pacer {
	struct tessera_shared_pacer *s;
	int enabled;
	int64_t slot_off_ns, slot_len_ns; /* the container's window in each period */
};
void tessera_pacing_setup(void);
void tessera_pace(CUstream stream);

/* Graph memory nodes (graph.c). A launch or upload of an executable graph that
 * allocates reserves its allocations first and settles on what the driver mapped
 * after; tessera_graph_execs counts such graphs so that the others pay one load. */
struct tessera_graph_ticket {
	int any;
	uint64_t exec;
	uint64_t held[TESSERA_MAX_GPUS];
};
extern _Atomic size_t tessera_graph_execs;
CUresult tessera_graph_admit_slow(CUgraphExec exec, struct tessera_graph_ticket *t);
void tessera_graph_admitted_slow(const struct tessera_graph_ticket *t, CUresult rc);
static inline CUresult tessera_graph_admit(CUgraphExec exec, struct tessera_graph_ticket *t)
{
	t->any = 0;
	if (atomic_load_explicit(&tessera_graph_execs, memory_order_relaxed) == 0)
		return CUDA_SUCCESS;
	return tessera_graph_admit_slow(exec, t);
}
static inline void tessera_graph_admitted(const struct tessera_graph_ticket *t, CUresult rc)
{
	if (t->any)
		tessera_graph_admitted_slow(t, rc);
}
/* Counts the graph pools at what the driver reserves; returns the bytes given back. */
uint64_t tessera_graph_settle(int gpu);
void tessera_graph_after_fork(void);
/* Everything cached memory the hook counts (stream-ordered and graph pools) settled on
 * what the driver holds; returns the bytes given back. */
uint64_t tessera_memory_settle(int gpu);

struct tessera_state {
	/* Set once by tessera_init; CUDA_SUCCESS, or the error every hook returns. */
	CUresult status;
	char why[512];
	struct tessera_limits limits;
	void *libcuda;
	struct tessera_real real;
	struct tessera_region *region;

	/* Devices, resolved after cuInit: the container sees limits.gpus[vis[i]] as CUDA
	 * device i; real_dev[g] is the driver's CUdevice of limits.gpus[g] (-1: absent). */
	pthread_mutex_t dev_mu;
	_Atomic int dev_ready;
	int nvis;
	int vis[TESSERA_MAX_GPUS];
	CUdevice real_dev[TESSERA_MAX_GPUS];

	/* NVML, loaded only when the program calls NVML. */
	pthread_mutex_t nvml_mu;
	void *libnvml;
	int nvml_ready;
	int nvml_nvis;
	nvmlDevice_t nvml_dev[TESSERA_MAX_GPUS]; /* by limits index; NULL: absent */
	int nvml_vis[TESSERA_MAX_GPUS];

	/* Open stream captures in this process: pacing never synchronizes during one. */
	_Atomic int captures;

	int pacing_any;  /* some GPU has 0 < cores < 100 */
	int pacing_only; /* the paced GPU when there is exactly one GPU, else -1 */
	struct tessera_pacer pacers[TESSERA_MAX_GPUS];
};

extern struct tessera_state tessera;

/* Sets up the state once; returns tessera.status. After the first call, one acquire
 * load (no call into libc) on every hook. */
extern _Atomic int tessera_ready;
CUresult tessera_init_slow(void);
static inline CUresult tessera_init(void)
{
	if (__builtin_expect(atomic_load_explicit(&tessera_ready, memory_order_acquire), 1))
		return tessera.status;
	return tessera_init_slow();
}
/* Resolves the container's devices; needs cuInit to have succeeded. */
CUresult tessera_devices(void);
/* The limits index of a driver CUdevice, or -1 if it is not the container's. */
int tessera_gpu_of_device(CUdevice dev);
/* The limits index of the calling thread's current context's device. */
CUresult tessera_current_gpu(int *gpu);
uint64_t tessera_limit_bytes(int gpu);
void tessera_context_after_fork(void);
/* Reserves bytes on gpu against its limit, giving back what pools have trimmed
 * before refusing (memory.c). */
CUresult tessera_reserve(int gpu, uint64_t bytes);
void tessera_memory_after_fork(void);
nvmlReturn_t tessera_nvml_init(void);
void tessera_format_uuid(const CUuuid *u, char *out, size_t len);
int tessera_same_uuid(const char *a, const char *b);

enum { TESSERA_LOG_ERROR, TESSERA_LOG_WARN, TESSERA_LOG_INFO, TESSERA_LOG_DEBUG };
void tessera_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic nanoseconds, and a cheaper tick count for the launch fast path. */
int64_t tessera_now_ns(void);

#define REAL(name) (tessera.real.name)

/* Every hook starts with this: set up once, then fail closed if that failed. */
#define HOOK_ENTER()                                                  \
	do {                                                          \
		CUresult hook_rc_ = tessera_init();                   \
		if (hook_rc_ != CUDA_SUCCESS)                         \
			return hook_rc_;                              \
	} while (0)
#define HOOK_REAL(name)                                               \
	do {                                                          \
		if (REAL(name) == NULL)                               \
			return CUDA_ERROR_NOT_FOUND;                  \
	} while (0)

#endif

/*
 * Compute pacing: a container with cores = c% of a GPU may keep the GPU busy for c% of
 * every pacing period, inside its own window of the period (phase .. phase+c), which
 * the node agent places so that the windows of the containers on one GPU do not
 * overlap. docs/cuda-hook.md gives the reasoning and the measurements.
 *
 * The window and its launch budget belong to the container, not to a process: they
 * live in the container's accounting region (region.c), so two processes at 50% share
 * one 50% window. While a window is open, a thread takes 16 launches at a time from
 * the shared budget (one at a time near the budget's end) with one atomic operation
 * and a clock read, and spends them with thread-local decrements: the window closes
 * when its time is up or when the launches issued would, at the estimated GPU time per
 * launch, fill it. Closing drains
 * the closing process's work (cuCtxSynchronize), which tells how long the work really
 * took; time past the window's end is owed and taken off the next windows. Then the
 * launching threads of the container sleep until its next window.
 * Counting launches as well as time keeps a program that queues far ahead of the GPU
 * from running past its window by the length of its queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>

#include "devices.h"
#include "graph.h"
#include "log.h"
#include "pacing.h"
#include "state.h"

/* Monotonic nanoseconds. */
static int64_t tessera_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The launch clock. All processes of a container read the same clock with the same
 * scale (the region keeps it), since they compare against one shared window end. */
static double ticks_per_ns = 1.0;
static int use_tsc;

#if defined(__x86_64__)
#include <x86intrin.h>
/* The TSC: clock_gettime costs about 40 ns in some VMs, which alone would be most of
 * the per-launch budget. */
static inline uint64_t ticks(void)
{
	return use_tsc ? __rdtsc() : (uint64_t)tessera_now_ns();
}
static void calibrate(double *tpn, int *tsc)
{
	int64_t t0 = tessera_now_ns();
	uint64_t c0 = __rdtsc();
	while (tessera_now_ns() - t0 < 2000000)
		;
	int64_t t1 = tessera_now_ns();
	uint64_t c1 = __rdtsc();
	*tpn = 1.0;
	*tsc = 0;
	if (c1 > c0 && t1 > t0) {
		*tpn = (double)(c1 - c0) / (double)(t1 - t0);
		*tsc = 1;
	}
}
#else
static inline uint64_t ticks(void) { return (uint64_t)tessera_now_ns(); }
static void calibrate(double *tpn, int *tsc)
{
	*tpn = 1.0;
	*tsc = 0;
}
#endif

#define MAX_WINDOW_LAUNCHES 65536
/* The fast path reads the clock on one launch in this many while the window has more
 * launches left than that. */
#define CLOCK_EVERY 16
/* A drain that took longer than this means the GPU was still busy with the window's
 * work when it closed. */
#define DRAIN_WAITED_NS 20000

void tessera_pacing_setup(void)
{
	int paced = 0, last = -1;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &tessera.pacers[g];
		const struct tessera_gpu_limit *l = &tessera.limits.gpus[g];
		p->s = tessera_region_pacer(tessera.region, g);
		p->enabled = l->cores > 0 && l->cores < 100;
		p->slot_off_ns = TESSERA_PACING_PERIOD_NS * l->phase / 100;
		p->slot_len_ns = TESSERA_PACING_PERIOD_NS * l->cores / 100;
		if (p->enabled) {
			paced++;
			last = g;
		}
	}
	tessera.pacing_any = paced > 0;
	tessera.pacing_only = tessera.limits.ngpus == 1 ? last : -1;
	if (paced > 0)
		tessera_region_clock(tessera.region, calibrate, &ticks_per_ns, &use_tsc);
}

static int pacer_lock(struct tessera_shared_pacer *s)
{
	int rc = pthread_mutex_lock(&s->mu);
	if (rc == EOWNERDEAD) {
		/* A process died holding it, most likely in a drain: the state is whole, and
		 * a window it was closing is opened by the next launch. */
		pthread_mutex_consistent(&s->mu);
		return 0;
	}
	return rc;
}

/*
 * The pacer lives in the container's region, which any of its processes can write.
 * Values no pacer reaches (a debt or estimate out of range, a window in the future, a
 * budget past the most a window gives) are reset to a closed window with no history
 * before they are used (caller holds s->mu), so that no arithmetic on them overflows
 * and no sleep is computed from them. A tenant gains nothing by this that rewriting
 * the pacer consistently would not give it (docs/cuda-hook.md).
 */
static void pacer_check(struct tessera_shared_pacer *s, int64_t now)
{
	const int64_t P = TESSERA_PACING_PERIOD_NS, far = 3600LL * 1000000000LL;
	int64_t budget = atomic_load(&s->budget);
	int ok = (s->open == 0 || s->open == 1) && s->debt_ns >= 0 && s->debt_ns <= far && s->allow_start_ns >= 0 &&
		 s->allow_start_ns <= now + P && s->allow_end_ns >= s->allow_start_ns - P &&
		 s->allow_end_ns <= s->allow_start_ns + P && s->drained_ns >= 0 && s->drained_ns <= now + far &&
		 s->win_open_ns >= 0 && s->win_open_ns <= now + far && s->win_budget >= 0 &&
		 s->win_budget <= MAX_WINDOW_LAUNCHES && budget >= -((int64_t)1 << 40) && budget <= MAX_WINDOW_LAUNCHES &&
		 s->ns_per_launch >= 0 && s->ns_per_launch <= (double)far;
	if (ok)
		return;
	static _Atomic int logged;
	if (atomic_exchange(&logged, 1) == 0)
		tessera_log(TESSERA_LOG_ERROR, "the container's compute pacer was damaged; starting it afresh");
	atomic_store(&s->budget, 0);
	atomic_store(&s->window_end, 0);
	s->open = 0;
	s->allow_start_ns = s->allow_end_ns = s->debt_ns = s->drained_ns = s->win_open_ns = s->win_budget = 0;
	s->ns_per_launch = 0;
}

static void sleep_until(int64_t t)
{
	struct timespec ts = {.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Opens a window at now (caller holds s->mu) in the slot that contains now and returns
 * 1, or returns 0 with *wake set to the start of the next slot when this one has no
 * allowance left. Debt is paid by the slots that pass: a slot the container leaves
 * unused pays its whole length, a slot it uses pays from its start. */
static int open_window(struct tessera_pacer *p, int64_t now, int64_t *wake)
{
	struct tessera_shared_pacer *s = p->s;
	const int64_t P = TESSERA_PACING_PERIOD_NS, len = p->slot_len_ns;
	int64_t k = (now - p->slot_off_ns) / P;
	if (now < p->slot_off_ns + k * P)
		k--;
	int64_t start = k * P + p->slot_off_ns;
	if (s->allow_start_ns != start) {
		if (s->allow_start_ns != 0 && start > s->allow_start_ns) {
			int64_t skipped = (start - s->allow_start_ns) / P - 1;
			s->debt_ns = skipped * len >= s->debt_ns ? 0 : s->debt_ns - skipped * len;
		}
		int64_t pay = s->debt_ns < len ? s->debt_ns : len;
		s->debt_ns -= pay;
		s->allow_start_ns = start;
		s->allow_end_ns = start + len - pay;
	}
	if (now >= s->allow_end_ns) {
		*wake = start + P;
		return 0;
	}
	int64_t left = s->allow_end_ns - now;
	int64_t n = s->ns_per_launch > 0 ? (int64_t)((double)left / s->ns_per_launch) : 1;
	if (n < 1)
		n = 1;
	if (n > MAX_WINDOW_LAUNCHES)
		n = MAX_WINDOW_LAUNCHES;
	s->open = 1;
	s->win_open_ns = now;
	s->win_budget = n;
	atomic_store(&s->budget, n);
	atomic_store_explicit(&s->window_end, ticks() + (uint64_t)((double)left * ticks_per_ns), memory_order_release);
	return 1;
}

static int capturing(CUstream stream)
{
	CUstreamCaptureStatus st;
	if (atomic_load(&tessera.captures) > 0)
		return 1;
	return REAL(cuStreamIsCapturing) != NULL && REAL(cuStreamIsCapturing)(stream, &st) == CUDA_SUCCESS &&
	       st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Closes the open window (caller holds s->mu): drains this process's work, which tells
 * how long the window's work really took, and counts what ran past the allowance. */
static int64_t close_window(struct tessera_shared_pacer *s)
{
	int64_t launched = s->win_budget - atomic_load(&s->budget);
	atomic_store(&s->budget, 0);
	atomic_store(&s->window_end, 0);
	s->open = 0;
	int64_t t0 = tessera_now_ns();
	if (REAL(cuCtxSynchronize) != NULL)
		REAL(cuCtxSynchronize)();
	int64_t now = tessera_now_ns();
	if (now - t0 > DRAIN_WAITED_NS) {
		/* The GPU was busy until now: what ran past the allowance is owed, counted once
		 * however many drains reach past it. */
		int64_t from = s->allow_end_ns > s->drained_ns ? s->allow_end_ns : s->drained_ns;
		if (now > from)
			s->debt_ns += now - from;
		if (launched > 0) {
			double sample = (double)(now - s->win_open_ns) / (double)launched;
			s->ns_per_launch = s->ns_per_launch > 0 ? 0.7 * s->ns_per_launch + 0.3 * sample : sample;
		}
	} else if (launched > 0) {
		/* The GPU went idle at some unknown earlier time: no debt, and the window's wall
		 * time per launch is only an upper bound of the GPU time per launch. It still
		 * bounds the estimate, so that a program of short kernels gets windows of many
		 * launches rather than a drain on every launch. */
		double bound = (double)(now - s->win_open_ns) / (double)launched;
		if (s->ns_per_launch <= 0 || bound < s->ns_per_launch)
			s->ns_per_launch = bound;
	}
	if (now > s->drained_ns)
		s->drained_ns = now;
	return now;
}

/* Waits (asleep, without the lock, so that every launching thread of the container
 * gets its turn when the window opens) until a window is open, and takes a launch. */
static void slow_path(struct tessera_pacer *p, CUstream stream)
{
	struct tessera_shared_pacer *s = p->s;
	/* Give back the launch the fast path took: budget counts issued launches exactly. */
	atomic_fetch_add(&s->budget, 1);
	for (;;) {
		if (pacer_lock(s) != 0)
			return; /* cannot happen with a robust mutex made consistent; do not block */
		if (atomic_load(&s->budget) > 0 && ticks() < atomic_load(&s->window_end)) {
			/* Another thread or process opened a new window. */
			atomic_fetch_sub(&s->budget, 1);
			pthread_mutex_unlock(&s->mu);
			return;
		}
		/* Work captured into a graph does not run now (its graph launch is paced), and a
		 * synchronize would break the capture. */
		if (capturing(stream)) {
			pthread_mutex_unlock(&s->mu);
			return;
		}
		pacer_check(s, tessera_now_ns());
		int64_t now = s->open ? close_window(s) : tessera_now_ns(), wake;
		if (open_window(p, now, &wake)) {
			atomic_fetch_sub(&s->budget, 1);
			pthread_mutex_unlock(&s->mu);
			return;
		}
		pthread_mutex_unlock(&s->mu);
		sleep_until(wake);
	}
}

/* Launches a thread took from the open window's budget ahead of use, and which window
 * (its end, which no two windows share) and pacer they came from. Initial-exec TLS: a
 * plain load from the thread pointer, not a __tls_get_addr call; the hook is loaded at
 * process start (LD_PRELOAD or /etc/ld.so.preload), where static TLS has room. */
#define TLS_IE __attribute__((tls_model("initial-exec")))
static __thread int64_t local_left TLS_IE;
static __thread uint64_t local_window TLS_IE;
static __thread const struct tessera_shared_pacer *local_pacer TLS_IE;

void tessera_pace(CUstream stream)
{
	int g = tessera.pacing_only;
	if (!tessera.pacing_any)
		return;
	if (g < 0 && tessera_current_gpu(&g) != CUDA_SUCCESS)
		return; /* the launch itself will report the problem */
	struct tessera_pacer *p = &tessera.pacers[g];
	if (!p->enabled)
		return;
	struct tessera_shared_pacer *s = p->s;
	/* No locked instruction per launch: after the driver has written a launch to the
	 * GPU's command buffer, one waits for those writes to drain (measured +40 ns per
	 * launch on an H200 host). A thread takes CLOCK_EVERY launches at a time while
	 * the window has many left, and spends them with plain thread-local decrements. */
	if (local_left > 0 && local_pacer == s &&
	    local_window == atomic_load_explicit(&s->window_end, memory_order_relaxed)) {
		local_left--;
		return;
	}
	local_left = 0;
	int64_t take = atomic_load_explicit(&s->budget, memory_order_relaxed) > 4 * CLOCK_EVERY ? CLOCK_EVERY : 1;
	int64_t left = atomic_fetch_sub_explicit(&s->budget, take, memory_order_relaxed);
	if (left >= take) {
		/* The clock is read once per take: with many launches left, a window that ends
		 * by time runs over by fewer than CLOCK_EVERY launches per launching thread,
		 * each estimated at under 1/(4 CLOCK_EVERY) of the window's GPU time; near the
		 * budget's end, on every launch. */
		uint64_t end = atomic_load_explicit(&s->window_end, memory_order_acquire);
		if (ticks() < end) {
			local_left = take - 1;
			local_window = end;
			local_pacer = s;
			return;
		}
	}
	/* The slow path gives back the one launch it was taken for. */
	if (take > 1)
		atomic_fetch_add_explicit(&s->budget, take - 1, memory_order_relaxed);
	slow_path(p, stream);
}

/* ---- the launch hooks ------------------------------------------------------- */

#define LAUNCH_HOOK(name, stream, args) \
	HOOK_ENTER();                   \
	HOOK_REAL(name);                \
	tessera_pace(stream);           \
	return REAL(name) args

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernel, s, (f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
			     unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernel_ptsz, s, (f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernelEx, config ? config->hStream : NULL, (config, f, params, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernelEx_ptsz, config ? config->hStream : NULL, (config, f, params, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
				   unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params)
{
	LAUNCH_HOOK(cuLaunchCooperativeKernel, s, (f, gx, gy, gz, bx, by, bz, shm, s, params));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
					unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params)
{
	LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, s, (f, gx, gy, gz, bx, by, bz, shm, s, params));
}

/* A graph with memory nodes reserves what it allocates before it is launched
 * (graph.c); the others pay one relaxed load for that. */
#define GRAPH_LAUNCH_HOOK(name, g, s)                                  \
	HOOK_ENTER();                                                  \
	HOOK_REAL(name);                                               \
	struct tessera_graph_ticket t_;                                \
	CUresult rc = tessera_graph_admit(g, &t_);                     \
	if (rc != CUDA_SUCCESS)                                        \
		return rc;                                             \
	tessera_pace(s);                                               \
	rc = REAL(name)(g, s);                                         \
	tessera_graph_admitted(&t_, rc);                               \
	return rc

CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	GRAPH_LAUNCH_HOOK(cuGraphLaunch, g, s);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
	GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, g, s);
}

/* ---- stream capture bookkeeping --------------------------------------------- */

#define BEGIN_CAPTURE(name, args)                              \
	HOOK_ENTER();                                          \
	HOOK_REAL(name);                                       \
	CUresult rc = REAL(name) args;                         \
	if (rc == CUDA_SUCCESS)                                \
		atomic_fetch_add(&tessera.captures, 1);        \
	return rc

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(cuStreamBeginCapture_v2, (s, mode));
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (s, mode));
}

CUresult cuStreamBeginCapture(CUstream s)
{
	BEGIN_CAPTURE(cuStreamBeginCapture, (s));
}

CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (s));
}

CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
				     size_t n, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, (s, g, deps, data, n, mode));
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
					  size_t n, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, (s, g, deps, data, n, mode));
}

/* A capture ends with EndCapture whether or not it succeeded (an invalidated capture
 * is ended too), so every call ends one capture that BeginCapture counted. */
static CUresult end_capture(CUresult rc)
{
	int n = atomic_load(&tessera.captures);
	while (n > 0 && !atomic_compare_exchange_weak(&tessera.captures, &n, n - 1))
		;
	return rc;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	HOOK_ENTER();
	HOOK_REAL(cuStreamEndCapture);
	return end_capture(REAL(cuStreamEndCapture)(s, g));
}

CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	HOOK_ENTER();
	HOOK_REAL(cuStreamEndCapture_ptsz);
	return end_capture(REAL(cuStreamEndCapture_ptsz)(s, g));
}

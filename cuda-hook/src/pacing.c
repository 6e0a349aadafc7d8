/*
 * Compute pacing: a container with cores = c% of a GPU may keep the GPU busy for c% of
 * every pacing period, inside its own window of the period (phase .. phase+c), which
 * the node agent places so that the windows of the containers on one GPU do not
 * overlap. docs/cuda-hook.md gives the reasoning and the measurements.
 *
 * While a window is open, a launch costs a clock read and one atomic decrement: the
 * window closes when its time is up or when the launches issued would, at the
 * estimated GPU time per launch, fill it. Closing drains the GPU (cuCtxSynchronize),
 * which tells how long the work really took; time past the window's end is owed and
 * taken off the next windows. Then the launching thread sleeps until its next window.
 * Counting launches as well as time keeps a program that queues far ahead of the GPU
 * from running past its window by the length of its queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>

#include "hook.h"

#if defined(__x86_64__)
#include <x86intrin.h>
/* The TSC, scaled at set-up: clock_gettime costs about 40 ns in some VMs, which alone
 * would be most of the per-launch budget. */
static double ticks_per_ns = 1.0;
static int use_tsc;
static inline uint64_t ticks(void)
{
	return use_tsc ? __rdtsc() : (uint64_t)tessera_now_ns();
}
static void calibrate(void)
{
	int64_t t0 = tessera_now_ns();
	uint64_t c0 = __rdtsc();
	while (tessera_now_ns() - t0 < 2000000)
		;
	int64_t t1 = tessera_now_ns();
	uint64_t c1 = __rdtsc();
	if (c1 > c0 && t1 > t0) {
		ticks_per_ns = (double)(c1 - c0) / (double)(t1 - t0);
		use_tsc = 1;
	}
}
#else
static const double ticks_per_ns = 1.0;
static inline uint64_t ticks(void) { return (uint64_t)tessera_now_ns(); }
static void calibrate(void) {}
#endif

#define MAX_WINDOW_LAUNCHES 65536

void tessera_pacing_setup(void)
{
	int paced = 0, last = -1;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &tessera.pacers[g];
		const struct tessera_gpu_limit *l = &tessera.limits.gpus[g];
		pthread_mutex_init(&p->mu, NULL);
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
		calibrate();
}

void tessera_pacing_after_fork(void)
{
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &tessera.pacers[g];
		pthread_mutex_init(&p->mu, NULL);
		p->open = 0;
		p->debt_ns = 0;
		p->allow_start_ns = p->allow_end_ns = 0;
		atomic_store(&p->budget, 0);
		atomic_store(&p->window_end, 0);
	}
}

static void sleep_until(int64_t t)
{
	struct timespec ts = {.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Opens a window at now (caller holds p->mu) in the slot that contains now, or sleeps
 * until a slot with allowance left. Debt is paid by the slots that pass: a slot the
 * program leaves unused pays its whole length, a slot it uses pays from its start. */
static void open_window(struct tessera_pacer *p, int64_t now)
{
	const int64_t P = TESSERA_PACING_PERIOD_NS, len = p->slot_len_ns;
	for (;;) {
		int64_t k = (now - p->slot_off_ns) / P;
		if (now < p->slot_off_ns + k * P)
			k--;
		int64_t start = k * P + p->slot_off_ns;
		if (p->allow_start_ns != start) {
			if (p->allow_start_ns != 0 && start > p->allow_start_ns) {
				int64_t skipped = (start - p->allow_start_ns) / P - 1;
				p->debt_ns = skipped * len >= p->debt_ns ? 0 : p->debt_ns - skipped * len;
			}
			int64_t pay = p->debt_ns < len ? p->debt_ns : len;
			p->debt_ns -= pay;
			p->allow_start_ns = start;
			p->allow_end_ns = start + len - pay;
		}
		if (now < p->allow_end_ns)
			break;
		sleep_until(start + P);
		now = tessera_now_ns();
	}
	int64_t left = p->allow_end_ns - now;
	int64_t n = p->ns_per_launch > 0 ? (int64_t)((double)left / p->ns_per_launch) : 1;
	if (n < 1)
		n = 1;
	if (n > MAX_WINDOW_LAUNCHES)
		n = MAX_WINDOW_LAUNCHES;
	p->open = 1;
	p->win_open_ns = now;
	p->win_budget = n;
	atomic_store(&p->budget, n);
	atomic_store_explicit(&p->window_end, ticks() + (uint64_t)((double)left * ticks_per_ns), memory_order_release);
}

static int capturing(CUstream stream)
{
	CUstreamCaptureStatus st;
	if (atomic_load(&tessera.captures) > 0)
		return 1;
	return REAL(cuStreamIsCapturing) != NULL && REAL(cuStreamIsCapturing)(stream, &st) == CUDA_SUCCESS &&
	       st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void slow_path(struct tessera_pacer *p, CUstream stream)
{
	/* Give back the launch the fast path took: budget counts issued launches exactly. */
	atomic_fetch_add(&p->budget, 1);
	pthread_mutex_lock(&p->mu);
	if (atomic_load(&p->budget) > 0 && ticks() < atomic_load(&p->window_end)) {
		/* Another thread opened a new window while this one waited. */
		atomic_fetch_sub(&p->budget, 1);
		pthread_mutex_unlock(&p->mu);
		return;
	}
	/* Work captured into a graph does not run now (its graph launch is paced), and a
	 * synchronize would break the capture. */
	if (capturing(stream)) {
		pthread_mutex_unlock(&p->mu);
		return;
	}
	int64_t now = tessera_now_ns();
	if (p->open) {
		int64_t launched = p->win_budget - atomic_load(&p->budget);
		atomic_store(&p->budget, 0);
		atomic_store(&p->window_end, 0);
		int64_t t0 = tessera_now_ns();
		if (REAL(cuCtxSynchronize) != NULL)
			REAL(cuCtxSynchronize)();
		now = tessera_now_ns();
		/* If the drain did not wait, the GPU went idle at some unknown earlier time: the
		 * program was not keeping it busy, so there is neither debt nor a sample. */
		if (now - t0 > 20000) {
			if (now > p->allow_end_ns)
				p->debt_ns += now - p->allow_end_ns;
			if (launched > 0) {
				double sample = (double)(now - p->win_open_ns) / (double)launched;
				p->ns_per_launch = p->ns_per_launch > 0 ? 0.7 * p->ns_per_launch + 0.3 * sample : sample;
			}
		}
		p->open = 0;
	}
	open_window(p, now);
	atomic_fetch_sub(&p->budget, 1);
	pthread_mutex_unlock(&p->mu);
}

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
	if (atomic_fetch_sub_explicit(&p->budget, 1, memory_order_relaxed) > 0 &&
	    ticks() < atomic_load_explicit(&p->window_end, memory_order_acquire))
		return;
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

CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	LAUNCH_HOOK(cuGraphLaunch, s, (g, s));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
	LAUNCH_HOOK(cuGraphLaunch_ptsz, s, (g, s));
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The launch and capture hooks: every kernel and graph launch is paced (pacing.c)
 * around the driver's launch; a graph with memory nodes reserves what it allocates
 * first (graph.c); a stream's end and the stream captures are told to pacing and to
 * the residency probes (residency.c), which make no event call during a capture.
 * docs/cuda-hook.md gives the reasoning.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>

#include "graph.h"
#include "interpose.h"
#include "pacing.h"
#include "residency.h"
#include "state.h"

#include "pace_trace.h"

/* ---- the launch hooks ------------------------------------------------------- */

/* A kernel's entry is its function's at one grid size: one function runs for very
 * different lengths at different sizes (PyTorch's elementwise kernels serve every
 * tensor of a type, a 4 KiB bias and a 100 MiB activation alike), while one function
 * at one grid runs for about the same time launch after launch. */
static inline uintptr_t kernel_key(CUfunction f, uint64_t blocks)
{
	TRACE_FN(f);
	return f == NULL ? 0 : (uintptr_t)f ^ (uintptr_t)(blocks * 0x9e3779b97f4a7c15ULL);
}
#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

/* A _ptsz entry point's stream 0 is the calling thread's per-thread default stream;
 * to the functions pacing calls on it (cuEventRecord, cuStreamIsCapturing,
 * cuMemsetD32Async), 0 is the legacy stream, whose work waits for every blocking
 * stream's and holds theirs back: pacing names the per-thread stream by its handle. */
#define PTSZ(s) ((s) != NULL ? (s) : CU_STREAM_PER_THREAD)

#define LAUNCH_HOOK(name, f, grid, stream, args)               \
	HOOK_ENTER();                                          \
	HOOK_REAL(name);                                       \
	struct tessera_pace_ticket pt_;                        \
	tessera_pace(stream, 0, kernel_key(f, grid), &pt_);    \
	CUresult lrc_ = REAL(name) args;                       \
	tessera_pace_done(stream, &pt_, lrc_);                 \
	return lrc_

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernel, f, GRID(gx, gy, gz), s, (f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
			     unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernel_ptsz, f, GRID(gx, gy, gz), PTSZ(s), (f, gx, gy, gz, bx, by, bz, shm, s, params, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernelEx, f, config ? GRID(config->gridDimX, config->gridDimY, config->gridDimZ) : 0,
		    config ? config->hStream : NULL, (config, f, params, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	LAUNCH_HOOK(cuLaunchKernelEx_ptsz, f, config ? GRID(config->gridDimX, config->gridDimY, config->gridDimZ) : 0,
		    PTSZ(config ? config->hStream : NULL), (config, f, params, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
				   unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params)
{
	LAUNCH_HOOK(cuLaunchCooperativeKernel, f, GRID(gx, gy, gz), s, (f, gx, gy, gz, bx, by, bz, shm, s, params));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
					unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params)
{
	LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, f, GRID(gx, gy, gz), PTSZ(s), (f, gx, gy, gz, bx, by, bz, shm, s, params));
}

/* One kernel on each of several GPUs in one call (deprecated since CUDA 11.3; the
 * driver still runs it). Each entry is paced before the call as a launch on its
 * stream's GPU, with that stream's context current meanwhile (the pacer, the launch
 * sample's events and the GPU's turns are the context's), and the caller's context
 * is current again after. A list longer than the GPUs a process can have is refused
 * rather than run unpaced: the driver allows one entry per GPU. */
#define MULTI_DEVICE_MAX 64
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n, unsigned int flags)
{
	HOOK_ENTER();
	HOOK_REAL(cuLaunchCooperativeKernelMultiDevice);
	if (list == NULL || n == 0)
		return REAL(cuLaunchCooperativeKernelMultiDevice)(list, n, flags);
	if (n > MULTI_DEVICE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	struct tessera_pace_ticket pt[MULTI_DEVICE_MAX];
	CUcontext ctx[MULTI_DEVICE_MAX], cur = NULL;
	if (REAL(cuCtxGetCurrent)(&cur) != CUDA_SUCCESS)
		cur = NULL;
	for (unsigned int i = 0; i < n; i++) {
		ctx[i] = cur;
		if (list[i].hStream != NULL && REAL(cuStreamGetCtx) != NULL &&
		    (REAL(cuStreamGetCtx)(list[i].hStream, &ctx[i]) != CUDA_SUCCESS || ctx[i] == NULL))
			ctx[i] = cur;
		if (ctx[i] != cur && REAL(cuCtxSetCurrent)(ctx[i]) != CUDA_SUCCESS)
			ctx[i] = cur;
		tessera_pace(list[i].hStream, 0,
			     kernel_key(list[i].function, GRID(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ)), &pt[i]);
		if (ctx[i] != cur)
			REAL(cuCtxSetCurrent)(cur);
	}
	CUresult rc = REAL(cuLaunchCooperativeKernelMultiDevice)(list, n, flags);
	for (unsigned int i = 0; i < n; i++) {
		if (!pt[i].sampled)
			continue;
		if (ctx[i] != cur)
			REAL(cuCtxSetCurrent)(ctx[i]);
		tessera_pace_done(list[i].hStream, &pt[i], rc);
		if (ctx[i] != cur)
			REAL(cuCtxSetCurrent)(cur);
	}
	return rc;
}

/* The first driver API's launches: cuLaunch and cuLaunchGrid run on the legacy default
 * stream. */
CUresult cuLaunch(CUfunction f)
{
	LAUNCH_HOOK(cuLaunch, f, 1, NULL, (f));
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
	LAUNCH_HOOK(cuLaunchGrid, f, GRID(grid_width, grid_height, 1), NULL, (f, grid_width, grid_height));
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream s)
{
	LAUNCH_HOOK(cuLaunchGridAsync, f, GRID(grid_width, grid_height, 1), s, (f, grid_width, grid_height, s));
}

/* A graph with memory nodes reserves what it allocates before it is launched
 * (graph.c); the others pay one relaxed load for that. */
#define GRAPH_LAUNCH_HOOK(name, g, s, paced)                            \
	HOOK_ENTER();                                                  \
	HOOK_REAL(name);                                               \
	struct tessera_graph_ticket t_;                                \
	CUresult rc = tessera_graph_admit(g, &t_);                     \
	if (rc != CUDA_SUCCESS)                                        \
		return rc;                                             \
	struct tessera_pace_ticket pt_;                                \
	tessera_pace(paced, 1, (uintptr_t)(g), &pt_);                  \
	rc = REAL(name)(g, s);                                         \
	tessera_pace_done(paced, &pt_, rc);                            \
	tessera_graph_admitted(&t_, rc);                               \
	return rc

CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	GRAPH_LAUNCH_HOOK(cuGraphLaunch, g, s, s);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
	GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, g, s, PTSZ(s));
}

/* ---- stream capture bookkeeping --------------------------------------------- */

/* The capture is counted before it begins, and the residency probes' thread is let
 * finish any driver call it is in: from then on neither it nor a launch sample makes
 * an event call that a capture in global mode would refuse (and be invalidated by). */
#define BEGIN_CAPTURE(name, args)                              \
	HOOK_ENTER();                                          \
	HOOK_REAL(name);                                       \
	atomic_fetch_add(&tessera.captures, 1);                \
	tessera_residency_quiesce();                           \
	CUresult rc = REAL(name) args;                         \
	if (rc != CUDA_SUCCESS)                                \
		atomic_fetch_sub(&tessera.captures, 1);        \
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

/* ---- streams ----------------------------------------------------------------- */

/* A stream's end: pacing records nothing on it from now on. */
CUresult cuStreamDestroy_v2(CUstream stream)
{
	HOOK_ENTER();
	HOOK_REAL(cuStreamDestroy_v2);
	tessera_pacing_forget_stream(stream);
	return REAL(cuStreamDestroy_v2)(stream);
}

CUresult cuStreamDestroy(CUstream stream)
{
	HOOK_ENTER();
	HOOK_REAL(cuStreamDestroy);
	tessera_pacing_forget_stream(stream);
	return REAL(cuStreamDestroy)(stream);
}

/* ---- synchronizes ------------------------------------------------------------- */

/* The program waits for its work: the burst pacing measures ends before the wait
 * (pacing.c, tessera_pacing_sync), so that no burst's elapsed time spans the GPU
 * idling while the host wakes and issues its next launch. */
#define SYNC_HOOK(name, args)                \
	HOOK_ENTER();                        \
	HOOK_REAL(name);                     \
	int synced_gpu = tessera_pacing_sync(); \
	CUresult synced = REAL(name) args;   \
	tessera_pacing_synced(synced_gpu);   \
	return synced

CUresult cuCtxSynchronize(void)
{
	SYNC_HOOK(cuCtxSynchronize, ());
}

CUresult cuStreamSynchronize(CUstream stream)
{
	SYNC_HOOK(cuStreamSynchronize, (stream));
}

CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
	SYNC_HOOK(cuStreamSynchronize_ptsz, (stream));
}

CUresult cuEventSynchronize(CUevent event)
{
	SYNC_HOOK(cuEventSynchronize, (event));
}

/* A program may wait for its work by polling instead (TensorFlow's event manager and
 * XLA's host callbacks query events in a loop; a serving loop may query its stream
 * between requests). A query that finds the work done is where such a program's wait
 * ends: the open burst ends there as at a synchronize, and its next launch opens the
 * next one, so that its bursts do not span the host's work between steps. The burst
 * ended after the GPU went idle, so it holds the idle time since the work finished
 * (one poll's interval in a polling loop), not the host's whole gap. Reading the
 * ended burst never waits here (tessera_pacing_polled reads it only where it has
 * run): a query stays a query. A query that finds work still queued changes nothing. */
#define QUERY_HOOK(name, args)                                  \
	HOOK_ENTER();                                           \
	HOOK_REAL(name);                                        \
	CUresult queried = REAL(name) args;                     \
	if (queried == CUDA_SUCCESS)                            \
		tessera_pacing_polled();                        \
	return queried

CUresult cuStreamQuery(CUstream stream)
{
	QUERY_HOOK(cuStreamQuery, (stream));
}

CUresult cuStreamQuery_ptsz(CUstream stream)
{
	QUERY_HOOK(cuStreamQuery_ptsz, (stream));
}

CUresult cuEventQuery(CUevent event)
{
	QUERY_HOOK(cuEventQuery, (event));
}

/* A synchronous copy to or from the host waits for the work queued before it on its
 * stream (the legacy stream: all of the context's blocking streams) and returns once
 * the copy has run or its source is staged: numba's copy_to_host, CuPy's and the CUDA
 * runtime's cudaMemcpy, and C programs that read their results back every step wait
 * for their work this way, not by a synchronize, and their bursts would span the
 * host's work between steps. The burst ends before the copy, as at a synchronize. A
 * cuMemcpy between two device buffers does not wait: the burst ended before it is
 * read later, where it has run (tessera_pacing_synced never waits). */
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	SYNC_HOOK(cuMemcpyDtoH_v2, (dst, src, n));
}

CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	SYNC_HOOK(cuMemcpyDtoH_v2_ptds, (dst, src, n));
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	SYNC_HOOK(cuMemcpyHtoD_v2, (dst, src, n));
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	SYNC_HOOK(cuMemcpyHtoD_v2_ptds, (dst, src, n));
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	SYNC_HOOK(cuMemcpy, (dst, src, n));
}

CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	SYNC_HOOK(cuMemcpy_ptds, (dst, src, n));
}

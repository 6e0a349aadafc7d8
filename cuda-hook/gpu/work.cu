/* SPDX-License-Identifier: Apache-2.0 */
// Workloads of the B4 compute-limit matrix (gpu/b4-matrix.sh), through the driver API
// so that every launch goes through the hook's launch hooks:
//
//   work calib <us>                          FMA iterations for a kernel of about <us>
//                                            microseconds on this GPU (run unhooked)
//   work kernel <iters> <seconds>            FMA kernels back to back (the queue kept
//                                            full, as a training step's matmuls do)
//   work graph <iters> <seconds>             a CUDA graph of 10 such kernels, back to back
//   work loop <iters> <host-us> <seconds>    a launch-bound loop: 10 small kernels, then
//                                            <host-us> of host work, then a synchronize
//                                            (a training step's loss.item()), again
//
// Each prints rate=<iterations per second> over <seconds> after a warm-up, from a
// synchronize to a synchronize, and that interval's start and end (t0_us, t1_us:
// microseconds since the epoch, for NVML's utilisation samples).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_check.h"

// Fixed arithmetic per thread: a kernel's run time is GPU time actually given to it.
// Unmangled: gpu/legacy_launch.c loads it by name from this file's cubin.
extern "C" __global__ void fma_kernel(float *out, int iters)
{
	float a = threadIdx.x * 1e-3f, b = 1.0001f;
	for (int i = 0; i < iters; i++)
		a = fmaf(a, b, 1e-7f);
	if (a == 12345.f)
		out[0] = a;
}

/* driver_check.h's epoch_s in microseconds, as the scripts read the field. */
static long long epoch_us(void)
{
	return (long long)(epoch_s() * 1e6);
}

static int sms;
static float *out;

static void launch(int iters, cudaStream_t s)
{
	fma_kernel<<<sms, 256, 0, s>>>(out, iters);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: work calib <us> | kernel <iters> <s> | graph <iters> <s> | loop <iters> <host-us> <s>\n");
		return 2;
	}
	const char *mode = argv[1];
	CKRT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	CKRT(cudaMalloc(&out, 4));
	cudaStream_t st;
	CKRT(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	if (strcmp(mode, "calib") == 0) {
		double us = atof(argv[2]);
		cudaEvent_t a, b;
		CKRT(cudaEventCreate(&a));
		CKRT(cudaEventCreate(&b));
		int iters = 1000;
		for (int round = 0; round < 6; round++) {
			launch(iters, st);
			CKRT(cudaEventRecord(a, st));
			for (int i = 0; i < 5; i++)
				launch(iters, st);
			CKRT(cudaEventRecord(b, st));
			CKRT(cudaEventSynchronize(b));
			float ms;
			CKRT(cudaEventElapsedTime(&ms, a, b));
			double per = ms * 1000.0 / 5;
			iters = (int)(iters * us / per);
			if (iters < 1)
				iters = 1;
		}
		printf("iters=%d\n", iters);
		return 0;
	}
	int iters = atoi(argv[2]);
	double seconds = atof(argv[argc - 1]);
	double host_us = strcmp(mode, "loop") == 0 && argc == 5 ? atof(argv[3]) : 0;
	cudaGraphExec_t exec = NULL;
	if (strcmp(mode, "graph") == 0) {
		cudaGraph_t g;
		CKRT(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
		for (int i = 0; i < 10; i++)
			launch(iters, st);
		CKRT(cudaStreamEndCapture(st, &g));
		CKRT(cudaGraphInstantiate(&exec, g, 0));
	} else if (strcmp(mode, "kernel") != 0 && strcmp(mode, "loop") != 0) {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	long n = 0;
	long long e0 = 0;
	double t0 = 0, warm = 0.4;
	double start = now_s();
	for (;;) {
		double t = now_s();
		if (t0 == 0 && t - start >= warm) {
			CKRT(cudaStreamSynchronize(st));
			t0 = now_s();
			e0 = epoch_us();
			n = 0;
		}
		if (t0 != 0 && t - t0 >= seconds)
			break;
		if (exec != NULL) {
			CKRT(cudaGraphLaunch(exec, st));
		} else if (host_us > 0) {
			for (int i = 0; i < 10; i++)
				launch(iters, st);
			double h = now_s();
			while ((now_s() - h) * 1e6 < host_us)
				;
			CKRT(cudaStreamSynchronize(st));
		} else {
			launch(iters, st);
		}
		n++;
	}
	CKRT(cudaStreamSynchronize(st));
	CKRT(cudaGetLastError());
	double wall = now_s() - t0;
	printf("rate=%.3f n=%ld wall=%.3f t0_us=%lld t1_us=%lld\n", n / wall, n, wall, e0, epoch_us());
	return 0;
}

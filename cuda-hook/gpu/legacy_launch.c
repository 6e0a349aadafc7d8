/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deprecated launches on a real GPU (make test-gpu): gpu/work.cu's compute-bound
 * fma_kernel, from its cubin, launched back to back for <seconds> with the first
 * driver API's cuLaunchGridAsync (block shape and parameters set on the function
 * first, as that API has it), with cuLaunchCooperativeKernelMultiDevice (one entry, on
 * a stream of the GPU's context; multi2: one entry on each of GPUs 0 and 1, GPU 0's
 * context current), or with cuLaunchKernel for comparison. Prints the launch rate;
 * run with and without the hook, the ratio is the share pacing gave it. "multi" on a
 * GPU without cooperative multi-device launches prints "unsupported".
 *
 *   legacy_launch <work.cubin> <grid|multi|multi2|kernel> <iters> <seconds>
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/clock.h"
#include "driver_check.h"

/* Deprecated long ago, and no longer declared by every cuda.h; drivers still run them. */
CUresult cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z);
CUresult cuParamSetSize(CUfunction hfunc, unsigned int numbytes);
CUresult cuParamSeti(CUfunction hfunc, int offset, unsigned int value);
CUresult cuParamSetv(CUfunction hfunc, int offset, void *ptr, unsigned int numbytes);
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream);

/* What a launch needs on one GPU: gpu/work.cu's kernel loaded in its context. */
struct on_gpu {
	CUcontext ctx;
	CUfunction f;
	CUdeviceptr out;
	CUstream s;
	void *params[2];
};

int main(int argc, char **argv)
{
	const char *modes[] = {"grid", "multi", "multi2", "kernel"};
	int mode = -1;
	for (int i = 0; argc == 5 && i < 4; i++)
		if (strcmp(argv[2], modes[i]) == 0)
			mode = i;
	if (mode < 0) {
		fprintf(stderr, "usage: legacy_launch <work.cubin> <grid|multi|multi2|kernel> <iters> <seconds>\n");
		return 2;
	}
	int grid = mode == 0, multi = mode == 1 || mode == 2, ngpu = mode == 2 ? 2 : 1, iters = atoi(argv[3]), sms = 0;
	double seconds = atof(argv[4]);
	struct on_gpu g[2];
	CUDA_LAUNCH_PARAMS entry[2];
	CK(cuInit(0));
	for (int i = 0; i < ngpu; i++) {
		CUdevice dev;
		CUmodule mod;
		int coop = 0;
		CK(cuDeviceGet(&dev, i));
		CK(cuDevicePrimaryCtxRetain(&g[i].ctx, dev));
		CK(cuCtxSetCurrent(g[i].ctx));
		CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
		CK(cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH, dev));
		if (multi && !coop) {
			printf("unsupported: GPU %d has no cooperative multi-device launch\n", i);
			return 0;
		}
		CK(cuModuleLoad(&mod, argv[1]));
		CK(cuModuleGetFunction(&g[i].f, mod, "fma_kernel"));
		CK(cuMemAlloc(&g[i].out, 4));
		CK(cuStreamCreate(&g[i].s, CU_STREAM_NON_BLOCKING));
		g[i].params[0] = &g[i].out;
		g[i].params[1] = &iters;
		/* One block per SM, all resident at once, as a cooperative launch needs. */
		entry[i] = (CUDA_LAUNCH_PARAMS){.function = g[i].f, .gridDimX = (unsigned)sms, .gridDimY = 1, .gridDimZ = 1,
						.blockDimX = 256, .blockDimY = 1, .blockDimZ = 1, .hStream = g[i].s,
						.kernelParams = g[i].params};
	}
	CK(cuCtxSetCurrent(g[0].ctx));
	CUfunction f = g[0].f;
	CUstream s = g[0].s;
	if (grid) {
		/* fma_kernel(float *out, int iters): the pointer at 0, the int at 8. */
		CK(cuFuncSetBlockShape(f, 256, 1, 1));
		CK(cuParamSetv(f, 0, &g[0].out, sizeof(g[0].out)));
		CK(cuParamSeti(f, (int)sizeof(g[0].out), (unsigned int)iters));
		CK(cuParamSetSize(f, (unsigned int)(sizeof(g[0].out) + sizeof(int))));
	}
#define LAUNCH()                                                    \
	(grid    ? cuLaunchGridAsync(f, sms, 1, s)                  \
	 : multi ? cuLaunchCooperativeKernelMultiDevice(entry, ngpu, 0) \
		 : cuLaunchKernel(f, (unsigned)sms, 1, 1, 256, 1, 1, 0, s, g[0].params, NULL))
	/* One launch first: module and first-launch costs stay out of the rate. */
	CK(LAUNCH());
	for (int i = 0; i < ngpu; i++)
		CK(cuStreamSynchronize(g[i].s));
	long launches = 0;
	int64_t t0 = tessera_now_ns();
	while (tessera_now_ns() - t0 < (int64_t)(seconds * 1e9)) {
		CK(LAUNCH());
		launches++;
	}
	for (int i = 0; i < ngpu; i++)
		CK(cuStreamSynchronize(g[i].s));
	double wall = (double)(tessera_now_ns() - t0) / 1e9;
	printf("path=%s launches=%ld seconds=%.3f rate=%.1f\n", argv[2], launches, wall, (double)launches / wall);
	return 0;
}

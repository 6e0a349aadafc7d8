/*
 * Deprecated launches on a real GPU (make test-gpu): gpu/work.cu's compute-bound
 * fma_kernel, from its cubin, launched back to back for <seconds> with the first
 * driver API's cuLaunchGridAsync (block shape and parameters set on the function
 * first, as that API has it), with cuLaunchCooperativeKernelMultiDevice (one entry, on
 * a stream of the GPU's context), or with cuLaunchKernel for comparison. Prints the
 * kernel rate; run with and without the hook, the ratio is the share pacing gave it.
 * "multi" on a GPU without cooperative multi-device launches prints "unsupported".
 *
 *   legacy_launch <work.cubin> <grid|multi|kernel> <iters> <seconds>
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

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[2], "grid") != 0 && strcmp(argv[2], "multi") != 0 && strcmp(argv[2], "kernel") != 0)) {
		fprintf(stderr, "usage: legacy_launch <work.cubin> <grid|multi|kernel> <iters> <seconds>\n");
		return 2;
	}
	int grid = strcmp(argv[2], "grid") == 0, multi = strcmp(argv[2], "multi") == 0, iters = atoi(argv[3]), sms = 0;
	double seconds = atof(argv[4]);
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction f;
	CUdeviceptr out;
	CUstream s;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
	int coop = 0;
	CK(cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH, dev));
	if (multi && !coop) {
		printf("unsupported: the GPU has no cooperative multi-device launch\n");
		return 0;
	}
	CK(cuModuleLoad(&mod, argv[1]));
	CK(cuModuleGetFunction(&f, mod, "fma_kernel"));
	CK(cuMemAlloc(&out, 4));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	void *params[] = {&out, &iters};
	if (grid) {
		/* fma_kernel(float *out, int iters): the pointer at 0, the int at 8. */
		CK(cuFuncSetBlockShape(f, 256, 1, 1));
		CK(cuParamSetv(f, 0, &out, sizeof(out)));
		CK(cuParamSeti(f, (int)sizeof(out), (unsigned int)iters));
		CK(cuParamSetSize(f, (unsigned int)(sizeof(out) + sizeof(int))));
	}
	/* One block per SM, all resident at once, as a cooperative launch needs. */
	CUDA_LAUNCH_PARAMS entry = {.function = f, .gridDimX = (unsigned)sms, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
				    .blockDimY = 1, .blockDimZ = 1, .hStream = s, .kernelParams = params};
#define LAUNCH()                                                 \
	(grid    ? cuLaunchGridAsync(f, sms, 1, s)               \
	 : multi ? cuLaunchCooperativeKernelMultiDevice(&entry, 1, 0) \
		 : cuLaunchKernel(f, (unsigned)sms, 1, 1, 256, 1, 1, 0, s, params, NULL))
	/* One launch first: module and first-launch costs stay out of the rate. */
	CK(LAUNCH());
	CK(cuStreamSynchronize(s));
	long kernels = 0;
	int64_t t0 = tessera_now_ns();
	while (tessera_now_ns() - t0 < (int64_t)(seconds * 1e9)) {
		CK(LAUNCH());
		kernels++;
	}
	CK(cuStreamSynchronize(s));
	double wall = (double)(tessera_now_ns() - t0) / 1e9;
	printf("path=%s kernels=%ld seconds=%.3f rate=%.1f\n", argv[2], kernels, wall, (double)kernels / wall);
	return 0;
}

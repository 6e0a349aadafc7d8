/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What an MPS client's contexts are given, through the driver API: whether the driver
 * connected to MPS, the SM count of the primary context, of a context asking for
 * every SM through execution affinity (cuCtxCreate_v4), and of a green context made
 * from every SM the device reports. "mps_probe raise" sets
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 after cuInit, before any context, to show
 * when the driver reads it. Built against the real cuda.h (run-mps.sh).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *err(CUresult rc)
{
	const char *s = NULL;
	cuGetErrorName(rc, &s);
	return s ? s : "?";
}

static unsigned int ctx_sms(void)
{
	CUexecAffinityParam a;
	memset(&a, 0, sizeof(a));
	CUresult rc = cuCtxGetExecAffinity(&a, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
	return rc == CUDA_SUCCESS ? a.param.smCount.val : 0;
}

int main(int argc, char **argv)
{
	int raise = argc > 1 && strcmp(argv[1], "raise") == 0;
	CUresult rc = cuInit(0);
	if (rc != CUDA_SUCCESS) {
		printf("probe: cuInit failed: %s\n", err(rc));
		return 1;
	}
	CUdevice d;
	int mps = -1, sms = 0;
	cuDeviceGet(&d, 0);
	cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, d);
	cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
	if (raise)
		setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100", 1);
	CUcontext p, c, gc;
	rc = cuDevicePrimaryCtxRetain(&p, d);
	if (rc != CUDA_SUCCESS) {
		printf("probe: primary context: %s\n", err(rc));
		return 1;
	}
	cuCtxSetCurrent(p);
	unsigned int primary = ctx_sms();
	CUexecAffinityParam a;
	memset(&a, 0, sizeof(a));
	a.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
	a.param.smCount.val = (unsigned int)sms;
	CUctxCreateParams cp;
	memset(&cp, 0, sizeof(cp));
	cp.execAffinityParams = &a;
	cp.numExecAffinityParams = 1;
	unsigned int affinity = 0;
	CUresult arc = cuCtxCreate_v4(&c, &cp, 0, d);
	if (arc == CUDA_SUCCESS) {
		affinity = ctx_sms();
		cuCtxDestroy(c);
		cuCtxSetCurrent(p);
	}
	CUdevResource r;
	memset(&r, 0, sizeof(r));
	unsigned int dev_sms = 0, green = 0;
	CUresult grc = cuDeviceGetDevResource(d, &r, CU_DEV_RESOURCE_TYPE_SM);
	if (grc == CUDA_SUCCESS) {
		dev_sms = r.sm.smCount;
		CUdevResourceDesc desc;
		CUgreenCtx g;
		if ((grc = cuDevResourceGenerateDesc(&desc, &r, 1)) == CUDA_SUCCESS &&
		    (grc = cuGreenCtxCreate(&g, desc, d, CU_GREEN_CTX_DEFAULT_STREAM)) == CUDA_SUCCESS) {
			CUdevResource gr;
			memset(&gr, 0, sizeof(gr));
			if (cuGreenCtxGetDevResource(g, &gr, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS)
				green = gr.sm.smCount;
			if (cuCtxFromGreenCtx(&gc, g) == CUDA_SUCCESS && cuCtxSetCurrent(gc) == CUDA_SUCCESS)
				green = green * 1000 + ctx_sms(); /* both, printed apart below */
			cuGreenCtxDestroy(g);
		}
	}
	printf("probe%s: env=%s mps-enabled=%d device-sms=%d primary-ctx-sms=%u affinity-ctx(asked %d)=%s:%u dev-resource-sms=%u "
	       "green-ctx=%s:resource-sms=%u,exec-affinity-sms=%u\n",
	       raise ? " (raised to 100 after cuInit)" : "", getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") ? getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") : "(unset)",
	       mps, sms, primary, sms, err(arc), affinity, dev_sms, err(grc), green / 1000, green % 1000);
	return 0;
}

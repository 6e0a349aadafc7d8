/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A CUDA context held for a while, for measuring what a context takes on the device
 * from outside (gpu/mps-context.sh): ctx_hold <seconds>. Prints the driver's free and
 * total memory and the SMs the context sees once the primary context is current, then
 * sleeps.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	CUdevice d;
	CUcontext c;
	size_t f = 0, t = 0;
	if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
		printf("ctx: no context\n");
		return 1;
	}
	int sms = 0;
	cuMemGetInfo(&f, &t);
	cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
	printf("ctx pid=%d free=%zu total=%zu MiB sms=%d\n", getpid(), f >> 20, t >> 20, sms);
	fflush(stdout);
	sleep(atoi(argv[1]));
	return 0;
}

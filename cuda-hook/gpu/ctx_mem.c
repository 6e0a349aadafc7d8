/* SPDX-License-Identifier: Apache-2.0 */
/*
 * B5 on a real GPU, memory a context takes outside allocation calls. Run under the
 * hook; prints what the hook allowed and what nvidia-smi says the process holds.
 *
 *   ctx_mem contexts <n> <chunk-mib>   n contexts (cuCtxCreate), chunk MiB allocated in each
 *   ctx_mem module <cubin>             loads a module (cuModuleLoadData), then its kernel
 *   ctx_mem heap <mib>                 raises the malloc heap to mib (cuCtxSetLimit)
 *   ctx_mem reset <mib>                allocates mib, resets the primary context
 *                                      (cudaDeviceReset's call, the second time looked up
 *                                      through cuGetProcAddress), allocates it again
 *   ctx_mem managedreset <mib>         allocates mib of managed memory, makes it resident
 *                                      on the GPU, resets the primary context: whether
 *                                      the driver frees it (the GPU's free memory before
 *                                      and after, the driver's without the hook), and
 *                                      allocates mib again (cuMemAlloc)
 *   ctx_mem managedgone <mib>          the same across a created context's destroy and
 *                                      the primary context's last release (no hook)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024ULL * 1024ULL)

/* What nvidia-smi reports this process holds, in MiB (-1: not listed). */
static long smi_used(void)
{
	char cmd[160], line[256];
	long total = -1;
	snprintf(cmd, sizeof(cmd), "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits");
	FILE *f = popen(cmd, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		long pid, mib;
		if (sscanf(line, "%ld, %ld", &pid, &mib) == 2 && pid == (long)getpid())
			total = (total < 0 ? 0 : total) + mib;
	}
	pclose(f);
	return total;
}

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(*n + 1);
	if (b == NULL || fread(b, 1, *n, f) != *n)
		exit(1);
	b[*n] = 0;
	fclose(f);
	return b;
}

/* Allocates mib of managed memory in the current context and makes it resident on the
 * GPU; returns the GPU's free memory then (0 on failure). */
static size_t managed_resident(size_t want)
{
	CUdeviceptr ptr;
	size_t f = 0, t;
	if (cuMemAllocManaged(&ptr, want, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS || cuMemsetD8(ptr, 1, want) != CUDA_SUCCESS ||
	    cuCtxSynchronize() != CUDA_SUCCESS || cuMemGetInfo(&f, &t) != CUDA_SUCCESS)
		return 0;
	return f;
}

/* The GPU's free memory read in the primary context, retained for the reading. */
static size_t free_in_primary(CUdevice d)
{
	CUcontext c;
	size_t f = 0, t;
	if (cuDevicePrimaryCtxRetain(&c, d) == CUDA_SUCCESS && cuCtxSetCurrent(c) == CUDA_SUCCESS)
		cuMemGetInfo(&f, &t);
	return f;
}

int main(int argc, char **argv)
{
	CUdevice d;
	CUcontext c;
	if (argc < 3 || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS)
		return 2;
	if (strcmp(argv[1], "contexts") == 0 && argc == 4) {
		int n = atoi(argv[2]), made = 0, got = 0;
		size_t chunk = strtoull(argv[3], NULL, 10) * MIB;
		CUresult rc = CUDA_SUCCESS;
		for (int i = 0; i < n; i++) {
			CUctxCreateParams p;
			memset(&p, 0, sizeof(p));
			if ((rc = cuCtxCreate(&c, &p, 0, d)) != CUDA_SUCCESS)
				break;
			made++;
			CUdeviceptr ptr;
			if ((rc = cuMemAlloc(&ptr, chunk)) != CUDA_SUCCESS)
				break;
			got++;
		}
		printf("contexts asked=%d made=%d allocated=%d last_rc=%d smi_used_mib=%ld\n", n, made, got, (int)rc, smi_used());
		return 0;
	}
	if (strcmp(argv[1], "managedgone") == 0) {
		/* A created context's destroy, read from the primary context. */
		size_t want = strtoull(argv[2], NULL, 10) * MIB;
		CUctxCreateParams p;
		memset(&p, 0, sizeof(p));
		CUcontext pc;
		if (cuDevicePrimaryCtxRetain(&pc, d) != CUDA_SUCCESS || cuCtxCreate(&c, &p, 0, d) != CUDA_SUCCESS)
			return 2;
		size_t d0 = managed_resident(want);
		CUresult rd = cuCtxDestroy(c);
		cuCtxSetCurrent(pc);
		size_t t, d1 = 0;
		cuMemGetInfo(&d1, &t);
		/* The primary context's last release (its one reference, retained above), read
		 * in a primary context retained afresh. */
		size_t r0 = managed_resident(want);
		CUresult rr = cuDevicePrimaryCtxRelease(d);
		size_t r1 = free_in_primary(d);
		printf("managedgone destroy_rc=%d destroy_free_mib=%llu/%llu release_rc=%d release_free_mib=%llu/%llu "
		       "(resident/after)\n",
		       (int)rd, (unsigned long long)(d0 / MIB), (unsigned long long)(d1 / MIB), (int)rr,
		       (unsigned long long)(r0 / MIB), (unsigned long long)(r1 / MIB));
		return d0 > 0 && r0 > 0 && rd == CUDA_SUCCESS && rr == CUDA_SUCCESS ? 0 : 1;
	}
	if (cuDevicePrimaryCtxRetain(&c, d) != CUDA_SUCCESS || cuCtxSetCurrent(c) != CUDA_SUCCESS)
		return 2;
	size_t f0, f1, f2, t;
	if (strcmp(argv[1], "module") == 0) {
		size_t n;
		char *img = slurp(argv[2], &n);
		CUmodule m;
		CUfunction fn;
		cuMemGetInfo(&f0, &t);
		long s0 = smi_used();
		CUresult rc = cuModuleLoadData(&m, img);
		cuMemGetInfo(&f1, &t);
		long s1 = smi_used();
		CUresult rf = rc == CUDA_SUCCESS ? cuModuleGetFunction(&fn, m, "touch") : rc;
		cuMemGetInfo(&f2, &t);
		long s2 = smi_used();
		printf("module load_rc=%d getfn_rc=%d hook_free_mib=%llu/%llu/%llu smi_used_mib=%ld/%ld/%ld (before/load/getfunction)\n",
		       (int)rc, (int)rf, (unsigned long long)(f0 / MIB), (unsigned long long)(f1 / MIB),
		       (unsigned long long)(f2 / MIB), s0, s1, s2);
		return 0;
	}
	if (strcmp(argv[1], "heap") == 0) {
		cuMemGetInfo(&f0, &t);
		long s0 = smi_used();
		CUresult rc = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, strtoull(argv[2], NULL, 10) * MIB);
		cuMemGetInfo(&f1, &t);
		long s1 = smi_used();
		printf("heap rc=%d hook_free_mib=%llu/%llu smi_used_mib=%ld/%ld\n", (int)rc, (unsigned long long)(f0 / MIB),
		       (unsigned long long)(f1 / MIB), s0, s1);
		return 0;
	}
	if (strcmp(argv[1], "reset") == 0) {
		size_t want = strtoull(argv[2], NULL, 10) * MIB;
		CUdeviceptr ptr;
		CUresult ra = cuMemAlloc(&ptr, want), rr = CUDA_ERROR_UNKNOWN, rg = CUDA_ERROR_UNKNOWN;
		cuMemGetInfo(&f0, &t);
		CUresult r1 = cuDevicePrimaryCtxReset(d);
		if (cuDevicePrimaryCtxRetain(&c, d) == CUDA_SUCCESS && cuCtxSetCurrent(c) == CUDA_SUCCESS)
			rr = cuMemAlloc(&ptr, want);
		cuMemGetInfo(&f1, &t);
		CUresult (*reset)(CUdevice) = NULL;
		CUresult r2 = cuGetProcAddress("cuDevicePrimaryCtxReset", (void **)&reset, 12000, 0, NULL);
		if (r2 == CUDA_SUCCESS && reset != NULL)
			r2 = reset(d);
		if (cuDevicePrimaryCtxRetain(&c, d) == CUDA_SUCCESS && cuCtxSetCurrent(c) == CUDA_SUCCESS)
			rg = cuMemAlloc(&ptr, want);
		cuMemGetInfo(&f2, &t);
		printf("reset alloc_rc=%d reset_rc=%d again_rc=%d procaddr_reset_rc=%d third_rc=%d hook_free_mib=%llu/%llu/%llu "
		       "smi_used_mib=%ld\n",
		       (int)ra, (int)r1, (int)rr, (int)r2, (int)rg, (unsigned long long)(f0 / MIB), (unsigned long long)(f1 / MIB),
		       (unsigned long long)(f2 / MIB), smi_used());
		return 0;
	}
	if (strcmp(argv[1], "managedreset") == 0) {
		/* nvidia-smi's per-process figure leaves managed memory out (518 MiB before and
		 * after on an H100): the GPU's free memory says it (run without the hook,
		 * cuMemGetInfo is the driver's). */
		size_t want = strtoull(argv[2], NULL, 10) * MIB;
		f0 = managed_resident(want);
		CUresult ra = f0 > 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
		CUresult r1 = cuDevicePrimaryCtxReset(d);
		f1 = free_in_primary(d);
		CUdeviceptr ptr;
		CUresult rg = cuMemAlloc(&ptr, want);
		printf("managedreset alloc_rc=%d reset_rc=%d again_rc=%d free_mib=%llu/%llu (resident/after reset)\n", (int)ra,
		       (int)r1, (int)rg, (unsigned long long)(f0 / MIB), (unsigned long long)(f1 / MIB));
		return ra == CUDA_SUCCESS && r1 == CUDA_SUCCESS ? 0 : 1;
	}
	return 2;
}

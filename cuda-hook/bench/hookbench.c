/* SPDX-License-Identifier: Apache-2.0 */
/*
 * B3 CPU microbenchmark: what one launch and one alloc/free pair cost the calling
 * thread, through whatever libcuda.so.1 the program is linked against (the fake driver
 * in CI, the real one on a GPU machine) and whatever is preloaded (the hook, or
 * nothing). bench/run.sh runs it with and without the hook and reports the difference;
 * this program only measures.
 *
 *   hookbench <launch|launch-ex|graph|alloc|query|copy> <calls> <batch> [paired]
 *
 * Calls are timed in batches of <batch> with the TSC-backed CLOCK_MONOTONIC. It prints
 *   op=<op> calls=<n> mean_ns=<total/n> median_ns=<median batch/batch> min_ns=<..>
 * The median batch is the fast path: a batch in which pacing closed a window (a drain
 * and a sleep until the next one) is an outlier there, while the mean includes it.
 *
 * paired (run with the hook preloaded): batches alternate between the hooked function
 * and the driver's own, found past the hook with libc's dlsym, in one process; it
 * prints both medians. Separate processes differ by more than the hook costs on a
 * real driver (launch queue, clocks), so this is the figure that resolves it.
 *
 * Launches run an empty kernel: on the real driver one built from the PTX below (no
 * nvcc needed), on the fake a zero-length one. The graph is one such kernel captured
 * into a graph.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/elf_lookup.h"

#include "tessera_cuda.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuStreamQuery(CUstream);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph *);

static const char ptx[] = ".version 7.0\n"
			  ".target sm_80\n"
			  ".address_size 64\n"
			  ".visible .entry tessera_empty()\n"
			  "{\n"
			  "\tret;\n"
			  "}\n";

#define CK(call)                                                                       \
	do {                                                                           \
		CUresult rc_ = (call);                                                 \
		if (rc_ != CUDA_SUCCESS) {                                             \
			fprintf(stderr, "hookbench: %s failed: %d\n", #call, (int)rc_); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Functions the fake driver does not have; absent means "fake": use a NULL kernel. */
static void *driver(const char *name)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	return h ? dlsym(h, name) : NULL;
}

/* The driver's own definition of name, read from libcuda's symbol table as the dynamic
 * linker would: every lookup by name (dlsym, dlvsym, libc's own dlsym found through
 * dlvsym) answers the hook's function. */
static void *driver_own(const char *name)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	return h != NULL ? tessera_elf_lookup((const struct link_map *)h, name) : NULL;
}

static CUresult (*d_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			    void **, void **);
static CUresult (*d_launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
static CUresult (*d_graph)(CUgraphExec, CUstream);
static CUresult (*d_alloc)(CUdeviceptr *, size_t);
static CUresult (*d_free)(CUdeviceptr);
static CUresult (*d_query)(CUstream);
static CUresult (*d_copy)(void *, CUdeviceptr, size_t);

static CUfunction kernel;
static CUgraphExec graph;
static CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1};
static unsigned grid = 1;
static CUdeviceptr copy_src; /* the copy op's source */
static float copy_dst;

static void setup(const char *op)
{
	CUdevice d;
	CUcontext c;
	CK(cuInit(0));
	CK(cuDeviceGet(&d, 0));
	CK(cuDevicePrimaryCtxRetain(&c, d));
	CK(cuCtxSetCurrent(c));
	if (strcmp(op, "copy") == 0)
		CK(cuMemAlloc_v2(&copy_src, 1 << 20));
	CUresult (*load)(void **, const void *) = (CUresult(*)(void **, const void *))driver("cuModuleLoadData");
	CUresult (*getfn)(CUfunction *, void *, const char *) =
		(CUresult(*)(CUfunction *, void *, const char *))driver("cuModuleGetFunction");
	CUresult (*inst)(CUgraphExec *, CUgraph, unsigned long long) =
		(CUresult(*)(CUgraphExec *, CUgraph, unsigned long long))driver("cuGraphInstantiateWithFlags");
	if (load == NULL || getfn == NULL || driver("fake_cuda_stats") != NULL) {
		/* The fake (which loads PTX modules too, but runs no kernel): a kernel "runs"
		 * for gridDimX microseconds, a graph for its handle's value; zero is an empty
		 * kernel. */
		grid = 0;
		cfg.gridDimX = 0;
		graph = NULL;
		return;
	}
	void *mod;
	CK(load(&mod, ptx));
	CK(getfn(&kernel, mod, "tessera_empty"));
	if (strcmp(op, "graph") == 0) {
		CUgraph g;
		CUresult (*create)(CUstream *, unsigned) = (CUresult(*)(CUstream *, unsigned))driver("cuStreamCreate");
		CUstream s;
		if (create == NULL || inst == NULL) {
			fprintf(stderr, "hookbench: the driver lacks cuStreamCreate or cuGraphInstantiateWithFlags\n");
			exit(1);
		}
		CK(create(&s, 1 /* CU_STREAM_NON_BLOCKING */));
		CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
		CK(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
		CK(cuStreamEndCapture(s, &g));
		CK(inst(&graph, g, 0));
	}
}

static inline CUresult one(int op)
{
	CUdeviceptr p;
	CUresult rc;
	switch (op) {
	case 0:
		return cuLaunchKernel(kernel, grid, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	case 1:
		return cuLaunchKernelEx(&cfg, kernel, NULL, NULL);
	case 2:
		return cuGraphLaunch(graph, NULL);
	case 4:
		/* A query that finds the stream idle: what each poll of a polling loop
		 * costs at its end (the hook ends a burst there). */
		return cuStreamQuery(NULL);
	case 5:
		/* A synchronous copy of a result back on an idle stream: where a program
		 * that reads its result back every step waits (the hook ends a burst). */
		return cuMemcpyDtoH_v2(&copy_dst, copy_src, sizeof copy_dst);
	default:
		if ((rc = cuMemAlloc_v2(&p, 1 << 20)) != CUDA_SUCCESS)
			return rc;
		return cuMemFree_v2(p);
	}
}

static inline CUresult one_direct(int op)
{
	CUdeviceptr p;
	CUresult rc;
	switch (op) {
	case 0:
		return d_launch(kernel, grid, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	case 1:
		return d_launch_ex(&cfg, kernel, NULL, NULL);
	case 2:
		return d_graph(graph, NULL);
	case 4:
		return d_query(NULL);
	case 5:
		return d_copy(&copy_dst, copy_src, sizeof copy_dst);
	default:
		if ((rc = d_alloc(&p, 1 << 20)) != CUDA_SUCCESS)
			return rc;
		return d_free(p);
	}
}

static int paired(int op, const char *name, long n, long batch)
{
	d_launch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
				void **, void **))driver_own("cuLaunchKernel");
	d_launch_ex = (CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **))driver_own("cuLaunchKernelEx");
	d_graph = (CUresult(*)(CUgraphExec, CUstream))driver_own("cuGraphLaunch");
	d_alloc = (CUresult(*)(CUdeviceptr *, size_t))driver_own("cuMemAlloc_v2");
	d_free = (CUresult(*)(CUdeviceptr))driver_own("cuMemFree_v2");
	d_query = (CUresult(*)(CUstream))driver_own("cuStreamQuery");
	d_copy = (CUresult(*)(void *, CUdeviceptr, size_t))driver_own("cuMemcpyDtoH_v2");
	if (!d_launch || !d_launch_ex || !d_graph || !d_alloc || !d_free || !d_query || !d_copy) {
		fprintf(stderr, "hookbench: the driver's own functions not found\n");
		return 1;
	}
	if ((void *)d_launch == (void *)cuLaunchKernel) {
		fprintf(stderr, "hookbench: paired needs the hook preloaded\n");
		return 1;
	}
	long nb = n / batch;
	int64_t *th = malloc(sizeof(int64_t) * (size_t)nb), *td = malloc(sizeof(int64_t) * (size_t)nb);
	if (th == NULL || td == NULL)
		return 1;
	for (long b = 0; b < nb; b++) {
		for (int which = 0; which < 2; which++) {
			int hooked = (b + which) % 2 == 0; /* alternate which goes first */
			int64_t t0 = now_ns();
			for (long i = 0; i < batch; i++)
				if ((hooked ? one(op) : one_direct(op)) != CUDA_SUCCESS) {
					fprintf(stderr, "hookbench: %s failed\n", name);
					return 1;
				}
			(hooked ? th : td)[b] = now_ns() - t0;
		}
	}
	CK(cuCtxSynchronize());
	qsort(th, (size_t)nb, sizeof(*th), cmp);
	qsort(td, (size_t)nb, sizeof(*td), cmp);
	double h = (double)th[nb / 2] / (double)batch, d = (double)td[nb / 2] / (double)batch;
	printf("op=%s calls=%ld paired hook_ns=%.1f direct_ns=%.1f diff_ns=%.1f\n", name, 2 * n, h, d, h - d);
	free(th);
	free(td);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *ops[] = {"launch", "launch-ex", "graph", "alloc", "query", "copy"};
	if (argc != 4 && !(argc == 5 && strcmp(argv[4], "paired") == 0)) {
		fprintf(stderr, "usage: hookbench <launch|launch-ex|graph|alloc|query|copy> <calls> <batch> [paired]\n");
		return 2;
	}
	int op = -1;
	for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++)
		if (strcmp(argv[1], ops[i]) == 0)
			op = i;
	long n = atol(argv[2]), batch = atol(argv[3]);
	if (op < 0 || n <= 0 || batch <= 0 || n % batch != 0) {
		fprintf(stderr, "hookbench: bad arguments (calls must be a multiple of batch)\n");
		return 2;
	}
	setup(argv[1]);
	/* Warm up: first calls set up the hook, load the module, fill caches. */
	for (long i = 0; i < batch; i++)
		CK(one(op));
	CK(cuCtxSynchronize());
	if (argc == 5)
		return paired(op, argv[1], n, batch);
	long nb = n / batch;
	int64_t *t = malloc(sizeof(*t) * (size_t)nb);
	if (t == NULL)
		return 1;
	int64_t start = now_ns();
	for (long b = 0; b < nb; b++) {
		int64_t t0 = now_ns();
		for (long i = 0; i < batch; i++)
			if (one(op) != CUDA_SUCCESS) {
				fprintf(stderr, "hookbench: %s failed at call %ld\n", argv[1], b * batch + i);
				return 1;
			}
		t[b] = now_ns() - t0;
	}
	int64_t total = now_ns() - start;
	CK(cuCtxSynchronize());
	qsort(t, (size_t)nb, sizeof(*t), cmp);
	printf("op=%s calls=%ld mean_ns=%.1f median_ns=%.1f min_ns=%.1f\n", argv[1], n, (double)total / (double)n,
	       (double)t[nb / 2] / (double)batch, (double)t[0] / (double)batch);
	free(t);
	return 0;
}

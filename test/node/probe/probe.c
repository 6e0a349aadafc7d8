/*
 * tessera-probe: the CUDA program the real-node suite (test/node) runs in its pods.
 *
 * It resolves the driver the way CUDA runtimes do (dlopen libcuda.so.1, dlsym), so the
 * container's CUDA hook, when the node agent injected one, sees every call. It prints
 * one line per fact, "tessera-probe <event> key=value ...", which the suite reads from
 * the container's log:
 *
 *   start       unix_ns      the process started
 *   context     preload limits visible gpu_nodes nodes   whether /etc/ld.so.preload
 *                            and the limits file /run/tessera/limits exist (yes/no),
 *                            NVIDIA_VISIBLE_DEVICES ("-" when unset), how many GPU
 *                            device nodes (/dev/nvidia<N>) the container has and
 *                            which (comma-separated paths, "-" when none)
 *   driver      path         the file libcuda.so.1 was loaded from
 *   first-cuda  unix_ns      cuInit, a context and a 1 MiB cuMemAlloc succeeded
 *   memory      total_mib free_mib   cuDeviceTotalMem and cuMemGetInfo of device 0
 *   fill        filled_mib err       cuMemAlloc of -chunk MiB until it failed (-fill)
 *   check       unix_ns total_mib over   every -interval while holding (-hold): one
 *                                        more chunk past the filled memory was
 *                                        "refused" or "granted"
 *   error       call err     a call failed; the program exits 1
 *
 *   tessera-probe [-fill] [-chunk MiB] [-hold] [-interval ms]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda.h"

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*devget_fn)(CUdevice *, int);
typedef CUresult (*totalmem_fn)(size_t *, CUdevice);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setcur_fn)(CUcontext);
typedef CUresult (*meminfo_fn)(size_t *, size_t *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (p == NULL) {
		printf("tessera-probe error call=dlsym:%s err=-1\n", name);
		exit(1);
	}
	return p;
}

#define CALL(name, expr)                                                     \
	do {                                                                 \
		CUresult r_ = (expr);                                        \
		if (r_ != CUDA_SUCCESS) {                                    \
			printf("tessera-probe error call=%s err=%d\n", name, r_); \
			exit(1);                                             \
		}                                                            \
	} while (0)

int main(int argc, char **argv)
{
	int fill = 0, hold = 0;
	long chunk_mib = 256, interval_ms = 500;
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("tessera-probe start unix_ns=%lld\n", now_ns());
	const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
	glob_t nodes;
	size_t gpu_nodes = 0;
	char names[1024] = "-";
	if (glob("/dev/nvidia[0-9]*", 0, NULL, &nodes) == 0) {
		gpu_nodes = nodes.gl_pathc;
		size_t off = 0;
		for (size_t i = 0; i < nodes.gl_pathc && off < sizeof(names); i++)
			off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s", i ? "," : "", nodes.gl_pathv[i]);
		globfree(&nodes);
	}
	printf("tessera-probe context preload=%s limits=%s visible=%s gpu_nodes=%zu nodes=%s\n",
	       access("/etc/ld.so.preload", F_OK) == 0 ? "yes" : "no", access("/run/tessera/limits", F_OK) == 0 ? "yes" : "no",
	       visible != NULL && *visible != '\0' ? visible : "-", gpu_nodes, names);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-fill") == 0)
			fill = 1;
		else if (strcmp(argv[i], "-hold") == 0)
			hold = 1;
		else if (strcmp(argv[i], "-chunk") == 0 && i + 1 < argc)
			chunk_mib = atol(argv[++i]);
		else if (strcmp(argv[i], "-interval") == 0 && i + 1 < argc)
			interval_ms = atol(argv[++i]);
		else {
			fprintf(stderr, "usage: tessera-probe [-fill] [-chunk MiB] [-hold] [-interval ms]\n");
			return 2;
		}
	}
	if (chunk_mib <= 0 || interval_ms <= 0) {
		fprintf(stderr, "tessera-probe: -chunk and -interval must be positive\n");
		return 2;
	}
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (lib == NULL) {
		printf("tessera-probe error call=dlopen err=-1 msg=\"%s\"\n", dlerror());
		return 1;
	}
	struct link_map *lm = NULL;
	if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL)
		printf("tessera-probe driver path=%s\n", lm->l_name);
	init_fn cuInit_ = (init_fn)sym(lib, "cuInit");
	devget_fn cuDeviceGet_ = (devget_fn)sym(lib, "cuDeviceGet");
	totalmem_fn cuDeviceTotalMem_ = (totalmem_fn)sym(lib, "cuDeviceTotalMem_v2");
	retain_fn cuDevicePrimaryCtxRetain_ = (retain_fn)sym(lib, "cuDevicePrimaryCtxRetain");
	setcur_fn cuCtxSetCurrent_ = (setcur_fn)sym(lib, "cuCtxSetCurrent");
	meminfo_fn cuMemGetInfo_ = (meminfo_fn)sym(lib, "cuMemGetInfo_v2");
	alloc_fn cuMemAlloc_ = (alloc_fn)sym(lib, "cuMemAlloc_v2");
	free_fn cuMemFree_ = (free_fn)sym(lib, "cuMemFree_v2");

	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr first;
	CALL("cuInit", cuInit_(0));
	CALL("cuDeviceGet", cuDeviceGet_(&dev, 0));
	CALL("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain_(&ctx, dev));
	CALL("cuCtxSetCurrent", cuCtxSetCurrent_(ctx));
	CALL("cuMemAlloc", cuMemAlloc_(&first, 1 << 20));
	printf("tessera-probe first-cuda unix_ns=%lld\n", now_ns());
	CALL("cuMemFree", cuMemFree_(first));

	size_t total = 0, free_b = 0, card = 0;
	CALL("cuDeviceTotalMem", cuDeviceTotalMem_(&card, dev));
	CALL("cuMemGetInfo", cuMemGetInfo_(&free_b, &total));
	printf("tessera-probe memory total_mib=%zu free_mib=%zu device_total_mib=%zu\n", total >> 20, free_b >> 20, card >> 20);

	size_t chunk = (size_t)chunk_mib << 20, filled = 0;
	if (fill) {
		CUdeviceptr p;
		CUresult r;
		while ((r = cuMemAlloc_(&p, chunk)) == CUDA_SUCCESS)
			filled += chunk;
		printf("tessera-probe fill filled_mib=%zu err=%d\n", filled >> 20, r);
	}
	while (hold) {
		CUdeviceptr p;
		const char *over = "refused";
		CUresult r = cuMemAlloc_(&p, chunk);
		if (r == CUDA_SUCCESS) {
			over = "granted";
			cuMemFree_(p);
		}
		CALL("cuMemGetInfo", cuMemGetInfo_(&free_b, &total));
		printf("tessera-probe check unix_ns=%lld total_mib=%zu over=%s\n", now_ns(), total >> 20, over);
		struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
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
 *   gpu-open    minor how result   with -try-gpus, before CUDA, for each listed minor
 *                            number m of an NVIDIA GPU device (character 195:m): how
 *                            the probe reached it ("present": the container has
 *                            /dev/nvidia<m>; "made": it made the node itself in /tmp
 *                            with mknod; "mknod-refused") and what opening it gave
 *                            ("opened", or the errno's name: EPERM where the
 *                            container's device cgroup denies it, ENXIO where the
 *                            node has no driver behind it, as on the fake driver)
 *   turns       files unlink with -turns, before CUDA: the GPU turn files the container
 *                            has (name:size, comma-separated, "-" when none) and
 *                            what unlinking the first gave ("removed", or the errno's
 *                            name: EBUSY where the file is a mount point of its own)
 *   driver      path         the file libcuda.so.1 was loaded from
 *   first-cuda  unix_ns      cuInit, a context and a 1 MiB cuMemAlloc succeeded
 *   devices     count        cuDeviceGetCount: the GPUs CUDA shows the process
 *   memory      total_mib free_mib   cuDeviceTotalMem and cuMemGetInfo of device 0
 *   fill        filled_mib err       cuMemAlloc of -chunk MiB until it failed (-fill)
 *   check       unix_ns total_mib over   every -interval while holding (-hold): one
 *                                        more chunk past the filled memory was
 *                                        "refused" or "granted"
 *   rate        kernels seconds per_s late_ms   with -compute: compute-bound kernels
 *                            (a hand-written PTX FMA loop, one 256-thread block per
 *                            SM, about 92 us each alone on an H200) launched back to
 *                            back with cuLaunchKernel for -compute ms, then
 *                            synchronized; per_s is kernels per second. With -start-at
 *                            the launches begin at that wall-clock time (unix ms), so
 *                            that pods started apart run together; late_ms is how
 *                            late the probe was for it (0: it waited)
 *   mps         enabled sms ctx_sms pipe percent pinned env_pipe env_percent env_pinned
 *                            with -mps, after the memory line: the device's
 *                            CU_DEVICE_ATTRIBUTE_MPS_ENABLED (1: the driver reached an
 *                            MPS server) and SM count (an MPS client's share of the
 *                            SMs), the SM count of the primary context's execution
 *                            affinity (0 where the driver has none), the three
 *                            CUDA_MPS_* variables (PIPE_DIRECTORY,
 *                            ACTIVE_THREAD_PERCENTAGE, PINNED_DEVICE_MEM_LIMIT) as the
 *                            process has them after cuInit (the hook sets them), and
 *                            env_*: the same in the environment the container was
 *                            started with (/proc/self/environ; "-" when unset)
 *   error       call err     a call failed; the program exits 1
 *
 *   tessera-probe [-fill] [-chunk MiB] [-hold] [-interval ms] [-compute ms] [-start-at unix_ms] [-mps]
 *                 [-try-gpus m,m,...] [-turns]
 *   tessera-probe -sleep ms      sleep, then exit 0 without touching CUDA (an init container)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*modload_fn)(CUmodule *, const void *);
typedef CUresult (*getfn_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			      void **, void **);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*affinity_fn)(CUexecAffinityParam *, CUexecAffinityType);

/* The compute kernel, as nvcc would write pace.cu's "work" (cuda-hook/gpu): each
 * thread runs iters dependent FMAs and stores the result only if it is 12345 (never),
 * so that the loop is not optimized away. PTX, JIT-compiled by the driver for the
 * GPU at hand: no CUDA compiler is needed to build the probe. */
static const char work_ptx[] =
	".version 7.0\n"
	".target sm_52\n"
	".address_size 64\n"
	".visible .entry work(.param .u64 out, .param .u32 iters)\n"
	"{\n"
	"\t.reg .pred %p<3>;\n"
	"\t.reg .f32 %f<3>;\n"
	"\t.reg .b32 %r<4>;\n"
	"\t.reg .b64 %rd<3>;\n"
	"\tld.param.u64 %rd1, [out];\n"
	"\tld.param.u32 %r2, [iters];\n"
	"\tmov.u32 %r1, %tid.x;\n"
	"\tcvt.rn.f32.u32 %f1, %r1;\n"
	"\tmul.f32 %f2, %f1, 0f3A83126F;\n" /* 1e-3 */
	"\tmov.u32 %r3, 0;\n"
	"\tsetp.le.s32 %p1, %r2, 0;\n"
	"\t@%p1 bra DONE;\n"
	"LOOP:\n"
	"\tfma.rn.f32 %f2, %f2, 0f3F800347, 0f33D6BF95;\n" /* a = a * 1.0001 + 1e-7 */
	"\tadd.s32 %r3, %r3, 1;\n"
	"\tsetp.lt.s32 %p2, %r3, %r2;\n"
	"\t@%p2 bra LOOP;\n"
	"DONE:\n"
	"\tsetp.neu.f32 %p1, %f2, 0f4640E400;\n" /* 12345 */
	"\t@%p1 bra END;\n"
	"\tcvta.to.global.u64 %rd2, %rd1;\n"
	"\tst.global.f32 [%rd2], %f2;\n"
	"END:\n"
	"\tret;\n"
	"}\n";

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
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

/* The value of name in the environment the process was started with (what the
 * runtime gave the container), not as changed since: "-" when unset. */
static const char *initial_env(const char *name, char *buf, size_t size)
{
	snprintf(buf, size, "-");
	FILE *f = fopen("/proc/self/environ", "r");
	if (f == NULL)
		return buf;
	size_t n = strlen(name);
	char *entry = NULL;
	size_t cap = 0;
	while (getdelim(&entry, &cap, '\0', f) > 0) {
		if (strncmp(entry, name, n) == 0 && entry[n] == '=') {
			snprintf(buf, size, "%s", entry[n + 1] != '\0' ? entry + n + 1 : "-");
			break;
		}
	}
	free(entry);
	fclose(f);
	return buf;
}

static const char *env_or_dash(const char *name)
{
	const char *v = getenv(name);
	return v != NULL && *v != '\0' ? v : "-";
}

static const char *errno_name(int e)
{
	switch (e) {
	case EPERM: return "EPERM";
	case EACCES: return "EACCES";
	case ENXIO: return "ENXIO";
	case ENODEV: return "ENODEV";
	case ENOENT: return "ENOENT";
	case EROFS: return "EROFS";
	case EBUSY: return "EBUSY";
	default: return "other";
	}
}

/* try_gpus: for each minor of a comma-separated list, open the GPU's device node the
 * container has, or one the probe makes (a tenant with CAP_MKNOD can make any): only
 * the container's device cgroup stands between it and a GPU it was not granted. */
static void try_gpus(const char *list)
{
	char *copy = strdup(list), *save = NULL;
	for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
		int m = atoi(t);
		char path[64];
		const char *how = "present";
		snprintf(path, sizeof(path), "/dev/nvidia%d", m);
		if (access(path, F_OK) != 0) {
			snprintf(path, sizeof(path), "/tmp/tessera-probe-nvidia%d", m);
			unlink(path);
			how = mknod(path, S_IFCHR | 0600, makedev(195, (unsigned)m)) == 0 ? "made" : "mknod-refused";
		}
		const char *result = errno_name(errno);
		if (strcmp(how, "mknod-refused") != 0) {
			int fd = open(path, O_RDWR | O_CLOEXEC);
			result = fd >= 0 ? "opened" : errno_name(errno);
			if (fd >= 0)
				close(fd);
		}
		printf("tessera-probe gpu-open minor=%d how=%s result=%s\n", m, how, result);
	}
	free(copy);
}

/* turns: the GPU turn files under /run/tessera-turns, and whether the first can be
 * unlinked (a tenant that is root in its container tries): the node agent mounts each
 * file on its own, so that it cannot. */
static void turns(void)
{
	glob_t g;
	char files[2048] = "-";
	const char *unlinked = "-";
	if (glob("/run/tessera-turns/*", 0, NULL, &g) == 0) {
		size_t off = 0;
		for (size_t i = 0; i < g.gl_pathc && off < sizeof(files); i++) {
			struct stat st;
			long long size = stat(g.gl_pathv[i], &st) == 0 ? (long long)st.st_size : -1;
			off += (size_t)snprintf(files + off, sizeof(files) - off, "%s%s:%lld", i ? "," : "",
						strrchr(g.gl_pathv[i], '/') + 1, size);
		}
		unlinked = unlink(g.gl_pathv[0]) == 0 ? "removed" : errno_name(errno);
		globfree(&g);
	}
	printf("tessera-probe turns files=%s unlink=%s\n", files, unlinked);
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
	int fill = 0, hold = 0, mps = 0, show_turns = 0;
	long chunk_mib = 256, interval_ms = 500, compute_ms = 0;
	long long start_at_ms = 0, sleep_ms = 0;
	const char *try_list = NULL;
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
		else if (strcmp(argv[i], "-compute") == 0 && i + 1 < argc)
			compute_ms = atol(argv[++i]);
		else if (strcmp(argv[i], "-start-at") == 0 && i + 1 < argc)
			start_at_ms = atoll(argv[++i]);
		else if (strcmp(argv[i], "-sleep") == 0 && i + 1 < argc)
			sleep_ms = atoll(argv[++i]);
		else if (strcmp(argv[i], "-mps") == 0)
			mps = 1;
		else if (strcmp(argv[i], "-try-gpus") == 0 && i + 1 < argc)
			try_list = argv[++i];
		else if (strcmp(argv[i], "-turns") == 0)
			show_turns = 1;
		else {
			fprintf(stderr, "usage: tessera-probe [-fill] [-chunk MiB] [-hold] [-interval ms] [-compute ms] [-start-at unix_ms] [-mps] [-try-gpus m,m,...] [-turns] [-sleep ms]\n");
			return 2;
		}
	}
	if (chunk_mib <= 0 || interval_ms <= 0 || compute_ms < 0 || start_at_ms < 0 || sleep_ms < 0) {
		fprintf(stderr, "tessera-probe: -chunk and -interval must be positive, -compute, -start-at and -sleep not negative\n");
		return 2;
	}
	if (sleep_ms > 0) {
		struct timespec ts = {(time_t)(sleep_ms / 1000), (long)(sleep_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
		return 0;
	}
	if (try_list != NULL)
		try_gpus(try_list);
	if (show_turns)
		turns();
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
	int count = 0;
	CALL("cuDeviceGetCount", ((CUresult(*)(int *))sym(lib, "cuDeviceGetCount"))(&count));
	printf("tessera-probe devices count=%d\n", count);

	size_t total = 0, free_b = 0, card = 0;
	CALL("cuDeviceTotalMem", cuDeviceTotalMem_(&card, dev));
	CALL("cuMemGetInfo", cuMemGetInfo_(&free_b, &total));
	printf("tessera-probe memory total_mib=%zu free_mib=%zu device_total_mib=%zu\n", total >> 20, free_b >> 20, card >> 20);

	if (mps) {
		attr_fn cuDeviceGetAttribute_ = (attr_fn)sym(lib, "cuDeviceGetAttribute");
		affinity_fn cuCtxGetExecAffinity_ = (affinity_fn)sym(lib, "cuCtxGetExecAffinity");
		int enabled = 0, sms = 0;
		CALL("cuDeviceGetAttribute", cuDeviceGetAttribute_(&enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev));
		CALL("cuDeviceGetAttribute", cuDeviceGetAttribute_(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
		CUexecAffinityParam a;
		memset(&a, 0, sizeof(a));
		unsigned int ctx_sms = 0;
		if (cuCtxGetExecAffinity_(&a, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS)
			ctx_sms = a.param.smCount.val;
		char e_pipe[256], e_pct[64], e_pinned[256];
		printf("tessera-probe mps enabled=%d sms=%d ctx_sms=%u pipe=%s percent=%s pinned=%s env_pipe=%s env_percent=%s env_pinned=%s\n",
		       enabled, sms, ctx_sms, env_or_dash("CUDA_MPS_PIPE_DIRECTORY"), env_or_dash("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
		       env_or_dash("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
		       initial_env("CUDA_MPS_PIPE_DIRECTORY", e_pipe, sizeof(e_pipe)),
		       initial_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", e_pct, sizeof(e_pct)),
		       initial_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", e_pinned, sizeof(e_pinned)));
	}

	if (compute_ms > 0) {
		attr_fn cuDeviceGetAttribute_ = (attr_fn)sym(lib, "cuDeviceGetAttribute");
		modload_fn cuModuleLoadData_ = (modload_fn)sym(lib, "cuModuleLoadData");
		getfn_fn cuModuleGetFunction_ = (getfn_fn)sym(lib, "cuModuleGetFunction");
		launch_fn cuLaunchKernel_ = (launch_fn)sym(lib, "cuLaunchKernel");
		sync_fn cuCtxSynchronize_ = (sync_fn)sym(lib, "cuCtxSynchronize");
		int sms = 0, iters = 40000;
		CUmodule mod;
		CUfunction fn;
		CUdeviceptr out;
		CALL("cuDeviceGetAttribute", cuDeviceGetAttribute_(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
		CALL("cuModuleLoadData", cuModuleLoadData_(&mod, work_ptx));
		CALL("cuModuleGetFunction", cuModuleGetFunction_(&fn, mod, "work"));
		CALL("cuMemAlloc", cuMemAlloc_(&out, 4));
		void *params[] = {&out, &iters};
		/* One kernel first: the JIT and first-launch costs stay out of the rate. */
		CALL("cuLaunchKernel", cuLaunchKernel_(fn, (unsigned)sms, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
		CALL("cuCtxSynchronize", cuCtxSynchronize_());
		long long late_ms = 0;
		if (start_at_ms > 0) {
			long long wait_ns = start_at_ms * 1000000LL - now_ns();
			if (wait_ns > 0) {
				struct timespec ts = {(time_t)(wait_ns / 1000000000LL), (long)(wait_ns % 1000000000LL)};
				nanosleep(&ts, NULL);
			} else {
				late_ms = -wait_ns / 1000000LL;
			}
		}
		long long kernels = 0, t0 = mono_ns(), end = t0 + compute_ms * 1000000LL;
		while (mono_ns() < end) {
			CALL("cuLaunchKernel", cuLaunchKernel_(fn, (unsigned)sms, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
			kernels++;
		}
		CALL("cuCtxSynchronize", cuCtxSynchronize_());
		double secs = (double)(mono_ns() - t0) / 1e9;
		printf("tessera-probe rate kernels=%lld seconds=%.3f per_s=%.1f late_ms=%lld sms=%d\n", kernels, secs,
		       (double)kernels / secs, late_ms, sms);
		CALL("cuMemFree", cuMemFree_(out));
	}

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

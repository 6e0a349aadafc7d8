/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fake libcuda.so.1 for testing the hook on machines without a GPU. It implements
 * the driver functions the hook and its tests call, with simulated devices:
 *
 *   - FAKE_CUDA_DEVICES devices (default 4), each with FAKE_CUDA_MEM_MIB of memory
 *     (default 81920) and UUID GPU-fa4e0000-0000-0000-0000-00000000000<n+1>, PCI bus
 *     id 0000:0<n+1>:00.0; cuInit applies CUDA_VISIBLE_DEVICES (indexes or UUIDs) as
 *     the driver does, renumbering the devices, unless FAKE_CUDA_IGNORE_VISIBLE is set
 *     (a driver that ignores it, to test the hook's own filtering);
 *   - memory is bookkeeping only (pointers are never dereferenced), tracked per
 *     device with the peak held, so tests can check what really got allocated; an
 *     allocation belongs to the context current when it was made (a VMM handle to
 *     none) and is freed with it: cuCtxDestroy, the primary context's last release,
 *     cuDevicePrimaryCtxReset;
 *   - a kernel "runs" for gridDimX microseconds, or blockDimX where that is over 1
 *     (one function at one grid whose work its arguments set; a graph for as many
 *     microseconds as its exec handle's value) on a simulated GPU that executes
 *     launches in order, so cuCtxSynchronize waits until the simulated queue is
 *     empty; the CPU can run ahead of the GPU as with a real driver;
 *   - each device has a default stream-ordered pool, and cuMemAllocAsync and
 *     cuMemAllocFromPoolAsync draw from it: memory freed into it stays reserved (and
 *     counted in used) until cuMemPoolTrimTo or a synchronize trims it, as a real
 *     pool with release threshold 0 does;
 *   - graphs are real objects when built with cuGraphCreate or stream capture: memory
 *     nodes (cuGraphAddMemAllocNode, cuMemAllocAsync on a capturing stream) take
 *     nothing until the executable graph is uploaded or launched, which maps what it
 *     allocates from a per-device graph pool that grows as needed and shrinks only at
 *     cuDeviceGraphMemTrim, as the driver's does (measured on an H200). Memory mapped
 *     to one executable graph is not lent to another here (the driver may); an exec
 *     handle below 0x100000 is not an object but a graph that runs that many
 *     microseconds;
 *   - with FAKE_CUDA_TALLY=<file>, every process using the fake driver also adds what
 *     it holds per device to a tally kept in that file (used and peak, all processes
 *     together), so a test can check what several processes held at once;
 *   - memory belongs to the driver descriptors of the process that allocated it, as
 *     on the real driver (an H200 with driver 580 kept a dead process's 4096 MiB while
 *     a child it forked held the inherited descriptors, and freed it when the last
 *     holder went; gpu/orphan.c shows it on a GPU): with FAKE_CUDA_TALLY each process
 *     opens a descriptor of its own at cuInit or its first allocation, a file
 *     <tally>.<slot> on which it takes a shared flock, O_CLOEXEC as libcuda opens its
 *     device files, so that fork (or a raw clone) shares it and exec closes it. The
 *     kernel drops the lock when the last descriptor referring to that open file
 *     description closes, and the tally drops a process's part exactly then: not when
 *     the process exits while a child still holds the description. A forked child
 *     starts holding nothing of its own.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../test/fake_stats.h"
#include "../test/fake_mps.h"
#include "tessera_cuda.h"

#define MAXDEV 8
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900

static int ndev = 4;
static uint64_t mem_bytes = 81920ULL << 20;
static uint64_t ctx_mib; /* FAKE_CUDA_CTX_MIB: device memory each created context takes */
static int initialized;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t used[MAXDEV], peak[MAXDEV];

/* Machine-wide tally across processes (FAKE_CUDA_TALLY); NULL when not asked for.
 * Each process's part is kept in a slot of its own, with the process's descriptor
 * <tally>.<slot> (see the top of this file): the part is dropped once no process holds
 * that descriptor any more, as the driver frees the memory then. */
#define TALLY_PROCS 128
struct tally_proc {
	_Atomic int pid;            /* 0: free; -1: being claimed or dropped */
	_Atomic uint64_t used[MAXDEV];
};
struct tally {
	_Atomic uint64_t used[MAXDEV];
	_Atomic uint64_t peak[MAXDEV];
	struct tally_proc procs[TALLY_PROCS];
};
static struct tally *tally;
static char tally_path[200];
static struct tally_proc *my_proc; /* this process's slot, taken at cuInit or its first allocation */
static int my_proc_pid;

static void descriptor_path(char *buf, size_t n, const struct tally_proc *t)
{
	snprintf(buf, n, "%s.%d", tally_path, (int)(t - tally->procs));
}

/* Drops the parts whose descriptor no process holds any more (the lock can be taken
 * exclusively), and removes the descriptor's file. */
static void tally_reap(void)
{
	for (int i = 0; i < TALLY_PROCS; i++) {
		struct tally_proc *t = &tally->procs[i];
		int pid = atomic_load(&t->pid);
		if (pid <= 0 || t == my_proc)
			continue;
		char path[256];
		descriptor_path(path, sizeof(path), t);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		int held = flock(fd, LOCK_EX | LOCK_NB) != 0;
		if (held || !atomic_compare_exchange_strong(&t->pid, &pid, -1)) {
			close(fd); /* still held, or another process drops it */
			continue;
		}
		for (int d = 0; d < MAXDEV; d++)
			atomic_fetch_sub(&tally->used[d], atomic_exchange(&t->used[d], 0));
		unlink(path);
		close(fd);
		atomic_store(&t->pid, 0);
	}
}

/* This process's slot and descriptor, taken on first need. Its descriptor is never
 * closed: the process holds it until it exits or execs, and so does every child it
 * forks from then on. */
static void tally_claim(void)
{
	if (tally == NULL || (my_proc != NULL && my_proc_pid == getpid()))
		return;
	int me = getpid();
	my_proc = NULL;
	for (int i = 0; i < TALLY_PROCS && my_proc == NULL; i++) {
		int zero = 0; /* claimed as -1 (skipped by tally_reap) until its descriptor is held */
		if (atomic_compare_exchange_strong(&tally->procs[i].pid, &zero, -1))
			my_proc = &tally->procs[i];
	}
	if (my_proc == NULL) {
		fprintf(stderr, "fake libcuda: the tally has no free process slot\n");
		abort();
	}
	char path[256];
	descriptor_path(path, sizeof(path), my_proc);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_SH) != 0) {
		fprintf(stderr, "fake libcuda: cannot hold the descriptor %s\n", path);
		abort();
	}
	atomic_store(&my_proc->pid, me);
	my_proc_pid = me;
}

/* Records that this process now holds delta more (or less) on dev. */
static void tally_add(int dev, int64_t delta)
{
	if (tally == NULL || delta == 0)
		return;
	tally_reap();
	tally_claim();
	atomic_fetch_add(&my_proc->used[dev], (uint64_t)delta);
	uint64_t now = atomic_fetch_add(&tally->used[dev], (uint64_t)delta) + (uint64_t)delta;
	uint64_t p = atomic_load(&tally->peak[dev]);
	while (now > p && !atomic_compare_exchange_weak(&tally->peak[dev], &p, now))
		;
}

static __thread int current = -1; /* device of the current context */
static _Atomic uint64_t next_addr = 0x7f0000000000ULL;

/* Simulated GPU: one in-order queue per process. */
static int64_t busy_until_ns;
/* FAKE_CUDA_OTHER=<start_us>,<len_us>,<period_us>: another context holds the GPU from
 * start to start + len of every period of the monotonic clock (a time-sliced GPU's
 * turn of another container), when this process's queue does not advance. */
static int64_t other_start_ns, other_len_ns, other_period_ns;
/* FAKE_CUDA_EVENT_NS=<ns>: an event takes this much of the queue's time, as a real
 * GPU's does (about 1 us on an H200): a launch sample, bracketed by two events, then
 * reads more than the kernel takes back to back. Not in the shared GPU. */
static int64_t event_ns;
/* FAKE_CUDA_LAUNCH_NS=<ns>: a kernel launched onto an idle queue starts this long after
 * its launch returns, as a real GPU's does (its launch latency): a launch sample on an
 * idle stream then reads the latency too, which is not the kernel's GPU time. Not in
 * the shared GPU. */
static int64_t launch_ns;
/* FAKE_CUDA_GAP_NS=<ns>: a kernel queued behind work on its queue starts this long after
 * that work ends, as a real GPU moves from one kernel to the next (a microsecond or a
 * few): the GPU is held by the context in the gap, which busy_ns counts, and runs no
 * kernel; stats' kernel_ns counts the kernels alone. Not in the shared GPU. */
static int64_t gap_ns;
/* FAKE_CUDA_FENCE_NS=<ns>: a kernel queued right behind an event on its queue starts
 * this long after the event, in place of the gap behind a kernel: the GPU starts it
 * afresh once the event's record has run, without the overlap it gives a kernel queued
 * behind another. A launch sample queued behind the program's own work then reads
 * more than the kernel holds the GPU unsampled, and more than one that found its
 * stream idle (on an H100, an LLM step's short kernels' queued samples read 1.2-1.8 us
 * over their idle ones, which matched the profiler's kernel time). The fenced kernel
 * holds the GPU in the wait, which busy_ns counts. Not in the shared GPU. */
static int64_t fence_ns;
/* The queue the last event was recorded on, and when that event runs. */
static int64_t *fence_q;
static int64_t fence_at;
/* FAKE_CUDA_CALL_NS=<ns>: a launch and an event record return this long after they
 * have queued their work, as a real driver's calls take the host a microsecond or
 * two (its locks, the push buffer, the doorbell): the work starts while its call
 * has not returned yet, and the host time around a launch is more than the time
 * between its work and the event before it. Not in the shared GPU. */
static int64_t call_ns;
static int64_t now_ns(void);
/* The host's time in a call past queueing its work (FAKE_CUDA_CALL_NS). */
static void call_tail(void)
{
	if (call_ns <= 0)
		return;
	for (int64_t until = now_ns() + call_ns; now_ns() < until;)
		;
}
/* FAKE_CUDA_COLD_US=<us>: the first launch of each function runs this much longer, as
 * a real GPU's first launch of a kernel does (its code loaded, its caches cold: on an
 * H200, 103 us for a kernel of 0.75 us after). Not in the shared GPU. */
static int64_t cold_us;
#define COLD_SEEN 4096
static uintptr_t cold_seen[COLD_SEEN];
/* Whether f's launch is its first (caller holds mu). */
static int cold_first(CUfunction f)
{
	uintptr_t k = (uintptr_t)f;
	for (unsigned i = (unsigned)((k * 0x9e3779b97f4a7c15ULL) >> 52) % COLD_SEEN, n = 0; n < COLD_SEEN;
	     n++, i = (i + 1) % COLD_SEEN) {
		if (cold_seen[i] == k)
			return 0;
		if (cold_seen[i] == 0) {
			cold_seen[i] = k;
			return 1;
		}
	}
	return 0;
}
/* FAKE_CUDA_STREAMS=1: a made stream that launches run on is a queue of its own, run
 * at once with the default stream's and the others' (each kernel at its full length,
 * as kernels that leave each other room do), so that kernels of two streams overlap;
 * the GPU's busy time (busy_ns) counts their overlap once. Not in the shared GPU. */
static int streams_mode;
static int64_t union_end_ns; /* the end of the busy time counted so far */
static int64_t all_until_ns; /* when every queue has run what it holds */
/* FAKE_CUDA_SLOW_SIDE_RECORD=<n>: every n-th event recorded on a made stream returns
 * 1 ms after it was recorded, as a call whose thread was descheduled does. */
static long slow_side_every;
/* FAKE_CUDA_EARLY_EVENTS=1 (shared GPU): an event recorded on this context's queue
 * while it is empty completes at once, whichever context holds the GPU, and the work
 * queued after it waits for the context's turn, as a GPU's event first on a drained
 * stream can run outside the context's turn (PyTorch's graph + eager step on an H100:
 * docs/cuda-hook.md, Known gaps, graph launches' samples). */
static int early_events;
static _Atomic long side_records;
static void sg_setup(const char *path);
static void sg_push(int64_t work_ns, int ev);
static struct sg *sg; /* FAKE_CUDA_SHARED_GPU, below */
static int64_t sg_slice_ns = 2000000LL; /* FAKE_CUDA_SLICE_US */
static int64_t sg_switch_ns = 25000LL;  /* FAKE_CUDA_SWITCH_US */
static uint64_t busy_ns, kernel_ns, syncs, bad_syncs, launches, memsets;
static _Atomic uint64_t legacy_events;
static _Atomic uint64_t event_calls;
static _Atomic int capturing;

struct alloc {
	uint64_t key;
	uint64_t size;
	int dev;
	int live;
	int pooled;     /* from the device's pool: freeing it keeps it reserved there */
	uintptr_t ctx;  /* the context it belongs to, freed with it; 0: none (a VMM handle) */
};

/* Default pools: memory reserved and not allocated, per device. */
static uint64_t pool_cached[MAXDEV];
#define POOL_HANDLE(d) ((CUmemoryPool)(uintptr_t)(0x3000 + (d)))
static struct alloc *allocs;
static size_t nallocs, cap_allocs;

/* A forked child holds none of its parent's memory as its own; it keeps the parent's
 * descriptor open (and with it the parent's memory) until it exits or execs. */
static void fork_child(void)
{
	memset(used, 0, sizeof(used));
	memset(peak, 0, sizeof(peak));
	memset(pool_cached, 0, sizeof(pool_cached));
	nallocs = 0;
	my_proc = NULL;
	my_proc_pid = 0;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
/* A synchronize returns when the simulated GPU is done, as the real driver's does by
 * default (it spins while it has a core to spare): asleep until SYNC_SPIN_NS before,
 * then spinning. A sleep alone woke 60-150 us late on a loaded machine, time the
 * simulated GPU sat idle inside the program's bursts that no real spinning
 * synchronize leaves it, and that the hook's burst measurement bills (the program's
 * own gaps; docs/cuda-hook.md, Known gaps). */
#define SYNC_SPIN_NS 300000LL
/* FAKE_CUDA_SYNC_WAKE_US=<us>: a synchronize that waited returns this long after the
 * GPU is done, as a driver set to block (cudaDeviceScheduleBlockingSync) wakes its
 * sleeping host thread some time after the GPU's interrupt (docs/cuda-hook.md, Known
 * gaps). Not in the shared GPU. */
static int64_t sync_wake_ns;
static void wait_until(int64_t until)
{
	if (sync_wake_ns > 0 && until > now_ns())
		until += sync_wake_ns;
	int64_t nap = until - SYNC_SPIN_NS;
	if (nap > now_ns()) {
		struct timespec ts = {.tv_sec = nap / 1000000000LL, .tv_nsec = nap % 1000000000LL};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	while (now_ns() < until)
		;
}

__attribute__((constructor)) static void setup(void)
{
	const char *s = getenv("FAKE_CUDA_DEVICES");
	if (s)
		ndev = atoi(s) > 0 && atoi(s) <= MAXDEV ? atoi(s) : ndev;
	if ((s = getenv("FAKE_CUDA_CTX_MIB")))
		ctx_mib = strtoull(s, NULL, 10);
	if ((s = getenv("FAKE_CUDA_MEM_MIB")))
		mem_bytes = strtoull(s, NULL, 10) << 20;
	long long os, ol, op;
	if ((s = getenv("FAKE_CUDA_OTHER")) && sscanf(s, "%lld,%lld,%lld", &os, &ol, &op) == 3 && op > 0 && ol >= 0 &&
	    ol < op && os >= 0 && os + ol <= op) {
		other_start_ns = os * 1000;
		other_len_ns = ol * 1000;
		other_period_ns = op * 1000;
	}
	if ((s = getenv("FAKE_CUDA_EVENT_NS")) && atoll(s) > 0)
		event_ns = atoll(s);
	if ((s = getenv("FAKE_CUDA_LAUNCH_NS")) && atoll(s) > 0)
		launch_ns = atoll(s);
	if ((s = getenv("FAKE_CUDA_GAP_NS")) && atoll(s) > 0)
		gap_ns = atoll(s);
	if ((s = getenv("FAKE_CUDA_SYNC_WAKE_US")) && atoll(s) > 0)
		sync_wake_ns = atoll(s) * 1000;
	if ((s = getenv("FAKE_CUDA_FENCE_NS")) && atoll(s) > 0)
		fence_ns = atoll(s);
	if ((s = getenv("FAKE_CUDA_CALL_NS")) && atoll(s) > 0)
		call_ns = atoll(s);
	if ((s = getenv("FAKE_CUDA_COLD_US")) && atoll(s) > 0)
		cold_us = atoll(s);
	streams_mode = (s = getenv("FAKE_CUDA_STREAMS")) && atoi(s) > 0;
	if ((s = getenv("FAKE_CUDA_SLOW_SIDE_RECORD")) && atol(s) > 0)
		slow_side_every = atol(s);
	if ((s = getenv("FAKE_CUDA_SLICE_US")) && atoll(s) > 0)
		sg_slice_ns = atoll(s) * 1000;
	if ((s = getenv("FAKE_CUDA_EARLY_EVENTS")) && atoi(s) > 0)
		early_events = 1;
	if ((s = getenv("FAKE_CUDA_SWITCH_US")) && atoll(s) >= 0)
		sg_switch_ns = atoll(s) * 1000;
	if ((s = getenv("FAKE_CUDA_SHARED_GPU")) && *s)
		sg_setup(s);
	pthread_atfork(NULL, NULL, fork_child);
	if ((s = getenv("FAKE_CUDA_TALLY")) && *s) {
		snprintf(tally_path, sizeof(tally_path), "%s", s);
		int fd = open(s, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || ftruncate(fd, sizeof(struct tally)) != 0) {
			fprintf(stderr, "fake libcuda: cannot open the tally %s\n", s);
			abort();
		}
		tally = mmap(NULL, sizeof(struct tally), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (tally == MAP_FAILED) {
			fprintf(stderr, "fake libcuda: cannot map the tally %s\n", s);
			abort();
		}
	}
}

/* ---- bookkeeping -------------------------------------------------------------- */

static uintptr_t current_ctx(int dev);

/* Takes size bytes on dev for ctx (0: no context's, as a VMM handle is). */
static CUresult take_in(int dev, uint64_t size, uint64_t *key, uintptr_t ctx)
{
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	if (size == 0 || used[dev] + size > mem_bytes) {
		pthread_mutex_unlock(&mu);
		return size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (nallocs == cap_allocs) {
		cap_allocs = cap_allocs ? cap_allocs * 2 : 1024;
		allocs = realloc(allocs, cap_allocs * sizeof(*allocs));
	}
	*key = atomic_fetch_add(&next_addr, (size + 0xfffff) & ~0xfffffULL);
	allocs[nallocs++] = (struct alloc){.key = *key, .size = size, .dev = dev, .live = 1, .ctx = ctx};
	used[dev] += size;
	if (used[dev] > peak[dev])
		peak[dev] = used[dev];
	tally_add(dev, (int64_t)size);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* Takes size bytes on dev for the calling thread's current context. */
static CUresult take(int dev, uint64_t size, uint64_t *key)
{
	return take_in(dev, size, key, current_ctx(dev));
}

/* An allocation from the device's pool: from its cache when that holds enough. */
static CUresult pool_take(int dev, uint64_t size, uint64_t *key)
{
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	if (size == 0 || pool_cached[dev] < size) {
		pthread_mutex_unlock(&mu);
		CUresult rc = take(dev, size, key);
		if (rc == CUDA_SUCCESS) {
			pthread_mutex_lock(&mu);
			allocs[nallocs - 1].pooled = 1;
			pthread_mutex_unlock(&mu);
		}
		return rc;
	}
	pool_cached[dev] -= size;
	if (nallocs == cap_allocs) {
		cap_allocs = cap_allocs ? cap_allocs * 2 : 1024;
		allocs = realloc(allocs, cap_allocs * sizeof(*allocs));
	}
	*key = atomic_fetch_add(&next_addr, (size + 0xfffff) & ~0xfffffULL);
	allocs[nallocs++] = (struct alloc){.key = *key, .size = size, .dev = dev, .live = 1, .pooled = 1, .ctx = current_ctx(dev)};
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

static CUresult give(uint64_t key)
{
	pthread_mutex_lock(&mu);
	for (size_t i = nallocs; i-- > 0;) {
		if (allocs[i].live && allocs[i].key == key) {
			allocs[i].live = 0;
			if (allocs[i].pooled)
				pool_cached[allocs[i].dev] += allocs[i].size; /* back to the pool */
			else {
				used[allocs[i].dev] -= allocs[i].size;
				tally_add(allocs[i].dev, -(int64_t)allocs[i].size);
			}
			allocs[i] = allocs[--nallocs];
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

static uint64_t size_of(uint64_t key)
{
	uint64_t s = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].live && allocs[i].key == key)
			s = allocs[i].size;
	pthread_mutex_unlock(&mu);
	return s;
}

/* Frees every allocation of ctx (all of them where all is set), as give() does. */
static void free_where(uintptr_t ctx, int all)
{
	pthread_mutex_lock(&mu);
	for (size_t i = nallocs; i-- > 0;) {
		if (!all && (allocs[i].ctx != ctx || ctx == 0))
			continue;
		if (allocs[i].live && allocs[i].pooled)
			pool_cached[allocs[i].dev] += allocs[i].size;
		else if (allocs[i].live) {
			used[allocs[i].dev] -= allocs[i].size;
			tally_add(allocs[i].dev, -(int64_t)allocs[i].size);
		}
		allocs[i] = allocs[--nallocs];
	}
	pthread_mutex_unlock(&mu);
}

void fake_cuda_free_all(void) { free_where(0, 1); }

void fake_cuda_stats(struct fake_cuda_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (tally != NULL)
		tally_reap();
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXDEV; i++) {
		out->used[i] = used[i];
		out->peak[i] = peak[i];
		out->all_used[i] = tally ? atomic_load(&tally->used[i]) : used[i];
		out->all_peak[i] = tally ? atomic_load(&tally->peak[i]) : peak[i];
	}
	out->busy_ns = busy_ns;
	out->kernel_ns = kernel_ns;
	out->syncs = syncs;
	out->bad_syncs = bad_syncs;
	out->launches = launches;
	out->memsets = memsets;
	out->legacy_events = atomic_load(&legacy_events);
	out->event_calls = atomic_load(&event_calls);
	pthread_mutex_unlock(&mu);
}

/* ---- init and devices ---------------------------------------------------------- */

/* Physical device (UUID ...<n+1>, PCI bus n+1) behind each device handle; the handles
 * are 0..ndev-1 after CUDA_VISIBLE_DEVICES, as with the real driver. */
static int phys[MAXDEV] = {0, 1, 2, 3, 4, 5, 6, 7};

/* The physical device that one CUDA_VISIBLE_DEVICES entry names: an index or a UUID
 * (prefix) of the fake devices; -1 if none. */
static int visible_entry(const char *t, int nphys)
{
	char *end;
	long i = strtol(t, &end, 10);
	if (*t != '\0' && *end == '\0')
		return i >= 0 && i < nphys ? (int)i : -1;
	if (strncasecmp(t, "GPU-", 4) == 0)
		t += 4;
	int found = -1;
	for (int d = 0; d < nphys && *t != '\0'; d++) {
		char u[48];
		snprintf(u, sizeof(u), "fa4e0000-0000-0000-0000-%012x", d + 1);
		if (strncasecmp(u, t, strlen(t)) == 0) {
			if (found >= 0)
				return -1;
			found = d;
		}
	}
	return found;
}

/* MPS, as a client sees it: the driver reads the MPS variables when it initialises and
 * connects to the control daemon through CUDA_MPS_PIPE_DIRECTORY; here "connected"
 * means that the directory holds a "control" entry. As measured on an H200 (132 SMs):
 * the client's SM count is its percentage of the SMs, in whole TPCs of 2 SMs; a
 * context's execution affinity is rounded up to a TPC, and one asking for the client's
 * whole share or more reads back every SM of the GPU. The SM counts that contexts were
 * created with are kept for the tests. */
static struct fake_cuda_mps mps_seen;
static int mps_partition = 132;              /* the client's SMs */
static __thread unsigned int current_affinity; /* the current context's, 0: the client's */

void fake_cuda_mps(struct fake_cuda_mps *out)
{
	pthread_mutex_lock(&mu);
	*out = mps_seen;
	pthread_mutex_unlock(&mu);
}

static void mps_init(void)
{
	const char *names[3] = {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"};
	char *vals[3] = {mps_seen.pipe, mps_seen.percent, mps_seen.pinned};
	for (int i = 0; i < 3; i++) {
		const char *v = getenv(names[i]);
		snprintf(vals[i], sizeof(mps_seen.pipe), "%s", v != NULL ? v : "(unset)");
	}
	char control[300];
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	snprintf(control, sizeof(control), "%s/control", pipe != NULL ? pipe : "/tmp/nvidia-mps");
	mps_seen.enabled = access(control, F_OK) == 0;
	double p = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") ? atof(getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) : 100;
	if (mps_seen.enabled && p > 0 && p < 100)
		mps_partition = 2 * (int)(132 * p / 200) < 2 ? 2 : 2 * (int)(132 * p / 200);
}

CUresult cuCtxGetExecAffinity(CUexecAffinityParam *a, CUexecAffinityType type)
{
	if (!mps_seen.enabled || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT)
		return CUDA_ERROR_NOT_SUPPORTED;
	a->type = type;
	a->param.smCount.val = current_affinity ? current_affinity : (unsigned int)mps_partition;
	return CUDA_SUCCESS;
}

static void mps_affinity(const CUexecAffinityParam *p, int n)
{
	current_affinity = 0;
	for (int i = 0; p != NULL && i < n; i++)
		if (p[i].type == CU_EXEC_AFFINITY_TYPE_SM_COUNT) {
			unsigned int v = p[i].param.smCount.val;
			mps_seen.ctx_sms = v;
			current_affinity = v >= (unsigned int)mps_partition ? 132 : (v + 1) / 2 * 2;
		}
}

CUresult cuInit(unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	tally_claim(); /* the driver opens its descriptors here */
	if (!initialized) {
		mps_init();
		/* Like the driver: CUDA_VISIBLE_DEVICES, read once at initialisation, lists the
		 * devices the process sees, in its order, up to the first entry that names no
		 * device or one already listed. */
		const char *v = getenv("CUDA_VISIBLE_DEVICES");
		if (v != NULL && getenv("FAKE_CUDA_IGNORE_VISIBLE") == NULL) {
			int nphys = ndev, n = 0;
			char buf[1024];
			snprintf(buf, sizeof(buf), "%s", v);
			for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL && n < MAXDEV;
			     t = strtok_r(NULL, ",", &save)) {
				int d = visible_entry(t, nphys), seen = 0;
				for (int i = 0; i < n; i++)
					seen |= phys[i] == d;
				if (d < 0 || seen)
					break;
				phys[n++] = d;
			}
			ndev = n;
		}
		initialized = 1;
	}
	pthread_mutex_unlock(&mu);
	return ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

#define NEED_INIT()                                   \
	do {                                          \
		if (!initialized)                     \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

CUresult cuDeviceGetCount(int *count)
{
	NEED_INIT();
	*count = ndev;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	NEED_INIT();
	if (ordinal < 0 || ordinal >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	memset(u, 0, sizeof(*u));
	u->bytes[0] = (char)0xfa;
	u->bytes[1] = 0x4e;
	u->bytes[15] = (char)(phys[d] + 1);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *d, const char *bus)
{
	unsigned dom, b, dev, fn;
	NEED_INIT();
	if (sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn) != 4 || b < 1 || b > MAXDEV)
		return CUDA_ERROR_INVALID_VALUE;
	for (int h = 0; h < ndev; h++)
		if (phys[h] == (int)b - 1) {
			*d = h;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = mem_bytes;
	return CUDA_SUCCESS;
}

static int primary_refs[MAXDEV]; /* guarded by mu */

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*c = (CUcontext)(uintptr_t)(0x1000 + d);
	pthread_mutex_lock(&mu);
	primary_refs[d]++;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* Created contexts (and green contexts) are handles 0x1000 + device + 0x100 * n and
 * take FAKE_CUDA_CTX_MIB (default 0) of device memory each until destroyed; the
 * primary context of device d is 0x1000 + d and takes nothing. */
#define CTX_DEV(c) ((int)(((uintptr_t)(c) - 0x1000) & 0xff))
static _Atomic uint64_t next_ctx = 1;
static __thread uintptr_t current_handle;
static struct {
	uintptr_t handle;
	uint64_t key; /* its memory, 0: none */
} made[256];

static CUresult make_ctx(uintptr_t *out, CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	uint64_t key = 0;
	if (ctx_mib > 0) {
		CUresult rc = take_in(d, ctx_mib << 20, &key, 0);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	uintptr_t h = 0x1000 + (uintptr_t)d + 0x100 * (uintptr_t)atomic_fetch_add(&next_ctx, 1);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < 256; i++)
		if (made[i].handle == 0) {
			made[i].handle = h;
			made[i].key = key;
			break;
		}
	pthread_mutex_unlock(&mu);
	*out = h;
	return CUDA_SUCCESS;
}

static CUresult destroy_ctx(uintptr_t h)
{
	uint64_t key = 0;
	int found = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < 256; i++)
		if (made[i].handle == h) {
			key = made[i].key;
			made[i].handle = 0;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	if (!found)
		return CUDA_ERROR_INVALID_CONTEXT;
	free_where(h, 0); /* what was allocated in it goes with it */
	return key ? give(key) : CUDA_SUCCESS;
}

CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice d)
{
	(void)flags;
	mps_affinity(p != NULL ? p->execAffinityParams : NULL, p != NULL ? p->numExecAffinityParams : 0);
	uintptr_t h;
	CUresult rc = make_ctx(&h, d);
	if (rc == CUDA_SUCCESS) {
		*c = (CUcontext)h;
		current = d;
		current_handle = h;
	}
	return rc;
}

CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d)
{
	return cuCtxCreate_v4(c, NULL, flags, d);
}

CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice d)
{
	CUctxCreateParams cp = {.execAffinityParams = p, .numExecAffinityParams = n};
	return cuCtxCreate_v4(c, &cp, flags, d);
}

CUresult cuCtxDestroy_v2(CUcontext c) { return destroy_ctx((uintptr_t)c); }

/* The ABI before CUDA 3.2 / 4.0, which the driver still exports: the same calls. */
CUresult cuCtxCreate(CUcontext *c, unsigned int flags, CUdevice d) { return cuCtxCreate_v4(c, NULL, flags, d); }
CUresult cuCtxDestroy(CUcontext c) { return destroy_ctx((uintptr_t)c); }

CUresult cuGreenCtxCreate(CUgreenCtx *c, CUdevResourceDesc desc, CUdevice d, unsigned int flags)
{
	(void)desc;
	(void)flags;
	uintptr_t h;
	CUresult rc = make_ctx(&h, d);
	if (rc == CUDA_SUCCESS)
		*c = (CUgreenCtx)h;
	return rc;
}

CUresult cuGreenCtxDestroy(CUgreenCtx c) { return destroy_ctx((uintptr_t)c); }

/* The primary context's last release destroys it, and with it what was allocated in
 * it (a reset, below, frees that too, the context staying retained). */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	int last = primary_refs[d] > 0 && --primary_refs[d] == 0;
	pthread_mutex_unlock(&mu);
	if (last)
		free_where(0x1000 + (uintptr_t)d, 0);
	return CUDA_SUCCESS;
}


CUresult cuCtxSetCurrent(CUcontext c)
{
	current_affinity = 0;
	current = c == NULL ? -1 : CTX_DEV(c);
	current_handle = (uintptr_t)c;
	return CUDA_SUCCESS;
}

static uintptr_t current_ctx(int dev)
{
	return current_handle ? current_handle : 0x1000 + (uintptr_t)dev;
}

CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = current < 0 ? NULL : (CUcontext)(current_handle ? current_handle : 0x1000 + (uintptr_t)current);
	return CUDA_SUCCESS;
}

/* Device limits: the malloc heap and printf FIFO take their size, the stack its size
 * times 132 SMs times 2048 threads, all taken from the device when set. Per device
 * here (the driver keeps them per context). */
static size_t limit_value[MAXDEV][3];
static uint64_t limit_key[MAXDEV][3];
static const size_t limit_default[3] = {1024, 1 << 20, 8 << 20};

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
		*v = mps_partition;
	else if (a == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
		*v = 2048;
	else if (a == CU_DEVICE_ATTRIBUTE_MPS_ENABLED)
		*v = mps_seen.enabled;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t *v, CUlimit l)
{
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if ((unsigned)l > 2)
		return CUDA_ERROR_INVALID_VALUE;
	*v = limit_value[current][l] ? limit_value[current][l] : limit_default[l];
	return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit l, size_t v)
{
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if ((unsigned)l > 2)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t mult = l == CU_LIMIT_STACK_SIZE ? 132 * 2048 : 1;
	uint64_t extra = v > limit_default[l] ? (v - limit_default[l]) * mult : 0, key = 0;
	if (extra > 0) {
		CUresult rc = take(current, extra, &key);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	if (limit_key[current][l])
		give(limit_key[current][l]);
	limit_key[current][l] = key;
	limit_value[current][l] = v;
	return CUDA_SUCCESS;
}

/* A reset frees what was allocated in the primary context, its raised limits too,
 * which are back at their defaults (here per device, as above). */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	free_where(0x1000 + (uintptr_t)d, 0);
	memset(limit_value[d], 0, sizeof(limit_value[d]));
	memset(limit_key[d], 0, sizeof(limit_key[d]));
	return CUDA_SUCCESS;
}

/* The ABI before CUDA 11.0: the same calls. */
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }

/* Modules and libraries: an image (or file name) "fake-module <MiB>" takes that much
 * of the current device when loaded, until unloaded; a PTX text (one with a ".entry")
 * loads as a module that takes nothing, whose functions cuModuleGetFunction finds. */
static CUresult load_image(void **out, const void *image)
{
	unsigned long long mib;
	uint64_t key;
	if (image != NULL && strstr((const char *)image, ".entry") != NULL)
		mib = 0;
	else if (image == NULL || sscanf((const char *)image, "fake-module %llu", &mib) != 1)
		return CUDA_ERROR_INVALID_VALUE;
	if (mib == 0) {
		*out = (void *)(uintptr_t)atomic_fetch_add(&next_addr, 0x100000);
		return CUDA_SUCCESS;
	}
	CUresult rc = take(current, mib << 20, &key);
	if (rc == CUDA_SUCCESS)
		*out = (void *)(uintptr_t)key;
	return rc;
}

static CUresult unload_image(void *h)
{
	(void)give((uint64_t)(uintptr_t)h); /* a 0 MiB module holds nothing */
	return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *m, const char *f) { return load_image((void **)m, f); }
CUresult cuModuleLoadData(CUmodule *m, const void *i) { return load_image((void **)m, i); }
CUresult cuModuleLoadDataEx(CUmodule *m, const void *i, unsigned int n, CUjit_option *o, void **v)
{
	(void)n;
	(void)o;
	(void)v;
	return load_image((void **)m, i);
}
CUresult cuModuleLoadFatBinary(CUmodule *m, const void *i) { return load_image((void **)m, i); }
CUresult cuModuleUnload(CUmodule m) { return unload_image(m); }
/* Any name is a function of any module here: its launches run gridDimX microseconds. */
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	if (f == NULL || m == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*f = (CUfunction)(uintptr_t)atomic_fetch_add(&next_addr, 0x100);
	return CUDA_SUCCESS;
}
CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned int jn,
			   CUlibraryOption *lo, void **lv, unsigned int ln)
{
	(void)jo, (void)jv, (void)jn, (void)lo, (void)lv, (void)ln;
	return load_image((void **)l, code);
}
CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *f, CUjit_option *jo, void **jv, unsigned int jn,
			       CUlibraryOption *lo, void **lv, unsigned int ln)
{
	(void)jo, (void)jv, (void)jn, (void)lo, (void)lv, (void)ln;
	return load_image((void **)l, f);
}
CUresult cuLibraryUnload(CUlibrary l) { return unload_image(l); }

CUresult cuCtxGetDevice(CUdevice *d)
{
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = current;
	return CUDA_SUCCESS;
}

/* ---- memory ----------------------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total)
{
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	*freeb = mem_bytes - used[current];
	*total = mem_bytes;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return take(current, n, (uint64_t *)p); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f) { (void)f; return take(current, n, (uint64_t *)p); }
static CUresult capture_alloc(int dev, size_t n, CUdeviceptr *p);
static int capturing_now(void);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
	(void)s;
	return capturing_now() ? capture_alloc(current, n, p) : pool_take(current, n, (uint64_t *)p);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
	(void)s;
	uintptr_t h = (uintptr_t)pool;
	if (h < 0x3000 || h >= 0x3000 + (uintptr_t)ndev)
		return CUDA_ERROR_INVALID_VALUE;
	return pool_take((int)(h - 0x3000), n, (uint64_t *)p);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*pool = POOL_HANDLE(d);
	return CUDA_SUCCESS;
}

static int pool_dev(CUmemoryPool pool)
{
	uintptr_t h = (uintptr_t)pool;
	return h >= 0x3000 && h < 0x3000 + (uintptr_t)ndev ? (int)(h - 0x3000) : -1;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	int d = pool_dev(pool);
	if (d < 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (pool_cached[d] > keep) {
		used[d] -= pool_cached[d] - keep;
		tally_add(d, -(int64_t)(pool_cached[d] - keep));
		pool_cached[d] = keep;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	int d = pool_dev(pool);
	if (d < 0)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t live = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].live && allocs[i].pooled && allocs[i].dev == d)
			live += allocs[i].size;
	uint64_t reserved = live + pool_cached[d];
	pthread_mutex_unlock(&mu);
	switch (attr) {
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*(uint64_t *)value = reserved;
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*(uint64_t *)value = live;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

/* Default pools cannot be destroyed. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	return pool_dev(pool) < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_PERMITTED;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
	return cuMemAllocFromPoolAsync(p, n, pool, s);
}
CUresult cuMemFree_v2(CUdeviceptr p) { return give(p); }
/* CU_POINTER_ATTRIBUTE_BUFFER_ID (7) alone: an allocation's address, which the fake
 * never hands out twice, names it for the process's lifetime. */
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	if (attr != 7)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].live && p >= allocs[i].key && p < allocs[i].key + allocs[i].size) {
			*(unsigned long long *)data = allocs[i].key;
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}
/* A graph allocation freed outside the graph: its memory stays in the graph pool. */
static int graph_ptr(CUdeviceptr p);
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
	(void)s;
	if (capturing_now() || graph_ptr(p))
		return CUDA_SUCCESS; /* a free node, or memory that stays in the graph pool */
	return give(p);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
	(void)elem;
	*pitch = (w + 255) & ~(size_t)255;
	return take(current, *pitch * h, (uint64_t *)p);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	(void)flags;
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_NOT_SUPPORTED;
	return take_in(prop->location.id, size, (uint64_t *)h, 0); /* no context's: outlives them */
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return give(h); }

/* CUDA 3.1's allocations (32-bit pointers and sizes), as the driver still exports them:
 * they take memory like the others (the hook must never let them through). */
CUresult cuMemAlloc(unsigned int *p, unsigned int n)
{
	uint64_t k = 0;
	CUresult rc = take(current, n, &k);
	if (rc == CUDA_SUCCESS)
		*p = (unsigned int)k;
	return rc;
}
CUresult cuMemAllocPitch(unsigned int *p, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int elem)
{
	(void)elem;
	*pitch = (w + 255) & ~255u;
	return cuMemAlloc(p, *pitch * h);
}

/* Arrays take their elements rounded up to 64 KiB plus 64 KiB, more than the hook's
 * estimate, as tiled layouts do on a real GPU. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
	uint64_t e = (f == CU_AD_FORMAT_FLOAT || f == CU_AD_FORMAT_SIGNED_INT32 || f == CU_AD_FORMAT_UNSIGNED_INT32) ? 4
		     : (f == CU_AD_FORMAT_HALF || f == CU_AD_FORMAT_SIGNED_INT16 || f == CU_AD_FORMAT_UNSIGNED_INT16) ? 2
														       : 1;
	uint64_t b = (uint64_t)w * (h ? h : 1) * (d ? d : 1) * e * ch;
	return ((b + 65535) & ~65535ULL) + 65536; /* and a header the estimate cannot know */
}

CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
	return take(current, array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), (uint64_t *)a);
}
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	return take(current, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), (uint64_t *)a);
}
/* CUDA 3.1's memory figures: the device's, capped at 32 bits. */
CUresult cuMemGetInfo(unsigned int *f, unsigned int *t)
{
	size_t f2, t2;
	CUresult rc = cuMemGetInfo_v2(&f2, &t2);
	if (rc == CUDA_SUCCESS) {
		*f = f2 > UINT32_MAX ? UINT32_MAX : (unsigned int)f2;
		*t = t2 > UINT32_MAX ? UINT32_MAX : (unsigned int)t2;
	}
	return rc;
}
CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d)
{
	size_t b2;
	CUresult rc = cuDeviceTotalMem_v2(&b2, d);
	if (rc == CUDA_SUCCESS)
		*b = b2 > UINT32_MAX ? UINT32_MAX : (unsigned int)b2;
	return rc;
}

/* CUDA 3.1's array creation (32-bit descriptors): 64 MiB each here. */
CUresult cuArrayCreate(CUarray *a, const void *d)
{
	(void)d;
	return take(current, 64 << 20, (uint64_t *)a);
}
CUresult cuArray3DCreate(CUarray *a, const void *d)
{
	(void)d;
	return take(current, 64 << 20, (uint64_t *)a);
}
CUresult cuArrayDestroy(CUarray a) { return give((uint64_t)(uintptr_t)a); }
CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	uint64_t b = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
	return take(current, levels > 1 ? b + b / 2 : b, (uint64_t *)a);
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return give((uint64_t)(uintptr_t)a); }
CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUarray a, CUdevice d)
{
	(void)d;
	memset(r, 0, sizeof(*r));
	r->size = size_of((uint64_t)(uintptr_t)a);
	r->alignment = 65536;
	return r->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUmipmappedArray a, CUdevice d)
{
	return cuArrayGetMemoryRequirements(r, (CUarray)a, d);
}

/* ---- the simulated GPU ------------------------------------------------------------- */

/* When work of work_ns queued to start at t ends; with work_ns 0, when an event
 * queued at t completes. The other context's turns (FAKE_CUDA_OTHER) are skipped. */
static int64_t gpu_advance(int64_t t, int64_t work_ns)
{
	if (other_len_ns == 0)
		return t + work_ns;
	for (;;) {
		int64_t ph = t % other_period_ns;
		if (ph >= other_start_ns && ph < other_start_ns + other_len_ns) {
			t += other_start_ns + other_len_ns - ph;
			continue;
		}
		int64_t free_ns = ph < other_start_ns ? other_start_ns - ph : other_period_ns - ph + other_start_ns;
		if (work_ns <= free_ns)
			return t + work_ns;
		work_ns -= free_ns;
		t += free_ns;
	}
}

static void capture_us(uint64_t us);
static int64_t *stream_queue(CUstream s);
static void stream_launched(CUstream s);
/* Runs us of work on stream s's queue (the default one but with FAKE_CUDA_STREAMS): a
 * kernel launch, or (launch 0) other work such as a memset, not counted as a launch. */
static CUresult run_work(uint64_t us, CUstream s, int launch)
{
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (atomic_load(&capturing)) {
		capture_us(us);
		return CUDA_SUCCESS; /* recorded into the graph, not run */
	}
	if (sg != NULL) {
		sg_push((int64_t)us * 1000, -1);
		pthread_mutex_lock(&mu);
		stream_launched(s);
		busy_ns += us * 1000;
		kernel_ns += us * 1000;
		launches += launch;
		memsets += !launch;
		pthread_mutex_unlock(&mu);
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&mu);
	stream_launched(s);
	int64_t *q = stream_queue(s);
	int64_t now = now_ns();
	/* A real driver blocks a launch when its queue is full; model a queue that holds
	 * 50 ms of work. */
	while (*q > now + 50000000LL) {
		int64_t wait = *q - 50000000LL;
		pthread_mutex_unlock(&mu);
		struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		pthread_mutex_lock(&mu);
		now = now_ns();
	}
	int64_t gap = *q <= now ? 0 : fence_ns > 0 && q == fence_q && *q <= fence_at ? fence_ns : gap_ns;
	int64_t start = *q > now ? *q + gap : now + launch_ns;
	*q = gpu_advance(start, (int64_t)us * 1000);
	kernel_ns += us * 1000;
	if (streams_mode) {
		int64_t from = start - gap > union_end_ns ? start - gap : union_end_ns;
		busy_ns += *q > from ? (uint64_t)(*q - from) : 0;
		union_end_ns = *q > union_end_ns ? *q : union_end_ns;
		all_until_ns = *q > all_until_ns ? *q : all_until_ns;
	} else {
		busy_ns += us * 1000 + (uint64_t)gap;
	}
	launches += launch;
	memsets += !launch;
	pthread_mutex_unlock(&mu);
	call_tail();
	return CUDA_SUCCESS;
}

static CUresult run_on(uint64_t us, CUstream s)
{
	return run_work(us, s, 1);
}

/* A memset of a few words runs as 1 us of work on its stream. */
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
	(void)v;
	if (d == 0 || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return run_work(1 + (uint64_t)n / 250000, s, 0);
}
static CUresult run(uint64_t us)
{
	return run_on(us, NULL);
}

/* FAKE_CUDA_SHARED_GPU=<file>: the processes naming one file share one simulated GPU
 * that runs their contexts in turns, as a time-sliced GPU does: the context whose
 * turn it is runs its queue for up to a time slice (2 ms, or FAKE_CUDA_SLICE_US) while another has work, then the
 * next with work gets a turn (after a switch of 25 us, or FAKE_CUDA_SWITCH_US); a context alone runs on. Events
 * complete when their context's queue reaches them in its turn. The simulation is
 * advanced lazily to the present by every call that looks at the GPU. */
#define SG_SLOTS 4
#define SG_ITEMS 8192
#define SG_EVENTS 256
struct sg_item {
	int64_t left_ns;
	int32_t ev; /* an event (no work), or -1 */
	uint32_t gen;
};
struct sg_slot {
	int32_t pid;
	uint32_t head, tail;
	int64_t queued_ns;
	struct sg_item q[SG_ITEMS];
	int64_t ev_at[SG_EVENTS]; /* completion time, -1 while pending */
	uint32_t ev_gen[SG_EVENTS];
	uint8_t ev_used[SG_EVENTS];
	/* Events recorded on an idle stream (sg_side): each completes as soon as this
	 * context holds the GPU at or after its recording. */
	struct {
		int32_t ev;
		uint32_t gen;
		int64_t rec;
	} side[SG_EVENTS];
	int nside;
};
struct sg {
	pthread_mutex_t mu;
	int init;
	int cur;
	int64_t t, slice_end;
	struct sg_slot s[SG_SLOTS];
};
static int sg_me = -1;

static void sg_setup(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) != 0 || ftruncate(fd, sizeof(struct sg)) != 0) {
		fprintf(stderr, "fake libcuda: cannot open the shared GPU %s\n", path);
		abort();
	}
	sg = mmap(NULL, sizeof(struct sg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (sg == MAP_FAILED) {
		fprintf(stderr, "fake libcuda: cannot map the shared GPU %s\n", path);
		abort();
	}
	if (!sg->init) {
		pthread_mutexattr_t a;
		pthread_mutexattr_init(&a);
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutex_init(&sg->mu, &a);
		sg->cur = 0;
		sg->init = 1;
	}
	pthread_mutex_lock(&sg->mu);
	for (int i = 0; i < SG_SLOTS && sg_me < 0; i++)
		if (sg->s[i].pid == 0 || kill(sg->s[i].pid, 0) != 0) {
			memset(&sg->s[i], 0, sizeof(sg->s[i]));
			sg->s[i].pid = getpid();
			sg_me = i;
		}
	pthread_mutex_unlock(&sg->mu);
	flock(fd, LOCK_UN);
	close(fd);
	if (sg_me < 0) {
		fprintf(stderr, "fake libcuda: the shared GPU %s has no free slot\n", path);
		abort();
	}
}

/* Completes the side events of a context that holds the GPU from a to b (caller
 * holds sg->mu): those recorded before b, at their recording or at a. */
static void sg_side_run(struct sg_slot *c, int64_t a, int64_t b)
{
	int k = 0;
	for (int i = 0; i < c->nside; i++) {
		if (c->side[i].rec < b) {
			if (c->ev_gen[c->side[i].ev] == c->side[i].gen)
				c->ev_at[c->side[i].ev] = c->side[i].rec > a ? c->side[i].rec : a;
		} else {
			c->side[k++] = c->side[i];
		}
	}
	c->nside = k;
}

/* Runs the shared GPU up to now (caller holds sg->mu). */
static void sg_advance(int64_t now)
{
	while (sg->t < now) {
		struct sg_slot *c = &sg->s[sg->cur];
		if (c->head == c->tail || sg->t >= sg->slice_end) {
			int next = -1;
			sg_side_run(c, sg->t, sg->t + 1); /* it still holds the GPU */
			for (int i = 1; i <= SG_SLOTS && next < 0; i++) {
				int k = (sg->cur + i) % SG_SLOTS;
				if (sg->s[k].pid != 0 && sg->s[k].head != sg->s[k].tail)
					next = k;
				else if (sg->s[k].pid != 0 && sg->s[k].nside > 0 && sg->s[k].side[0].rec <= sg->t &&
					 k != sg->cur) {
					/* Only side events: a turn that runs them and ends. */
					sg->t += sg_switch_ns;
					sg_side_run(&sg->s[k], sg->t, sg->t + 1);
				}
			}
			if (next < 0) {
				/* Idle: every context may run its side events. */
				for (int i = 0; i < SG_SLOTS; i++)
					sg_side_run(&sg->s[i], sg->t, now + 1);
				sg->t = now;
				return;
			}
			if (next != sg->cur)
				sg->t += sg_switch_ns;
			sg->cur = next;
			sg->slice_end = sg->t + sg_slice_ns;
			continue;
		}
		struct sg_item *it = &c->q[c->head % SG_ITEMS];
		if (it->ev >= 0) {
			if (c->ev_gen[it->ev] == it->gen)
				c->ev_at[it->ev] = sg->t;
			c->head++;
			continue;
		}
		int64_t run = it->left_ns;
		if (run > sg->slice_end - sg->t)
			run = sg->slice_end - sg->t;
		if (run > now - sg->t)
			run = now - sg->t;
		it->left_ns -= run;
		c->queued_ns -= run;
		sg_side_run(c, sg->t, sg->t + run);
		sg->t += run;
		if (it->left_ns == 0)
			c->head++;
	}
}

/* Queues work (ev < 0) or an event on this process's context, waiting while its queue
 * holds 50 ms of work or is full. */
static void sg_push(int64_t work_ns, int ev)
{
	pthread_mutex_lock(&sg->mu);
	struct sg_slot *me = &sg->s[sg_me];
	for (;;) {
		sg_advance(now_ns());
		if (me->queued_ns <= 50000000LL && me->tail - me->head < SG_ITEMS)
			break;
		pthread_mutex_unlock(&sg->mu);
		struct timespec ts = {0, 200000};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&sg->mu);
	}
	struct sg_item *it = &me->q[me->tail % SG_ITEMS];
	it->left_ns = work_ns;
	it->ev = ev;
	if (ev >= 0) {
		it->gen = ++me->ev_gen[ev];
		me->ev_at[ev] = -1;
	}
	me->queued_ns += work_ns;
	me->tail++;
	pthread_mutex_unlock(&sg->mu);
}

/* An event recorded on an idle stream: it completes when this context next holds the
 * GPU (now, if it holds it or the GPU is idle). */
static void sg_side(int ev)
{
	pthread_mutex_lock(&sg->mu);
	int64_t now = now_ns();
	sg_advance(now);
	struct sg_slot *me = &sg->s[sg_me];
	me->ev_gen[ev]++;
	me->ev_at[ev] = -1;
	int idle = 1;
	for (int i = 0; i < SG_SLOTS; i++)
		if (sg->s[i].pid != 0 && sg->s[i].head != sg->s[i].tail)
			idle = 0;
	if (idle || (sg->cur == sg_me && me->head != me->tail && sg->t < sg->slice_end))
		me->ev_at[ev] = now;
	else if (me->nside < SG_EVENTS) {
		me->side[me->nside].ev = ev;
		me->side[me->nside].gen = me->ev_gen[ev];
		me->side[me->nside].rec = now;
		me->nside++;
	}
	pthread_mutex_unlock(&sg->mu);
}

/* FAKE_CUDA_EARLY_EVENTS: an event on this context's empty queue completes now;
 * returns 0 where the queue holds work (the event is queued behind it). */
static int sg_early(int ev)
{
	pthread_mutex_lock(&sg->mu);
	int64_t now = now_ns();
	sg_advance(now);
	struct sg_slot *me = &sg->s[sg_me];
	int empty = me->head == me->tail;
	if (empty) {
		me->ev_gen[ev]++;
		me->ev_at[ev] = now;
	}
	pthread_mutex_unlock(&sg->mu);
	return empty;
}

/* When the event completed, or -1 while it is pending. */
static int64_t sg_event_at(int ev)
{
	pthread_mutex_lock(&sg->mu);
	sg_advance(now_ns());
	int64_t at = sg->s[sg_me].ev_at[ev];
	pthread_mutex_unlock(&sg->mu);
	return at;
}

/* Waits until this process's queue is empty (ev < 0) or the event has completed. */
static void sg_wait(int ev)
{
	for (;;) {
		pthread_mutex_lock(&sg->mu);
		sg_advance(now_ns());
		struct sg_slot *me = &sg->s[sg_me];
		int done = ev >= 0 ? me->ev_at[ev] >= 0 : me->head == me->tail;
		pthread_mutex_unlock(&sg->mu);
		if (done)
			return;
		struct timespec ts = {0, 50000};
		nanosleep(&ts, NULL);
	}
}

/* Events: each completes when the simulated queue reaches the point where it was
 * recorded (the queue's end then, or the time of recording if it was idle), as the
 * driver's do; elapsed time is the difference of those points. */
struct fevent {
	uint32_t magic;
	int recorded;
	int64_t at_ns;
	int sg_ev; /* its slot on the shared GPU */
};
#define EVENT_MAGIC 0x45564e54u

CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
	(void)flags;
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct fevent *v = calloc(1, sizeof(*v));
	if (v == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	v->magic = EVENT_MAGIC;
	v->sg_ev = -1;
	if (sg != NULL) {
		pthread_mutex_lock(&sg->mu);
		for (int i = 0; i < SG_EVENTS && v->sg_ev < 0; i++)
			if (!sg->s[sg_me].ev_used[i]) {
				sg->s[sg_me].ev_used[i] = 1;
				sg->s[sg_me].ev_at[i] = 0;
				v->sg_ev = i;
			}
		pthread_mutex_unlock(&sg->mu);
		if (v->sg_ev < 0) {
			free(v);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	*e = (CUevent)v;
	return CUDA_SUCCESS;
}
static struct fevent *event_of(CUevent e)
{
	struct fevent *v = (struct fevent *)e;
	return v != NULL && v->magic == EVENT_MAGIC ? v : NULL;
}
CUresult cuEventDestroy_v2(CUevent e)
{
	struct fevent *v = event_of(e);
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	v->magic = 0;
	if (sg != NULL) {
		pthread_mutex_lock(&sg->mu);
		sg->s[sg_me].ev_used[v->sg_ev] = 0;
		pthread_mutex_unlock(&sg->mu);
	}
	free(v);
	return CUDA_SUCCESS;
}
/* Streams made with cuStreamCreate. The simulated GPU runs every launch in one queue
 * per process (without FAKE_CUDA_STREAMS, and in the shared GPU): a made stream that
 * launches ran on is that queue; one that none ran on (the hook's probes' side
 * stream) holds no work, and an event recorded on it completes as soon as
 * the context holds the GPU, not behind the queue (as on a real GPU, where an idle
 * stream's event waits only for the context's time slice). */
#define STREAM_MAGIC 0x5354524du
struct fstream {
	uint32_t magic;
	unsigned flags;
	CUcontext ctx; /* the context current when it was made */
	int queued;    /* launches ran on it (a multi-device launch's entries): it is the queue */
	int64_t until; /* FAKE_CUDA_STREAMS: when its own queue has run what it holds */
};
static int made_stream(CUstream s)
{
	struct fstream *f = (struct fstream *)s;
	return f != NULL && (uintptr_t)f > 0x10000 && f->magic == STREAM_MAGIC;
}
/* The queue of s (caller holds mu); with FAKE_CUDA_STREAMS a made stream's own. */
static int64_t *stream_queue(CUstream s)
{
	if (!streams_mode || !made_stream(s))
		return &busy_until_ns;
	return &((struct fstream *)s)->until;
}
/* A launch ran on s (caller holds mu): a made stream is then no side stream, in every
 * mode (without FAKE_CUDA_STREAMS, and in the shared GPU, it is the process's one
 * queue, and an event recorded on it waits for what was launched before it). */
static void stream_launched(CUstream s)
{
	if (made_stream(s))
		((struct fstream *)s)->queued = 1;
}
CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	if (s == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct fstream *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->magic = STREAM_MAGIC;
	f->flags = flags;
	cuCtxGetCurrent(&f->ctx);
	*s = (CUstream)f;
	return CUDA_SUCCESS;
}
CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
	if (c == NULL || (s != NULL && !made_stream(s)))
		return CUDA_ERROR_INVALID_VALUE;
	if (s == NULL)
		return cuCtxGetCurrent(c);
	*c = ((struct fstream *)s)->ctx;
	return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s)
{
	if (!made_stream(s))
		return CUDA_ERROR_INVALID_VALUE;
	((struct fstream *)s)->magic = 0;
	free(s);
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s)
{
	struct fevent *v = event_of(e);
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (current < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (atomic_load(&capturing))
		return CUDA_ERROR_NOT_SUPPORTED; /* the hook must never record into a capture */
	atomic_fetch_add(&event_calls, 1);
	/* A made stream no launch ran on is a side stream (the hook's probes'); one that
	 * had launches is the process's one queue, as the default stream. */
	int side = made_stream(s) && !((struct fstream *)s)->queued;
	if (sg != NULL) {
		v->recorded = 1;
		if (side)
			sg_side(v->sg_ev);
		else if (!early_events || !sg_early(v->sg_ev))
			sg_push(0, v->sg_ev);
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&mu);
	int64_t now = now_ns();
	if (side) {
		v->at_ns = gpu_advance(now, 0);
		v->recorded = 1;
		pthread_mutex_unlock(&mu);
		return CUDA_SUCCESS;
	}
	int64_t *q = stream_queue(s);
	v->at_ns = gpu_advance(*q > now ? *q : now, event_ns);
	if (event_ns > 0)
		*q = v->at_ns;
	fence_q = q;
	fence_at = v->at_ns;
	v->recorded = 1;
	pthread_mutex_unlock(&mu);
	call_tail();
	return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s)
{
	if (s == NULL)
		atomic_fetch_add(&legacy_events, 1);
	CUresult rc = event_record(e, s);
	if (made_stream(s) && slow_side_every > 0 && (atomic_fetch_add(&side_records, 1) + 1) % slow_side_every == 0) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL); /* recorded, and returned late */
	}
	return rc;
}
CUresult cuEventQuery(CUevent e)
{
	struct fevent *v = event_of(e);
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (atomic_load(&capturing))
		return CUDA_ERROR_NOT_SUPPORTED;
	atomic_fetch_add(&event_calls, 1);
	if (sg != NULL)
		return !v->recorded || sg_event_at(v->sg_ev) >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
	pthread_mutex_lock(&mu);
	int done = !v->recorded || v->at_ns <= now_ns();
	pthread_mutex_unlock(&mu);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(CUevent e)
{
	struct fevent *v = event_of(e);
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (atomic_load(&capturing))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (sg != NULL) {
		if (v->recorded)
			sg_wait(v->sg_ev);
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&mu);
	int64_t until = v->recorded ? v->at_ns : 0;
	pthread_mutex_unlock(&mu);
	wait_until(until);
	return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
	struct fevent *va = event_of(a), *vb = event_of(b);
	if (va == NULL || vb == NULL || ms == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (sg != NULL) {
		if (!va->recorded || !vb->recorded)
			return CUDA_ERROR_INVALID_VALUE;
		int64_t at_a = sg_event_at(va->sg_ev), at_b = sg_event_at(vb->sg_ev);
		if (at_a < 0 || at_b < 0)
			return CUDA_ERROR_NOT_READY;
		*ms = (float)((double)(at_b - at_a) / 1e6);
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&mu);
	int64_t now = now_ns();
	CUresult rc = CUDA_SUCCESS;
	if (!va->recorded || !vb->recorded)
		rc = CUDA_ERROR_INVALID_VALUE; /* the driver's CUDA_ERROR_INVALID_HANDLE */
	else if (va->at_ns > now || vb->at_ns > now)
		rc = CUDA_ERROR_NOT_READY;
	else
		*ms = (float)((double)(vb->at_ns - va->at_ns) / 1e6);
	pthread_mutex_unlock(&mu);
	return rc;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			unsigned shm, CUstream s, void **p, void **e)
{
	(void)gy, (void)gz, (void)by, (void)bz, (void)shm, (void)p, (void)e;
	/* A block of more than one thread runs that many us, whatever the grid (the hook
	 * keys its per-kernel entries by function and grid). */
	if (bx > 1)
		gx = bx;
	if (cold_us > 0 && f != NULL) {
		pthread_mutex_lock(&mu);
		int first = cold_first(f);
		pthread_mutex_unlock(&mu);
		if (first)
			gx += (unsigned)cold_us;
	}
	return run_on(gx, s);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			     unsigned bz, unsigned shm, CUstream s, void **p, void **e)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
	(void)f, (void)p, (void)e;
	return run(c->gridDimX);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return cuLaunchKernelEx(c, f, p, e); }
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				   unsigned bz, unsigned shm, CUstream s, void **p)
{
	(void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)s, (void)p;
	return run(gx);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
					unsigned bz, unsigned shm, CUstream s, void **p)
{
	return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, p);
}
/* One kernel per GPU, each entry on a made stream of its GPU's context (or the
 * default stream): each runs gridDimX us in its stream's context, one after another
 * on the one simulated GPU, whose queue that stream is from then on. */
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned flags)
{
	(void)flags;
	if (l == NULL || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUcontext cur;
	cuCtxGetCurrent(&cur);
	CUresult rc = CUDA_SUCCESS;
	for (unsigned i = 0; i < n && rc == CUDA_SUCCESS; i++) {
		CUcontext c;
		if ((rc = cuStreamGetCtx(l[i].hStream, &c)) != CUDA_SUCCESS)
			break;
		if (l[i].hStream != NULL)
			((struct fstream *)l[i].hStream)->queued = 1;
		cuCtxSetCurrent(c);
		rc = run(l[i].gridDimX);
		cuCtxSetCurrent(cur);
	}
	return rc;
}
/* The first driver API's launches: a grid of width w runs w us, as the others. */
CUresult cuLaunch(CUfunction f)
{
	(void)f;
	return run(1);
}
CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
	(void)f, (void)h;
	return w > 0 ? run((unsigned)w) : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
	(void)s;
	return cuLaunchGrid(f, w, h);
}
/* ---- graphs ------------------------------------------------------------------- */

#define GRAPH_MAGIC 0x47524150u
#define EXEC_MAGIC 0x45584543u
#define EXEC_OBJECT(e) ((uintptr_t)(e) >= 0x100000)

struct fnode {
	CUgraphNodeType type;
	uint64_t bytes;
	int dev;
	CUdeviceptr ptr;
	struct fgraph *child;
};
struct fgraph {
	uint32_t magic;
	int n, cap;
	struct fnode **nodes;
	uint64_t us; /* kernel time captured into it */
};
struct fexec {
	uint32_t magic;
	int mapped;
	uint64_t need[MAXDEV];
	uint64_t us;
	struct fexec *next;
};
/* Guarded by mu. */
static uint64_t graph_reserved[MAXDEV], graph_mapped[MAXDEV];
static struct fexec *execs;
static struct fgraph *capture_graph;
/* Addresses graph memory nodes handed out: freeing one outside its graph leaves the
 * memory in the graph pool; freeing an address that is nobody's is an error. */
static CUdeviceptr *graph_ptrs;
static size_t ngraph_ptrs, capgraph_ptrs;

static struct fgraph *graph_of(CUgraph g)
{
	struct fgraph *f = (struct fgraph *)g;
	return f != NULL && EXEC_OBJECT(f) && f->magic == GRAPH_MAGIC ? f : NULL;
}

CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
	(void)flags;
	struct fgraph *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->magic = GRAPH_MAGIC;
	*g = (CUgraph)f;
	return CUDA_SUCCESS;
}

static CUresult add_node(struct fgraph *f, struct fnode n, CUgraphNode *out)
{
	if (f == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct fnode *nn = malloc(sizeof(*nn));
	if (nn == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*nn = n;
	pthread_mutex_lock(&mu);
	if (f->n == f->cap) {
		f->cap = f->cap ? 2 * f->cap : 8;
		f->nodes = realloc(f->nodes, (size_t)f->cap * sizeof(*f->nodes));
	}
	f->nodes[f->n++] = nn;
	pthread_mutex_unlock(&mu);
	if (out)
		*out = (CUgraphNode)nn;
	return CUDA_SUCCESS;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	(void)deps, (void)ndeps;
	if (p == NULL || p->bytesize == 0 || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->poolProps.location.id < 0 || p->poolProps.location.id >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	p->dptr = atomic_fetch_add(&next_addr, (p->bytesize + 0xfffff) & ~0xfffffULL);
	pthread_mutex_lock(&mu);
	if (ngraph_ptrs == capgraph_ptrs) {
		capgraph_ptrs = capgraph_ptrs ? 2 * capgraph_ptrs : 64;
		graph_ptrs = realloc(graph_ptrs, capgraph_ptrs * sizeof(*graph_ptrs));
	}
	graph_ptrs[ngraph_ptrs++] = p->dptr;
	pthread_mutex_unlock(&mu);
	struct fnode n = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .bytes = p->bytesize, .dev = p->poolProps.location.id,
			  .ptr = p->dptr};
	return add_node(graph_of(g), n, node);
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUdeviceptr p)
{
	(void)deps, (void)ndeps;
	return add_node(graph_of(g), (struct fnode){.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .ptr = p}, node);
}

CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
	(void)deps, (void)ndeps;
	if (graph_of(child) == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return add_node(graph_of(g), (struct fnode){.type = CU_GRAPH_NODE_TYPE_GRAPH, .child = graph_of(child)}, node);
}

CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
	struct fgraph *f = graph_of(g);
	if (f == NULL || n == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (nodes != NULL) {
		size_t k = *n < (size_t)f->n ? *n : (size_t)f->n;
		for (size_t i = 0; i < k; i++)
			nodes[i] = (CUgraphNode)f->nodes[i];
		*n = k;
	} else {
		*n = (size_t)f->n;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *t)
{
	if (node == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*t = ((struct fnode *)node)->type;
	return CUDA_SUCCESS;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	struct fnode *n = (struct fnode *)node;
	if (n == NULL || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		return CUDA_ERROR_INVALID_VALUE;
	memset(p, 0, sizeof(*p));
	p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->poolProps.location.id = n->dev;
	p->bytesize = n->bytes;
	p->dptr = n->ptr;
	return CUDA_SUCCESS;
}

CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *g)
{
	struct fnode *n = (struct fnode *)node;
	if (n == NULL || n->type != CU_GRAPH_NODE_TYPE_GRAPH)
		return CUDA_ERROR_INVALID_VALUE;
	*g = (CUgraph)n->child;
	return CUDA_SUCCESS;
}

static void graph_sum(const struct fgraph *f, uint64_t *need, uint64_t *us, int depth)
{
	*us += f->us;
	for (int i = 0; i < f->n && depth < 8; i++) {
		if (f->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
			need[f->nodes[i]->dev] += f->nodes[i]->bytes;
		else if (f->nodes[i]->type == CU_GRAPH_NODE_TYPE_GRAPH)
			graph_sum(f->nodes[i]->child, need, us, depth + 1);
	}
}

/* Maps what e allocates from the graph pools (caller holds mu). */
static CUresult map_exec(struct fexec *e)
{
	if (e->mapped)
		return CUDA_SUCCESS;
	uint64_t grow[MAXDEV] = {0};
	for (int d = 0; d < ndev; d++) {
		uint64_t spare = graph_reserved[d] - graph_mapped[d];
		grow[d] = e->need[d] > spare ? e->need[d] - spare : 0;
		if (used[d] + grow[d] > mem_bytes)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (int d = 0; d < ndev; d++) {
		graph_reserved[d] += grow[d];
		graph_mapped[d] += e->need[d];
		used[d] += grow[d];
		if (used[d] > peak[d])
			peak[d] = used[d];
		tally_add(d, (int64_t)grow[d]);
	}
	e->mapped = 1;
	return CUDA_SUCCESS;
}

static void unmap_exec(struct fexec *e)
{
	if (!e->mapped)
		return;
	for (int d = 0; d < ndev; d++)
		graph_mapped[d] -= e->need[d];
	e->mapped = 0;
}

static CUresult instantiate(CUgraphExec *out, CUgraph g, int upload)
{
	struct fgraph *f = graph_of(g);
	if (f == NULL || out == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct fexec *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = EXEC_MAGIC;
	pthread_mutex_lock(&mu);
	graph_sum(f, e->need, &e->us, 0);
	CUresult rc = upload ? map_exec(e) : CUDA_SUCCESS;
	if (rc == CUDA_SUCCESS) {
		e->next = execs;
		execs = e;
	}
	pthread_mutex_unlock(&mu);
	if (rc != CUDA_SUCCESS) {
		free(e);
		return rc;
	}
	*out = (CUgraphExec)e;
	return CUDA_SUCCESS;
}

static struct fexec *exec_of(CUgraphExec x)
{
	struct fexec *e = (struct fexec *)x;
	return e != NULL && EXEC_OBJECT(e) && e->magic == EXEC_MAGIC ? e : NULL;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)flags;
	return instantiate(e, g, 0);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return instantiate(e, g, p != NULL && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return cuGraphInstantiateWithParams(e, g, p);
}
CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t len)
{
	(void)err, (void)log, (void)len;
	return instantiate(e, g, 0);
}

CUresult cuGraphUpload(CUgraphExec x, CUstream s)
{
	(void)s;
	struct fexec *e = exec_of(x);
	if (e == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult rc = map_exec(e);
	pthread_mutex_unlock(&mu);
	return rc;
}

CUresult cuGraphUpload_ptsz(CUgraphExec x, CUstream s) { return cuGraphUpload(x, s); }

CUresult cuGraphExecDestroy(CUgraphExec x)
{
	struct fexec *e = exec_of(x);
	if (e == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	unmap_exec(e); /* its memory stays in the pool until a trim */
	for (struct fexec **pp = &execs; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	e->magic = 0;
	pthread_mutex_unlock(&mu);
	free(e);
	return CUDA_SUCCESS;
}

/* Every executable graph is idle here (the simulated GPU does not track which graph
 * runs), so a trim takes all their memory back, as the driver does for idle graphs. */
CUresult cuDeviceGraphMemTrim(CUdevice d)
{
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	for (struct fexec *e = execs; e; e = e->next)
		if (e->mapped && e->need[d]) {
			for (int k = 0; k < ndev; k++)
				graph_mapped[k] -= e->need[k];
			e->mapped = 0;
		}
	uint64_t spare = graph_reserved[d] - graph_mapped[d];
	graph_reserved[d] -= spare;
	used[d] -= spare;
	tally_add(d, -(int64_t)spare);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void *value)
{
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	uint64_t r = graph_reserved[d], m = graph_mapped[d];
	pthread_mutex_unlock(&mu);
	switch (attr) {
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
		*(cuuint64_t *)value = r;
		return CUDA_SUCCESS;
	case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
		*(cuuint64_t *)value = m;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

static int graph_ptr(CUdeviceptr p)
{
	int found = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < ngraph_ptrs && !found; i++)
		found = graph_ptrs[i] == p;
	pthread_mutex_unlock(&mu);
	return found;
}

static int capturing_now(void) { return atomic_load(&capturing); }

static CUresult capture_alloc(int dev, size_t n, CUdeviceptr *p)
{
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUDA_MEM_ALLOC_NODE_PARAMS a = {.bytesize = n};
	a.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.poolProps.location.id = dev;
	CUresult rc = cuGraphAddMemAllocNode(NULL, (CUgraph)capture_graph, NULL, 0, &a);
	if (rc == CUDA_SUCCESS)
		*p = a.dptr;
	return rc;
}

static void capture_us(uint64_t us)
{
	pthread_mutex_lock(&mu);
	if (capture_graph)
		capture_graph->us += us;
	pthread_mutex_unlock(&mu);
}

CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	(void)s;
	if (!EXEC_OBJECT(g))
		return run((uint64_t)(uintptr_t)g);
	struct fexec *e = exec_of(g);
	if (e == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult rc = map_exec(e);
	pthread_mutex_unlock(&mu);
	return rc == CUDA_SUCCESS ? run(e->us) : rc;
}
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }

/* Waits until what stream s holds has run: its own queue with FAKE_CUDA_STREAMS, the
 * one queue else (the legacy default stream waits for every queue). */
CUresult cuStreamSynchronize(CUstream s)
{
	if (atomic_load(&capturing))
		return (CUresult)CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (sg != NULL) {
		sg_wait(-1);
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&mu);
	int64_t until = s == NULL ? (busy_until_ns > all_until_ns ? busy_until_ns : all_until_ns) : *stream_queue(s);
	pthread_mutex_unlock(&mu);
	wait_until(until);
	return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }

/* Synchronous copies: the legacy stream's (and the per-thread stream's, which the fake
 * does not tell apart) queued work runs first, as the driver's copies wait for it;
 * the copy itself takes no time and moves no bytes (the fake's device memory is not
 * memory). */
static CUresult sync_copy(void) { return cuStreamSynchronize(NULL); }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)dst, (void)src, (void)n; return sync_copy(); }
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoH_v2(dst, src, n); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst, (void)src, (void)n; return sync_copy(); }
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) { return cuMemcpyHtoD_v2(dst, src, n); }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)dst, (void)src, (void)n; return sync_copy(); }
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpy(dst, src, n); }

/* Whether the work queued on s (the legacy stream: all of it) has run. */
CUresult cuStreamQuery(CUstream s)
{
	if (atomic_load(&capturing))
		return (CUresult)CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	int done;
	if (sg != NULL) {
		pthread_mutex_lock(&sg->mu);
		sg_advance(now_ns());
		done = sg->s[sg_me].head == sg->s[sg_me].tail;
		pthread_mutex_unlock(&sg->mu);
	} else {
		pthread_mutex_lock(&mu);
		int64_t until = s == NULL ? (busy_until_ns > all_until_ns ? busy_until_ns : all_until_ns) : *stream_queue(s);
		done = until <= now_ns();
		pthread_mutex_unlock(&mu);
	}
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }

CUresult cuCtxSynchronize(void)
{
	pthread_mutex_lock(&mu);
	syncs++;
	if (atomic_load(&capturing)) {
		bad_syncs++;
		pthread_mutex_unlock(&mu);
		return (CUresult)CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	int64_t until = busy_until_ns > all_until_ns ? busy_until_ns : all_until_ns;
	/* Pools with release threshold 0 give their cache back at a synchronize. */
	for (int d = 0; d < MAXDEV; d++) {
		used[d] -= pool_cached[d];
		tally_add(d, -(int64_t)pool_cached[d]);
		pool_cached[d] = 0;
	}
	pthread_mutex_unlock(&mu);
	if (sg != NULL)
		sg_wait(-1);
	wait_until(until);
	return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m)
{
	(void)s, (void)m;
	CUgraph g;
	if (cuGraphCreate(&g, 0) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	capture_graph = (struct fgraph *)g;
	pthread_mutex_unlock(&mu);
	atomic_store(&capturing, 1);
	return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return cuStreamBeginCapture_v2(s, m); }
CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	(void)s;
	pthread_mutex_lock(&mu);
	*g = (CUgraph)capture_graph;
	capture_graph = NULL;
	pthread_mutex_unlock(&mu);
	atomic_store(&capturing, 0);
	return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return cuStreamEndCapture(s, g); }
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
	(void)s;
	*st = atomic_load(&capturing) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---------------------------------------------------------------- */

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status);
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st);

/* Like the real driver: base name in, the function of the right ABI version (or _ptsz
 * flavour) out, from its own table rather than a symbol lookup. */
static const struct {
	const char *base;
	void *abi, *ptsz;
} procs[] = {
	{"cuInit", (void *)cuInit, NULL},
	{"cuGetProcAddress", (void *)cuGetProcAddress_v2, NULL},
	{"cuDeviceGetCount", (void *)cuDeviceGetCount, NULL},
	{"cuDeviceGet", (void *)cuDeviceGet, NULL},
	{"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2, NULL},
	{"cuDeviceGetByPCIBusId", (void *)cuDeviceGetByPCIBusId, NULL},
	{"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2, NULL},
	{"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, NULL},
	{"cuCtxCreate", (void *)cuCtxCreate_v4, NULL},
	{"cuCtxSetCurrent", (void *)cuCtxSetCurrent, NULL},
	{"cuCtxGetCurrent", (void *)cuCtxGetCurrent, NULL},
	{"cuCtxDestroy", (void *)cuCtxDestroy_v2, NULL},
	{"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease_v2, NULL},
	{"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset_v2, NULL},
	{"cuGreenCtxCreate", (void *)cuGreenCtxCreate, NULL},
	{"cuGreenCtxDestroy", (void *)cuGreenCtxDestroy, NULL},
	{"cuCtxSetLimit", (void *)cuCtxSetLimit, NULL},
	{"cuCtxGetLimit", (void *)cuCtxGetLimit, NULL},
	{"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute, NULL},
	{"cuModuleLoad", (void *)cuModuleLoad, NULL},
	{"cuModuleLoadData", (void *)cuModuleLoadData, NULL},
	{"cuModuleLoadDataEx", (void *)cuModuleLoadDataEx, NULL},
	{"cuModuleLoadFatBinary", (void *)cuModuleLoadFatBinary, NULL},
	{"cuModuleUnload", (void *)cuModuleUnload, NULL},
	{"cuModuleGetFunction", (void *)cuModuleGetFunction, NULL},
	{"cuLibraryLoadData", (void *)cuLibraryLoadData, NULL},
	{"cuLibraryLoadFromFile", (void *)cuLibraryLoadFromFile, NULL},
	{"cuLibraryUnload", (void *)cuLibraryUnload, NULL},
	{"cuCtxGetDevice", (void *)cuCtxGetDevice, NULL},
	{"cuCtxSynchronize", (void *)cuCtxSynchronize, NULL},
	{"cuStreamSynchronize", (void *)cuStreamSynchronize, (void *)cuStreamSynchronize_ptsz},
	{"cuStreamQuery", (void *)cuStreamQuery, (void *)cuStreamQuery_ptsz},
	{"cuEventCreate", (void *)cuEventCreate, NULL},
	{"cuEventDestroy", (void *)cuEventDestroy_v2, NULL},
	{"cuEventRecord", (void *)cuEventRecord, NULL},
	{"cuEventQuery", (void *)cuEventQuery, NULL},
	{"cuEventSynchronize", (void *)cuEventSynchronize, NULL},
	{"cuEventElapsedTime", (void *)cuEventElapsedTime_v2, NULL},
	{"cuMemGetInfo", (void *)cuMemGetInfo_v2, NULL},
	{"cuMemAlloc", (void *)cuMemAlloc_v2, NULL},
	{"cuMemAllocPitch", (void *)cuMemAllocPitch_v2, NULL},
	{"cuMemAllocManaged", (void *)cuMemAllocManaged, NULL},
	{"cuMemFree", (void *)cuMemFree_v2, NULL},
	{"cuMemAllocAsync", (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz},
	{"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz},
	{"cuMemFreeAsync", (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz},
	{"cuMemCreate", (void *)cuMemCreate, NULL},
	{"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool, NULL},
	{"cuMemPoolTrimTo", (void *)cuMemPoolTrimTo, NULL},
	{"cuMemPoolGetAttribute", (void *)cuMemPoolGetAttribute, NULL},
	{"cuMemPoolDestroy", (void *)cuMemPoolDestroy, NULL},
	{"cuMemRelease", (void *)cuMemRelease, NULL},
	{"cuArrayCreate", (void *)cuArrayCreate_v2, NULL},
	{"cuArray3DCreate", (void *)cuArray3DCreate_v2, NULL},
	{"cuArrayDestroy", (void *)cuArrayDestroy, NULL},
	{"cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate, NULL},
	{"cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy, NULL},
	{"cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
	{"cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
	{"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel, (void *)cuLaunchCooperativeKernel_ptsz},
	{"cuLaunchCooperativeKernelMultiDevice", (void *)cuLaunchCooperativeKernelMultiDevice, NULL},
	{"cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz},
	{"cuLaunch", (void *)cuLaunch, NULL},
	{"cuLaunchGrid", (void *)cuLaunchGrid, NULL},
	{"cuLaunchGridAsync", (void *)cuLaunchGridAsync, NULL},
	{"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2, (void *)cuStreamBeginCapture_v2_ptsz},
	{"cuStreamEndCapture", (void *)cuStreamEndCapture, (void *)cuStreamEndCapture_ptsz},
	{"cuStreamIsCapturing", (void *)cuStreamIsCapturing, NULL},
	{"cuGraphCreate", (void *)cuGraphCreate, NULL},
	{"cuGraphAddMemAllocNode", (void *)cuGraphAddMemAllocNode, NULL},
	{"cuGraphAddMemFreeNode", (void *)cuGraphAddMemFreeNode, NULL},
	{"cuGraphAddChildGraphNode", (void *)cuGraphAddChildGraphNode, NULL},
	{"cuGraphGetNodes", (void *)cuGraphGetNodes, NULL},
	{"cuGraphNodeGetType", (void *)cuGraphNodeGetType, NULL},
	{"cuGraphMemAllocNodeGetParams", (void *)cuGraphMemAllocNodeGetParams, NULL},
	{"cuGraphChildGraphNodeGetGraph", (void *)cuGraphChildGraphNodeGetGraph, NULL},
	/* The CUDA 13 driver answers "cuGraphInstantiate" with its CUDA 11 ABI whatever the
	 * version asked for (measured); runtimes call cuGraphInstantiateWithFlags. */
	{"cuGraphInstantiate", (void *)cuGraphInstantiate_v2, NULL},
	{"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags, NULL},
	{"cuGraphInstantiateWithParams", (void *)cuGraphInstantiateWithParams, (void *)cuGraphInstantiateWithParams_ptsz},
	{"cuGraphUpload", (void *)cuGraphUpload, (void *)cuGraphUpload_ptsz},
	{"cuGraphExecDestroy", (void *)cuGraphExecDestroy, NULL},
	{"cuDeviceGraphMemTrim", (void *)cuDeviceGraphMemTrim, NULL},
	{"cuDeviceGetGraphMemAttribute", (void *)cuDeviceGetGraphMemAttribute, NULL},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	(void)version;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].base, symbol) != 0)
			continue;
		*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && procs[i].ptsz ? procs[i].ptsz : procs[i].abi;
		if (status)
			*status = CU_GET_PROC_ADDRESS_SUCCESS;
		return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	}
	*pfn = NULL;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

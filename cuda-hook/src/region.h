/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The container's shared accounting region: its layout and the hook's interface to
 * it (region.c). The layout is here, not in region.c, so that the fake-driver suite
 * can damage a region the way a tenant could (test/region_poke.c).
 *
 * The region lives in the directory the limits file's region line names (a tmpfs of
 * the container's own that the node agent mounts) or, without the line, in the
 * container's /dev/shm: every process of the container can write it. The hook therefore checks it on every use that indexes it and fails
 * closed when it does not hold together; what a tenant can still do by rewriting it
 * consistently is backed by the node agent's NVML watchdog (docs/cuda-hook.md).
 */
#ifndef TESSERA_REGION_H
#define TESSERA_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "limits.h"
#include "tessera_cuda.h"

#define TESSERA_REGION_MAGIC 0x3141534553534554ULL /* "TESSERA1", little-endian */
/* 5: a slot names its process's lease (region.c), and a dead process's slot is given
 * back only once its lease is free; a version-4 hook would give it back at once. */
#define TESSERA_REGION_VERSION 5
#define TESSERA_REGION_SLOTS 256
/* No process can hold more than this on one GPU (api.MaxMemoryMiB); a slot that says
 * more is damaged. It also keeps the sum of all slots far from overflowing. */
#define TESSERA_REGION_MAX_USED (TESSERA_MAX_MEMORY_MIB * 1024ULL * 1024ULL)

/* Compute pacing of one GPU, shared by every process of the container: it lives in
 * the accounting region. tokens is touched by launches of every process (one atomic
 * operation per take of several launches) and sits on its own cache line; the rest
 * belongs to the slow path, under mu (robust, process-shared). */
struct tessera_shared_pacer {
	_Atomic int64_t tokens;  /* GPU ns the container may still charge; negative: owed */
	_Atomic int64_t charged; /* GPU ns its processes have charged, all together */
	char pad_[48];
	pthread_mutex_t mu;
	int64_t refill_k; /* 1 + the period whose allowance tokens last received (0: none) */
	int64_t pad2_[3];
} __attribute__((aligned(64)));

/* One process's usage. */
struct tessera_region_slot {
	int32_t pid;
	uint32_t lease; /* its lease file's number (region.c); never 0 in a taken slot */
	uint64_t start_time; /* /proc/<pid>/stat starttime: tells a reused pid apart */
	uint64_t used[TESSERA_MAX_GPUS];
};

/* Written once by the process that creates the region; never changes after. */
struct tessera_region_header {
	uint64_t magic;
	uint32_t version;
	uint32_t size;       /* sizeof(struct tessera_region) */
	uint32_t nslots;     /* TESSERA_REGION_SLOTS */
	uint32_t ngpus;      /* TESSERA_MAX_GPUS */
	uint32_t slot_size;  /* sizeof(struct tessera_region_slot) */
	uint32_t pacer_size; /* sizeof(struct tessera_shared_pacer) */
	uint64_t sum;        /* tessera_region_header_sum of the fields above */
};

struct tessera_region {
	struct tessera_region_header h;
	pthread_mutex_t lock;
	/* Changed under lock, and covered by state_sum, rewritten with them. */
	int32_t slots_hw; /* slots at or past this index have never been used */
	/* The former pacer's launch clock (region version 3); unused since version 4,
	 * which changed what the pacers hold. */
	int32_t clock_ready;
	int32_t use_tsc;
	int32_t pad;
	double ticks_per_ns;
	uint64_t state_sum; /* tessera_region_state_sum */
	struct tessera_shared_pacer pacers[TESSERA_MAX_GPUS];
	struct tessera_region_slot slots[TESSERA_REGION_SLOTS];
};

/* FNV-1a over n bytes: catches damage (a stray write, a truncated or foreign file),
 * not a tenant who recomputes it; that is what the bounds checks are for. */
static inline uint64_t tessera_region_hash(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = (const unsigned char *)p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static inline uint64_t tessera_region_header_sum(const struct tessera_region_header *h)
{
	return tessera_region_hash(1469598103934665603ULL, h, offsetof(struct tessera_region_header, sum));
}

static inline uint64_t tessera_region_state_sum(const struct tessera_region *r)
{
	uint64_t s = tessera_region_hash(r->h.sum, &r->slots_hw, sizeof(r->slots_hw));
	s = tessera_region_hash(s, &r->clock_ready, sizeof(r->clock_ready));
	s = tessera_region_hash(s, &r->use_tsc, sizeof(r->use_tsc));
	return tessera_region_hash(s, &r->ticks_per_ns, sizeof(r->ticks_per_ns));
}

/* The region's file for a cgroup, under dir. */
static inline uint64_t tessera_region_key(const char *cgroup)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *cgroup; cgroup++) {
		h ^= (unsigned char)*cgroup;
		h *= 1099511628211ULL;
	}
	return h;
}

/* Opens (creating it if need be) the region of the container in cgroup, in dir (the
 * limits file's region line) or, when dir is empty, in TESSERA_SHM_DIR. */
int tessera_region_open(const char *cgroup, const char *dir, int ngpus, struct tessera_region **out, char *err, size_t errlen);
/* Adds bytes to this process's usage of GPU gpu if the container's total stays within
 * limit; returns CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (also when the region is
 * damaged: a damaged region refuses every reservation from then on). */
CUresult tessera_region_reserve(struct tessera_region *r, int gpu, uint64_t bytes, uint64_t limit);
void tessera_region_release(struct tessera_region *r, int gpu, uint64_t bytes);
/* The container's usage of GPU gpu; UINT64_MAX when the region is damaged. */
uint64_t tessera_region_used(struct tessera_region *r, int gpu);
/* Makes this process hold a lease of its own (region.c), if it does not yet: before
 * the driver opens its descriptors, so that every process that later shares them
 * holds the lease too. Returns 0, or -1 with err set. */
int tessera_region_hold_lease(char *err, size_t errlen);
/* At exit: gives this process's usage back, unless a process it forked still holds its
 * lease (and with it the driver's descriptors). */
void tessera_region_forget_process(struct tessera_region *r);
struct tessera_shared_pacer *tessera_region_pacer(struct tessera_region *r, int gpu);

#endif

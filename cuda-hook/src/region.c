/*
 * The container's shared accounting region: one small file in shared memory per
 * container, mapped by every process of the container that uses CUDA.
 *
 * Each process owns a slot with its usage per GPU. A reservation takes the region's
 * lock, sums the slots and adds to its own slot only if the total stays within the
 * limit, so threads and processes cannot race past it. The lock is a robust
 * process-shared mutex: a process killed while holding it leaves the next locker
 * EOWNERDEAD, and since every update is a single store the region is still consistent.
 * Slots of processes that died are reclaimed before a reservation is refused.
 *
 * The region also holds each GPU's compute pacer (pacing.c), so that the container's
 * processes share one window and one launch budget.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hook.h"

#define REGION_MAGIC 0x3141534553534554ULL /* "TESSERA1", little-endian */
#define REGION_VERSION 2
#define REGION_SLOTS 256

struct slot {
	int32_t pid;
	uint32_t pad;
	uint64_t start_time; /* /proc/<pid>/stat starttime: tells a reused pid apart */
	uint64_t used[TESSERA_MAX_GPUS];
};

struct tessera_region {
	uint64_t magic;
	uint32_t version;
	uint32_t size;
	pthread_mutex_t lock;
	int32_t slots_hw; /* slots at or past this index have never been used */
	int32_t clock_ready;
	int32_t use_tsc;
	int32_t pad;
	double ticks_per_ns;
	struct tessera_shared_pacer pacers[TESSERA_MAX_GPUS];
	struct slot slots[REGION_SLOTS];
};

static int my_slot = -1;
static pid_t my_pid; /* getpid() is a system call; set when the slot is taken */

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ULL;
	}
	return h;
}

static uint64_t start_time_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* Field 22; the command name (field 2) may hold spaces, so count after its ')'. */
	char *p = strrchr(buf, ')');
	if (p == NULL)
		return 0;
	int field = 2;
	for (; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	return strtoull(p, NULL, 10);
}

int tessera_region_open(const char *cgroup, int ngpus, struct tessera_region **out, char *err, size_t errlen)
{
	char path[256];
	(void)ngpus;
	snprintf(path, sizeof(path), "%s/tessera-%016llx.region", TESSERA_SHM_DIR, (unsigned long long)fnv1a(cgroup));
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open the accounting region %s: %s", path, strerror(errno));
		return -1;
	}
	/* flock serializes the first process's initialization with everyone else's open. */
	if (flock(fd, LOCK_EX) < 0) {
		snprintf(err, errlen, "cannot lock %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	struct stat st;
	int rc = -1;
	struct tessera_region *r = MAP_FAILED;
	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
		goto out;
	}
	int fresh = st.st_size == 0;
	if (fresh) {
		/* Processes of one container may run as different users. */
		if (fchmod(fd, 0666) < 0 && errno != EPERM)
			tessera_log(TESSERA_LOG_WARN, "cannot chmod %s: %s", path, strerror(errno));
		if (ftruncate(fd, sizeof(struct tessera_region)) < 0) {
			snprintf(err, errlen, "cannot size %s: %s", path, strerror(errno));
			goto out;
		}
	} else if ((size_t)st.st_size != sizeof(struct tessera_region)) {
		snprintf(err, errlen, "%s has size %lld, want %zu (another hook version?)", path, (long long)st.st_size,
			 sizeof(struct tessera_region));
		goto out;
	}
	r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r == MAP_FAILED) {
		snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
		goto out;
	}
	if (fresh) {
		pthread_mutexattr_t a;
		pthread_mutexattr_init(&a);
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
		pthread_mutex_init(&r->lock, &a);
		for (int g = 0; g < TESSERA_MAX_GPUS; g++)
			pthread_mutex_init(&r->pacers[g].mu, &a);
		pthread_mutexattr_destroy(&a);
		r->version = REGION_VERSION;
		r->size = sizeof(*r);
		__atomic_store_n(&r->magic, REGION_MAGIC, __ATOMIC_RELEASE);
	} else if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != REGION_MAGIC || r->version != REGION_VERSION ||
		   r->size != sizeof(*r)) {
		snprintf(err, errlen, "%s is not a version %d accounting region", path, REGION_VERSION);
		munmap(r, sizeof(*r));
		goto out;
	}
	*out = r;
	rc = 0;
out:
	flock(fd, LOCK_UN);
	close(fd);
	return rc;
}

static int lock(struct tessera_region *r)
{
	int rc = pthread_mutex_lock(&r->lock);
	if (rc == EOWNERDEAD) {
		/* The holder died between single-store updates: nothing to repair. */
		pthread_mutex_consistent(&r->lock);
		return 0;
	}
	return rc;
}

static int alive(const struct slot *s)
{
	if (kill(s->pid, 0) < 0 && errno == ESRCH)
		return 0;
	uint64_t st = start_time_of(s->pid);
	return st == 0 || st == s->start_time; /* 0: cannot tell, assume alive */
}

/* Frees the slots of dead processes; returns how many. Caller holds the lock. */
static int reclaim(struct tessera_region *r)
{
	int n = 0;
	for (int i = 0; i < r->slots_hw; i++) {
		struct slot *s = &r->slots[i];
		if (s->pid != 0 && i != my_slot && !alive(s)) {
			tessera_log(TESSERA_LOG_INFO, "reclaiming the usage of exited process %d", s->pid);
			memset(s, 0, sizeof(*s));
			n++;
		}
	}
	return n;
}

/* Finds or takes this process's slot. Caller holds the lock. */
static int own_slot(struct tessera_region *r)
{
	if (my_slot >= 0 && r->slots[my_slot].pid == my_pid)
		return my_slot;
	pid_t me = getpid();
	uint64_t st = start_time_of(me);
	int free_slot = -1;
	for (int pass = 0; pass < 2 && free_slot < 0; pass++) {
		int end = r->slots_hw < REGION_SLOTS ? r->slots_hw + 1 : REGION_SLOTS;
		for (int i = 0; i < end; i++) {
			struct slot *s = &r->slots[i];
			if (s->pid == me) {
				/* Left by this pid before an exec: that image's memory is gone. */
				free_slot = i;
				break;
			}
			if (s->pid == 0 && free_slot < 0)
				free_slot = i;
		}
		if (free_slot < 0 && pass == 0 && reclaim(r) == 0)
			break;
	}
	if (free_slot < 0)
		return -1;
	memset(&r->slots[free_slot], 0, sizeof(struct slot));
	r->slots[free_slot].pid = me;
	r->slots[free_slot].start_time = st;
	if (free_slot >= r->slots_hw)
		r->slots_hw = free_slot + 1;
	my_pid = me;
	my_slot = free_slot;
	return my_slot;
}

static uint64_t total(struct tessera_region *r, int gpu)
{
	uint64_t t = 0;
	for (int i = 0; i < r->slots_hw; i++)
		if (r->slots[i].pid != 0)
			t += r->slots[i].used[gpu];
	return t;
}

CUresult tessera_region_reserve(struct tessera_region *r, int gpu, uint64_t bytes, uint64_t limit)
{
	if (lock(r) != 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
	int s = own_slot(r);
	if (s < 0) {
		tessera_log(TESSERA_LOG_ERROR, "all %d accounting slots of the container are taken", REGION_SLOTS);
		goto out;
	}
	uint64_t t = total(r, gpu);
	if ((t > limit || bytes > limit - t) && reclaim(r) > 0)
		t = total(r, gpu);
	if (t <= limit && bytes <= limit - t) {
		r->slots[s].used[gpu] += bytes;
		rc = CUDA_SUCCESS;
	}
out:
	pthread_mutex_unlock(&r->lock);
	return rc;
}

void tessera_region_release(struct tessera_region *r, int gpu, uint64_t bytes)
{
	if (lock(r) != 0)
		return;
	if (my_slot >= 0 && r->slots[my_slot].pid == my_pid) {
		uint64_t *u = &r->slots[my_slot].used[gpu];
		*u = *u > bytes ? *u - bytes : 0;
	}
	pthread_mutex_unlock(&r->lock);
}

uint64_t tessera_region_used(struct tessera_region *r, int gpu)
{
	if (lock(r) != 0)
		return 0;
	uint64_t t = total(r, gpu);
	pthread_mutex_unlock(&r->lock);
	return t;
}

void tessera_region_forget_process(struct tessera_region *r)
{
	if (my_slot < 0 || lock(r) != 0)
		return;
	if (r->slots[my_slot].pid == getpid())
		memset(&r->slots[my_slot], 0, sizeof(struct slot));
	my_slot = -1;
	pthread_mutex_unlock(&r->lock);
}

void tessera_region_after_fork(void)
{
	my_slot = -1;
	my_pid = 0;
}

struct tessera_shared_pacer *tessera_region_pacer(struct tessera_region *r, int gpu)
{
	return &r->pacers[gpu];
}

void tessera_region_clock(struct tessera_region *r, void (*calibrate)(double *, int *), double *ticks_per_ns,
			  int *use_tsc)
{
	if (lock(r) != 0) {
		calibrate(ticks_per_ns, use_tsc); /* still paced, on this process's own clock */
		return;
	}
	if (!r->clock_ready) {
		double t;
		int u;
		calibrate(&t, &u);
		r->ticks_per_ns = t;
		r->use_tsc = u;
		r->clock_ready = 1;
	}
	*ticks_per_ns = r->ticks_per_ns;
	*use_tsc = r->use_tsc;
	pthread_mutex_unlock(&r->lock);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The container's shared accounting region: one small file in shared memory per
 * container, mapped by every process of the container that uses CUDA.
 *
 * Each process owns a slot with its usage per GPU. A reservation takes the region's
 * lock, sums the slots and adds to its own slot only if the total stays within the
 * limit, so threads and processes cannot race past it. The lock is a robust
 * process-shared mutex: a process killed while holding it leaves the next locker
 * EOWNERDEAD, and since every update is a single store the region is still consistent.
 * Slots of processes that died are reclaimed before a reservation is refused, once
 * no live process holds their lease (below).
 *
 * Any process of the container can write the region, so it is checked before every
 * use that indexes it: the header (magic, layout, checksum) before the lock is taken,
 * the state under the lock (a checksum over the fields that change, slots_hw within
 * the slots, every slot's usage within what one process can hold). A region that fails
 * any check is damaged: a process that finds it so refuses every reservation from then
 * on (CUDA_ERROR_OUT_OF_MEMORY, with one error logged), and a new process refuses CUDA.
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
#include <time.h>
#include <unistd.h>

#include "fork.h"
#include "log.h"
#include "region.h"

#ifndef TESSERA_SHM_DIR
#define TESSERA_SHM_DIR "/dev/shm"
#endif

#define REGION_SLOTS TESSERA_REGION_SLOTS

/* Mode of a new region: read and write for its creator's user and group. See
 * docs/cuda-hook.md ("Who can write the region") for why not 0600 or 0666. */
#define REGION_MODE 0660

static int my_slot = -1;
static pid_t my_pid; /* getpid() is a system call; set when the slot is taken */

/*
 * Leases. The driver's device memory belongs to the open file descriptions of its
 * device files, not to the process that opened them: a child forked after the driver
 * opened them shares them, and the driver frees the memory only when the last
 * process holding them exits or closes them (an H200 with driver 580 kept a dead
 * process's 4096 MiB while its forked child lived; gpu/orphan.c). So a dead process's
 * usage may be given back only once no process holds its descriptions any more.
 *
 * The hook follows them with a file of its own: each process, before the driver
 * opens its descriptors, creates <dir>/tessera-<key>.<pid>-<lease>.lease and holds
 * a shared flock on it, and its slot records <lease>. The file is opened O_CLOEXEC, as
 * libcuda opens its device files, so that whatever shares the driver's descriptions
 * shares this one: a fork, or a raw clone that runs no atfork handler, and not an
 * exec'd image. The kernel releases the lock when the last descriptor referring to the
 * description closes, so a slot whose process is gone is given back only when an
 * exclusive flock on its lease file can be taken. A lease file that cannot be opened
 * (removed, unreadable) keeps its slot counted.
 */
static char lease_prefix[232]; /* "<dir>/tessera-<key>", set when the region is opened */
static pthread_mutex_t lease_mu = PTHREAD_MUTEX_INITIALIZER;
static int my_lease_fd = -1; /* never closed but at exit: forked children keep it */
static uint32_t my_lease;
static pid_t lease_pid; /* the process my_lease belongs to */

static void lease_path(char *buf, size_t n, pid_t pid, uint32_t lease)
{
	snprintf(buf, n, "%s.%d-%08x.lease", lease_prefix, (int)pid, (unsigned)lease);
}

int tessera_region_hold_lease(char *err, size_t errlen)
{
	pid_t me = getpid();
	int rc = -1;
	pthread_mutex_lock(&lease_mu);
	if (my_lease_fd >= 0 && lease_pid == me) {
		rc = 0;
		goto out;
	}
	if (lease_prefix[0] == '\0') {
		(void)tessera_fail(err, errlen, "no accounting region to hold a lease in");
		goto out;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint32_t n = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761u;
	char path[300];
	for (int tries = 0; tries < 16; tries++, n++) {
		if (n == 0)
			n = 1;
		lease_path(path, sizeof(path), me, n);
		int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, REGION_MODE);
		if (fd < 0 && errno == EEXIST)
			continue;
		if (fd < 0) {
			(void)tessera_fail(err, errlen, "cannot create the lease %s: %s", path, strerror(errno));
			goto out;
		}
		/* Readable by the container's other CUDA users, as the region is. */
		if (fchmod(fd, REGION_MODE) < 0 && errno != EPERM)
			tessera_log(TESSERA_LOG_WARN, "cannot chmod %s: %s", path, strerror(errno));
		if (flock(fd, LOCK_SH) < 0) {
			(void)tessera_fail(err, errlen, "cannot lock the lease %s: %s", path, strerror(errno));
			unlink(path);
			close(fd);
			goto out;
		}
		my_lease_fd = fd;
		my_lease = n;
		lease_pid = me;
		rc = 0;
		goto out;
	}
	(void)tessera_fail(err, errlen, "cannot create a lease file next to the accounting region");
out:
	pthread_mutex_unlock(&lease_mu);
	return rc;
}

/* Whether no process holds the lease any more; if so, removes its file. */
static int lease_free(pid_t pid, uint32_t lease)
{
	char path[300];
	lease_path(path, sizeof(path), pid, lease);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return 0;
	int free_ = flock(fd, LOCK_EX | LOCK_NB) == 0;
	if (free_)
		unlink(path); /* may fail in a sticky directory; a stale file is harmless */
	close(fd);
	return free_;
}

/* Set once this process has found the region damaged: from then on it refuses every
 * reservation, so that a tenant cannot damage the region, allocate, and repair it. */
static _Atomic int damaged;

static void set_damaged(const char *what)
{
	if (atomic_exchange(&damaged, 1) == 0)
		tessera_log(TESSERA_LOG_ERROR,
			    "the container's accounting region is damaged (%s): refusing every device-memory reservation "
			    "of this process from now on",
			    what);
}

/* The header a region written by this build has, computed once: every reservation
 * checks the region's header against it, twice. */
static struct tessera_region_header header_want;
static pthread_once_t header_once = PTHREAD_ONCE_INIT;

static void init_expected_header(void)
{
	struct tessera_region_header *h = &header_want;
	memset(h, 0, sizeof(*h));
	h->magic = TESSERA_REGION_MAGIC;
	h->version = TESSERA_REGION_VERSION;
	h->size = sizeof(struct tessera_region);
	h->nslots = REGION_SLOTS;
	h->ngpus = TESSERA_MAX_GPUS;
	h->slot_size = sizeof(struct tessera_region_slot);
	h->pacer_size = sizeof(struct tessera_shared_pacer);
	h->sum = tessera_region_header_sum(h);
}

static const struct tessera_region_header *expected_header(void)
{
	pthread_once(&header_once, init_expected_header);
	return &header_want;
}

/* Whether the header is the one this build writes; a copy is compared, so that a
 * concurrent writer cannot make the check and the use see different values. */
static const char *header_problem(const struct tessera_region *r)
{
	struct tessera_region_header want = *expected_header(), got;
	memcpy(&got, (const void *)&r->h, sizeof(got));
	if (got.magic != want.magic)
		return "bad magic";
	if (got.version != want.version || got.size != want.size || got.nslots != want.nslots ||
	    got.ngpus != want.ngpus || got.slot_size != want.slot_size || got.pacer_size != want.pacer_size)
		return "layout differs from this hook's";
	if (got.sum != want.sum)
		return "header checksum";
	return NULL;
}

/* Checks what a locked region holds beyond its header (caller holds the lock). */
static const char *state_problem(const struct tessera_region *r)
{
	if (r->state_sum != tessera_region_state_sum(r))
		return "state checksum";
	if (r->slots_hw < 0 || r->slots_hw > REGION_SLOTS)
		return "slot count out of range";
	if (r->clock_ready != 0 && r->clock_ready != 1)
		return "clock flag";
	return NULL;
}

/* Rewrites the state checksum after a change (caller holds the lock). */
static void seal(struct tessera_region *r)
{
	r->state_sum = tessera_region_state_sum(r);
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

int tessera_region_open(const char *cgroup, const char *dir, int ngpus, struct tessera_region **out, char *err, size_t errlen)
{
	char path[256];
	(void)ngpus;
	snprintf(lease_prefix, sizeof(lease_prefix), "%s/tessera-%016llx", dir != NULL && dir[0] != '\0' ? dir : TESSERA_SHM_DIR,
		 (unsigned long long)tessera_region_key(cgroup));
	snprintf(path, sizeof(path), "%s.region", lease_prefix);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, REGION_MODE);
	if (fd < 0) {
		int e = errno;
		/* Who owns it, through an O_PATH descriptor (no access needed) and fstat: the
		 * hook calls no stat(), whose symbol is newer than glibc 2.28. */
		struct stat st;
		int pfd = e == EACCES ? open(path, O_PATH | O_CLOEXEC | O_NOFOLLOW) : -1;
		int known = pfd >= 0 && fstat(pfd, &st) == 0;
		if (pfd >= 0)
			close(pfd);
		if (known)
			return tessera_fail(err, errlen,
					    "cannot open the accounting region %s: %s (it belongs to uid %d, gid %d, mode %03o: "
					    "the CUDA processes of a container must share the group of the first one)",
					    path, strerror(e), (int)st.st_uid, (int)st.st_gid, (unsigned)(st.st_mode & 0777));
		return tessera_fail(err, errlen, "cannot open the accounting region %s: %s", path, strerror(e));
	}
	/* flock serializes the first process's initialization with everyone else's open. */
	if (flock(fd, LOCK_EX) < 0) {
		(void)tessera_fail(err, errlen, "cannot lock %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	struct stat st;
	int rc = -1;
	struct tessera_region *r = MAP_FAILED;
	if (fstat(fd, &st) < 0) {
		(void)tessera_fail(err, errlen, "cannot stat %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		(void)tessera_fail(err, errlen, "the accounting region %s is not a regular file", path);
		goto out;
	}
	int fresh = st.st_size == 0;
	if (fresh) {
		/* Not narrowed by the process's umask: the container's other users in the
		 * creator's group must be able to open it. */
		if (fchmod(fd, REGION_MODE) < 0 && errno != EPERM)
			tessera_log(TESSERA_LOG_WARN, "cannot chmod %s: %s", path, strerror(errno));
		if (ftruncate(fd, sizeof(struct tessera_region)) < 0) {
			(void)tessera_fail(err, errlen, "cannot size %s: %s", path, strerror(errno));
			goto out;
		}
	} else if ((size_t)st.st_size != sizeof(struct tessera_region)) {
		(void)tessera_fail(err, errlen, "the accounting region %s is damaged: size %lld, want %zu (refusing CUDA)", path,
				   (long long)st.st_size, sizeof(struct tessera_region));
		goto out;
	}
	r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r == MAP_FAILED) {
		(void)tessera_fail(err, errlen, "cannot map %s: %s", path, strerror(errno));
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
		struct tessera_region_header h = *expected_header();
		h.magic = 0; /* stored last: a region without it is never used */
		memcpy(&r->h, &h, sizeof(h));
		seal(r);
		__atomic_store_n(&r->h.magic, TESSERA_REGION_MAGIC, __ATOMIC_RELEASE);
	} else {
		const char *why = header_problem(r);
		if (why == NULL && pthread_mutex_trylock(&r->lock) == 0) {
			why = state_problem(r);
			pthread_mutex_unlock(&r->lock);
		}
		if (why != NULL) {
			(void)tessera_fail(err, errlen, "the accounting region %s is damaged (%s): refusing CUDA", path, why);
			munmap(r, sizeof(*r));
			goto out;
		}
	}
	*out = r;
	rc = 0;
out:
	flock(fd, LOCK_UN);
	close(fd);
	return rc;
}

/*
 * Takes the region's lock after checking that the region still holds together, and
 * checks its state again under the lock. Returns 0 with the lock held, or -1 (lock not
 * held) when the region is damaged or this process found it damaged before.
 */
static int lock(struct tessera_region *r)
{
	if (atomic_load_explicit(&damaged, memory_order_relaxed))
		return -1;
	const char *why = header_problem(r);
	if (why != NULL) {
		set_damaged(why);
		return -1;
	}
	int rc = pthread_mutex_lock(&r->lock);
	if (rc == EOWNERDEAD) {
		/* The holder died between single-store updates, perhaps between a change and
		 * its seal: a state still in range is sealed again. */
		pthread_mutex_consistent(&r->lock);
		if (r->slots_hw >= 0 && r->slots_hw <= REGION_SLOTS && (r->clock_ready == 0 || r->clock_ready == 1))
			seal(r);
		rc = 0;
	}
	if (rc != 0) {
		set_damaged("its lock cannot be taken");
		return -1;
	}
	if ((why = header_problem(r)) != NULL || (why = state_problem(r)) != NULL) {
		pthread_mutex_unlock(&r->lock);
		set_damaged(why);
		return -1;
	}
	return 0;
}

static void unlock(struct tessera_region *r)
{
	pthread_mutex_unlock(&r->lock);
}

/* slots_hw as last checked under the lock, and never past the slots that exist. */
static int slots_hw(const struct tessera_region *r)
{
	int n = r->slots_hw;
	return n < 0 ? 0 : n > REGION_SLOTS ? REGION_SLOTS : n;
}

static int alive(const struct tessera_region_slot *s)
{
	if (s->pid <= 0)
		return 0;
	if (kill(s->pid, 0) < 0 && errno == ESRCH)
		return 0;
	uint64_t st = start_time_of(s->pid);
	return st == 0 || st == s->start_time; /* 0: cannot tell, assume alive */
}

/* Frees the slots of processes that are gone (exited, or this pid's image before an
 * exec) and whose lease no process holds any more; returns how many. Caller holds the
 * lock. */
static int reclaim(struct tessera_region *r)
{
	int n = 0, hw = slots_hw(r);
	pid_t me = getpid();
	for (int i = 0; i < hw; i++) {
		struct tessera_region_slot *s = &r->slots[i];
		if (s->pid == 0 || i == my_slot)
			continue;
		int gone = s->pid == me ? s->lease != my_lease || lease_pid != me : !alive(s);
		if (!gone)
			continue;
		if (!lease_free(s->pid, s->lease)) {
			tessera_log(TESSERA_LOG_DEBUG,
				    "keeping the usage of exited process %d: a process it forked still holds its driver descriptors",
				    s->pid);
			continue;
		}
		tessera_log(TESSERA_LOG_INFO, "reclaiming the usage of exited process %d", s->pid);
		memset(s, 0, sizeof(*s));
		n++;
	}
	return n;
}

/* Finds or takes this process's slot. Caller holds the lock. */
static int own_slot(struct tessera_region *r)
{
	if (my_slot >= 0 && r->slots[my_slot].pid == my_pid)
		return my_slot;
	char err[300];
	if (tessera_region_hold_lease(err, sizeof(err)) < 0) {
		tessera_log(TESSERA_LOG_ERROR, "%s", err);
		return -1;
	}
	pid_t me = getpid();
	uint64_t st = start_time_of(me);
	int free_slot = -1;
	for (int pass = 0; pass < 2 && free_slot < 0; pass++) {
		int hw = slots_hw(r);
		int end = hw < REGION_SLOTS ? hw + 1 : REGION_SLOTS;
		/* A slot this pid left before an exec is not reused here: a child of that image
		 * may still hold its descriptors (reclaim gives it back once its lease is free). */
		for (int i = 0; i < end && free_slot < 0; i++)
			if (r->slots[i].pid == 0)
				free_slot = i;
		if (free_slot < 0 && pass == 0 && reclaim(r) == 0)
			break;
	}
	if (free_slot < 0)
		return -1;
	memset(&r->slots[free_slot], 0, sizeof(struct tessera_region_slot));
	r->slots[free_slot].pid = me;
	r->slots[free_slot].start_time = st;
	r->slots[free_slot].lease = my_lease;
	if (free_slot >= r->slots_hw) {
		r->slots_hw = free_slot + 1;
		seal(r);
	}
	my_pid = me;
	my_slot = free_slot;
	return my_slot;
}

/* The container's usage of gpu, or -1 when a slot holds more than any process can (a
 * damaged slot). Caller holds the lock. Each slot is bounded, so the sum cannot wrap. */
static int total(struct tessera_region *r, int gpu, uint64_t *out)
{
	uint64_t t = 0;
	int hw = slots_hw(r);
	for (int i = 0; i < hw; i++) {
		const struct tessera_region_slot *s = &r->slots[i];
		if (s->pid == 0)
			continue;
		uint64_t u = s->used[gpu];
		if (s->pid < 0 || u > TESSERA_REGION_MAX_USED)
			return -1;
		t += u;
	}
	*out = t;
	return 0;
}

static int gpu_ok(int gpu)
{
	return gpu >= 0 && gpu < TESSERA_MAX_GPUS;
}

CUresult tessera_region_reserve(struct tessera_region *r, int gpu, uint64_t bytes, uint64_t limit)
{
	if (!gpu_ok(gpu) || lock(r) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
	uint64_t t;
	int s = own_slot(r);
	if (s < 0) {
		tessera_log(TESSERA_LOG_ERROR, "all %d accounting slots of the container are taken", REGION_SLOTS);
		goto out;
	}
	if (total(r, gpu, &t) < 0)
		goto damaged;
	if ((t > limit || bytes > limit - t) && reclaim(r) > 0 && total(r, gpu, &t) < 0)
		goto damaged;
	if (t <= limit && bytes <= limit - t && bytes <= TESSERA_REGION_MAX_USED - r->slots[s].used[gpu]) {
		r->slots[s].used[gpu] += bytes;
		rc = CUDA_SUCCESS;
	}
out:
	unlock(r);
	return rc;
damaged:
	unlock(r);
	set_damaged("a slot's usage is out of range");
	return CUDA_ERROR_OUT_OF_MEMORY;
}

void tessera_region_release(struct tessera_region *r, int gpu, uint64_t bytes)
{
	if (!gpu_ok(gpu) || lock(r) != 0)
		return;
	if (my_slot >= 0 && r->slots[my_slot].pid == my_pid) {
		uint64_t *u = &r->slots[my_slot].used[gpu];
		*u = *u > bytes ? *u - bytes : 0;
	}
	unlock(r);
}

uint64_t tessera_region_used(struct tessera_region *r, int gpu)
{
	uint64_t t;
	if (!gpu_ok(gpu) || lock(r) != 0)
		return UINT64_MAX;
	int ok = total(r, gpu, &t) == 0;
	unlock(r);
	if (!ok) {
		set_damaged("a slot's usage is out of range");
		return UINT64_MAX;
	}
	return t;
}

void tessera_region_forget_process(struct tessera_region *r)
{
	pid_t me = getpid();
	if (my_lease_fd < 0 || lease_pid != me)
		return; /* no lease of its own, so no slot either */
	close(my_lease_fd);
	my_lease_fd = -1;
	if (lock(r) != 0)
		return;
	/* With its own descriptor closed, the lease is free unless a process it forked (or
	 * cloned) still holds it: then the slot stays, for reclaim once that one is gone. */
	if (lease_free(me, my_lease) && my_slot >= 0 && r->slots[my_slot].pid == me && r->slots[my_slot].lease == my_lease)
		memset(&r->slots[my_slot], 0, sizeof(struct tessera_region_slot));
	my_slot = -1;
	unlock(r);
}

static void after_fork(void)
{
	my_slot = -1;
	my_pid = 0;
	/* The parent's lease stays open in the child, as the driver's descriptors do; the
	 * child takes a lease of its own when it first needs one. */
	pthread_mutex_init(&lease_mu, NULL);
	my_lease_fd = -1;
	my_lease = 0;
	lease_pid = 0;
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_REGION, after_fork);
}

struct tessera_shared_pacer *tessera_region_pacer(struct tessera_region *r, int gpu)
{
	return &r->pacers[gpu_ok(gpu) ? gpu : 0];
}

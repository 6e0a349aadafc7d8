/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPU turns: the layout and the rules are in turns.h; when pacing takes a turn, in
 * pacing.c and docs/cuda-hook.md ("GPU turns").
 *
 * A waiter sleeps on the turn's sequence word with a futex (the file is mapped
 * shared, so the futex is keyed by the file, across containers and their mount
 * namespaces) and wakes at every release, or every millisecond to say it still waits
 * and to see whether the holder has overrun its word.
 *
 * Any tenant on the GPU can write the file, and so cut it short: a page of a shared
 * mapping past the file's end faults with SIGBUS. Every access to the mapping is made
 * under a guard: the hook's SIGBUS handler, installed when a turn file is first
 * mapped, jumps back out of an access that faulted (the turn is then broken for this
 * process, which stops taking turns), and hands every other SIGBUS to the handler
 * that was there before, or to the default action.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "region.h"
#include "turns.h"

_Static_assert(sizeof(struct tessera_turn) <= TESSERA_TURN_FILE_BYTES, "the turn fits its file");

/* Whether a time of the file's lies within window_ns before now (not ahead of it). */
static int within(int64_t t, int64_t now, int64_t window_ns)
{
	return t <= now && now - t < window_ns;
}

/* The holder overran what it said by more than a time slice (it may have died), or
 * said more than any holder may. */
static int overrun(const struct tessera_turn *t, int64_t now)
{
	int64_t u = atomic_load(&t->until_ns);
	return now > u + TESSERA_TURN_GRACE_NS || u > now + TESSERA_TURN_HOLD_MAX_NS + TESSERA_TURN_GRACE_NS;
}

/* ---- the guard -------------------------------------------------------------- */

static struct sigaction bus_before;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;
static _Atomic int bus_ready;
/* Initial-exec, as pacing.c's: read in the signal handler, on any thread, it must not
 * make the dynamic loader allocate the thread's block of the hook's TLS there. */
static __thread sigjmp_buf *bus_jump __attribute__((tls_model("initial-exec")));
static _Atomic int broken;

static void on_bus(int sig, siginfo_t *si, void *uc)
{
	if (bus_jump != NULL)
		siglongjmp(*bus_jump, 1);
	/* Not an access to a turn file. */
	if (bus_before.sa_flags & SA_SIGINFO) {
		if (bus_before.sa_sigaction != NULL)
			bus_before.sa_sigaction(sig, si, uc);
		return;
	}
	if (bus_before.sa_handler == SIG_IGN)
		return;
	if (bus_before.sa_handler != SIG_DFL && bus_before.sa_handler != NULL) {
		bus_before.sa_handler(sig);
		return;
	}
	/* The default action: returning re-runs the faulting access, which now ends the
	 * process as it would have without the hook. */
	signal(SIGBUS, SIG_DFL);
}

static void install_bus(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_bus;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &bus_before) == 0)
		atomic_store(&bus_ready, 1);
}

int tessera_turn_broken(void)
{
	return atomic_load(&broken);
}

static void cut_short(void)
{
	if (atomic_exchange(&broken, 1) == 0)
		tessera_log(TESSERA_LOG_WARN, "a GPU turn file was cut short by another tenant on the GPU; this process takes no turns "
					      "and is time-sliced with the others");
}

/* GUARDED(fallback) { body }: runs body with SIGBUS on the mapping jumping back here;
 * then, and on a broken turn, the function returns fallback. The body must not return
 * (it sets the result), so that the jump buffer is cleared on every way out. */
#define GUARD_BEGIN(fallback)                                     \
	if (!atomic_load(&bus_ready) || atomic_load(&broken))      \
		return fallback;                                   \
	sigjmp_buf jb_;                                            \
	if (sigsetjmp(jb_, 1) != 0) {                              \
		bus_jump = NULL;                                   \
		cut_short();                                       \
		return fallback;                                   \
	}                                                          \
	bus_jump = &jb_;
#define GUARD_END() bus_jump = NULL;

struct tessera_turn *tessera_turn_open(const char *uuid)
{
	char path[256];
	if (uuid[0] == '\0' || strchr(uuid, '/') != NULL || uuid[0] == '.' ||
	    snprintf(path, sizeof(path), "%s/%s", TESSERA_TURNS_DIR, uuid) >= (int)sizeof(path))
		return NULL;
	int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		tessera_log(TESSERA_LOG_DEBUG, "no GPU turns for %s (%s: %s): its containers are time-sliced by the driver", uuid,
			    path, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < TESSERA_TURN_FILE_BYTES) {
		tessera_log(TESSERA_LOG_WARN, "%s is not a regular file of %d bytes: no GPU turns for %s", path,
			    TESSERA_TURN_FILE_BYTES, uuid);
		close(fd);
		return NULL;
	}
	void *m = mmap(NULL, TESSERA_TURN_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		tessera_log(TESSERA_LOG_WARN, "%s: mmap: %s: no GPU turns for %s", path, strerror(errno), uuid);
		return NULL;
	}
	pthread_once(&bus_once, install_bus);
	if (!atomic_load(&bus_ready)) {
		munmap(m, TESSERA_TURN_FILE_BYTES);
		tessera_log(TESSERA_LOG_WARN, "cannot guard the GPU turn file %s against being cut short: no GPU turns", path);
		return NULL;
	}
	return m;
}

uint64_t tessera_turn_id(const char *cgroup)
{
	return tessera_region_key(cgroup) | 1;
}

static void took(struct tessera_turn *t, uint64_t me, int64_t hold_ns, int64_t now)
{
	atomic_store(&t->until_ns, now + hold_ns);
	atomic_store(&t->last_owner, me);
	atomic_store(&t->taken_ns, now);
}

static int raw_wanted(const struct tessera_turn *t, uint64_t me, int64_t now);

/* The container that released the turn within YIELD_NS gives way to another that
 * waits for it: its release woke that one, which takes a while to run. */
#define YIELD_NS 1000000LL
static int yields(const struct tessera_turn *t, uint64_t me, int64_t now)
{
	return atomic_load(&t->last_owner) == me && raw_wanted(t, me, now) &&
	       within(atomic_load(&t->released_ns), now, YIELD_NS);
}

static int raw_try(struct tessera_turn *t, uint64_t me, int64_t hold_ns)
{
	uint64_t o = atomic_load(&t->owner);
	if ((o != 0 && o != me) || (o == 0 && yields(t, me, tessera_now_ns())))
		return 0;
	if (o == 0 && !atomic_compare_exchange_strong(&t->owner, &o, me))
		return 0;
	took(t, me, hold_ns, tessera_now_ns());
	return 1;
}

static int raw_take(struct tessera_turn *t, uint64_t me, int64_t hold_ns, int64_t stuck_ns, int64_t *waited_ns)
{
	int64_t t0 = tessera_now_ns(), deadline_ns = t0 + stuck_ns;
	uint32_t seen = atomic_load(&t->seq);
	*waited_ns = 0;
	for (int waited = 0;; waited = 1) {
		int64_t now = tessera_now_ns();
		uint32_t seq = atomic_load(&t->seq);
		uint64_t o = atomic_load(&t->owner);
		int yield = o == 0 && !waited && yields(t, me, now);
		/* The turn changed hands: the wait is not stuck, however long it takes, up
		 * to TESSERA_TURN_WAIT_MAX_NS. */
		if (seq != seen) {
			seen = seq;
			deadline_ns = now + stuck_ns;
			if (deadline_ns > t0 + TESSERA_TURN_WAIT_MAX_NS)
				deadline_ns = t0 + TESSERA_TURN_WAIT_MAX_NS;
		}
		if (!yield && (o == 0 || o == me || overrun(t, now))) {
			/* Free, ours, or its holder overran what it said: taken over. */
			if (o == me || atomic_compare_exchange_strong(&t->owner, &o, me)) {
				took(t, me, hold_ns, now);
				*waited_ns = now - t0;
				return waited ? 2 : 1;
			}
			continue;
		}
		if (now >= deadline_ns) {
			*waited_ns = now - t0;
			return 0;
		}
		atomic_store(&t->waiter, me);
		atomic_store(&t->waiting_ns, now);
		int64_t d = deadline_ns - now;
		if (d > 1000000)
			d = 1000000;
		if (yield && d > YIELD_NS)
			d = YIELD_NS;
		struct timespec rel = {.tv_sec = 0, .tv_nsec = d};
		/* Not FUTEX_PRIVATE: the word is in a file other processes map. */
		syscall(SYS_futex, &t->seq, FUTEX_WAIT, seq, &rel, NULL, 0);
	}
}

static void raw_release(struct tessera_turn *t, uint64_t me)
{
	uint64_t o = me;
	if (!atomic_compare_exchange_strong(&t->owner, &o, 0))
		return; /* taken over meanwhile */
	atomic_store(&t->released_ns, tessera_now_ns());
	atomic_fetch_add(&t->seq, 1);
	syscall(SYS_futex, &t->seq, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

static int raw_wanted(const struct tessera_turn *t, uint64_t me, int64_t now)
{
	return atomic_load(&t->waiter) != me && within(atomic_load(&t->waiting_ns), now, 5000000);
}

static int raw_others(const struct tessera_turn *t, uint64_t me, int64_t now, int64_t window_ns)
{
	if (atomic_load(&t->last_owner) != me && within(atomic_load(&t->taken_ns), now, window_ns))
		return 1;
	return atomic_load(&t->waiter) != me && within(atomic_load(&t->waiting_ns), now, window_ns);
}

static int raw_long(const struct tessera_turn *t, int64_t now, int64_t window_ns)
{
	return within(atomic_load(&t->long_seen_ns), now, window_ns);
}

/* ---- guarded ------------------------------------------------------------------ */

int tessera_turn_try(struct tessera_turn *t, uint64_t me, int64_t hold_ns)
{
	GUARD_BEGIN(0)
	int r = raw_try(t, me, hold_ns);
	GUARD_END()
	return r;
}

int tessera_turn_take(struct tessera_turn *t, uint64_t me, int64_t hold_ns, int64_t stuck_ns, int64_t *waited_ns)
{
	*waited_ns = 0;
	GUARD_BEGIN(0)
	int r = raw_take(t, me, hold_ns, stuck_ns, waited_ns);
	GUARD_END()
	return r;
}

void tessera_turn_release(struct tessera_turn *t, uint64_t me)
{
	GUARD_BEGIN()
	raw_release(t, me);
	GUARD_END()
}

int tessera_turn_wanted(const struct tessera_turn *t, uint64_t me, int64_t now)
{
	GUARD_BEGIN(0)
	int r = raw_wanted(t, me, now);
	GUARD_END()
	return r;
}

int tessera_turn_others(const struct tessera_turn *t, uint64_t me, int64_t now, int64_t window_ns)
{
	GUARD_BEGIN(0)
	int r = raw_others(t, me, now, window_ns);
	GUARD_END()
	return r;
}

int tessera_turn_long(const struct tessera_turn *t, int64_t now, int64_t window_ns)
{
	GUARD_BEGIN(0)
	int r = raw_long(t, now, window_ns);
	GUARD_END()
	return r;
}

void tessera_turn_say_long(struct tessera_turn *t, int64_t now)
{
	GUARD_BEGIN()
	atomic_store(&t->long_seen_ns, now);
	GUARD_END()
}

/* Container me's word among n words stride bytes apart: its own entry, else the first
 * no container spoke in for 2 s, taken for it; NULL where every one is fresh (more
 * containers speak than there are entries, and those that spoke are heard). Inside a
 * guard. */
static struct tessera_turn_word *word_for(struct tessera_turn_word *first, size_t stride, int n, uint64_t me,
					  int64_t now)
{
#define WORD(i) ((struct tessera_turn_word *)((char *)first + (size_t)(i) * stride))
	for (int i = 0; i < n; i++)
		if (atomic_load(&WORD(i)->id) == me)
			return WORD(i);
	for (int i = 0; i < n; i++) {
		uint64_t old = atomic_load(&WORD(i)->id);
		if ((old == 0 || !within(atomic_load(&WORD(i)->at_ns), now, 2000000000LL)) &&
		    atomic_compare_exchange_strong(&WORD(i)->id, &old, me))
			return WORD(i);
	}
	return NULL;
#undef WORD
}

void tessera_turn_say_forfeits(struct tessera_turn *t, uint64_t me, int64_t now)
{
	GUARD_BEGIN()
	struct tessera_turn_word *mine =
		word_for(t->forfeiters, sizeof(t->forfeiters[0]), TESSERA_TURN_FORFEITERS, me, now);
	if (mine != NULL)
		atomic_store(&mine->at_ns, now);
	GUARD_END()
}

int tessera_turn_others_forfeit(const struct tessera_turn *t, uint64_t me, int64_t now, int64_t window_ns)
{
	int r = 0;
	GUARD_BEGIN(0)
	for (int i = 0; i < TESSERA_TURN_FORFEITERS && !r; i++) {
		uint64_t id = atomic_load(&t->forfeiters[i].id);
		r = id != 0 && id != me && within(atomic_load(&t->forfeiters[i].at_ns), now, window_ns);
	}
	GUARD_END()
	return r;
}

#ifdef TESSERA_SHARED_LOSS
void tessera_turn_share_say(struct tessera_turn *t, uint64_t me, int64_t now, int cap_pm, int got_pm, int short_pm)
{
	GUARD_BEGIN()
	/* w is the share's first member. */
	struct tessera_turn_share *mine =
		(struct tessera_turn_share *)word_for(&t->shares[0].w, sizeof(t->shares[0]), TESSERA_TURN_SHARES, me, now);
	if (mine != NULL) {
		atomic_store(&mine->cap_pm, cap_pm);
		atomic_store(&mine->got_pm, got_pm);
		atomic_store(&mine->short_pm, short_pm);
		atomic_store(&mine->w.at_ns, now);
	}
	GUARD_END()
}

int tessera_turn_share_keep(const struct tessera_turn *t, uint64_t me, int64_t now)
{
	int keep = 1000;
	GUARD_BEGIN(1000)
	int64_t got = 0;
	int others_short = 0;
	for (int i = 0; i < TESSERA_TURN_SHARES; i++) {
		const struct tessera_turn_share *sh = &t->shares[i];
		if (atomic_load(&sh->w.id) == 0 || !within(atomic_load(&sh->w.at_ns), now, 1000000000LL))
			continue;
		int g = atomic_load(&sh->got_pm);
		got += g < 0 ? 0 : g > 1000 ? 1000 : g;
		others_short |= atomic_load(&sh->w.id) != me && atomic_load(&sh->short_pm) > 0;
	}
	/* Only where they got 85 % of the GPU or more together, the switches' loss: under
	 * that the GPU idles (a host-bound or launch-bound neighbour, short by time
	 * slicing's latency rather than its switches), and giving up allowance gives the
	 * short one little (a launch-bound loop beside attention on the fake driver: +1.4
	 * points for 4.4 of the attention's). */
	if (others_short && got >= TESSERA_SHARE_SATURATED_PM)
		keep = got < TESSERA_SHARE_FLOOR_PM ? TESSERA_SHARE_FLOOR_PM : got > 1000 ? 1000 : (int)got;
	GUARD_END()
	return keep;
}
#endif

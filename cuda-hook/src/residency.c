/* SPDX-License-Identifier: Apache-2.0 */
/*
 * When this process's context was off the GPU.
 *
 * A time-sliced GPU runs one context at a time: while another container's context has
 * its turn, this one's kernels stand still, and the events that bracket them (pacing's
 * launch samples) count that turn as if it were theirs. A kernel longer than a time
 * slice is cut by every turn of a busy neighbour, so its samples read it up to twice as
 * long as it is and the container is charged that much (two 20 ms-kernel containers at
 * 50 % got 31.6 % each on an H200).
 *
 * What tells the turns apart is an event on an idle stream of the context: it completes
 * as soon as it is recorded while the context holds the GPU, even while the context's
 * own long kernel runs, and only when the context gets the GPU back while another has
 * it (measured on an H200: probes every 500 us beside another process's kernels
 * completed within 25 us of their recording, or together at the instant the context
 * got its turn back, 2.2-2.4 ms later). So while pacing measures a long launch, a
 * thread of the hook records such a probe every PROBE_STEP_NS on a stream of its own
 * and reads when each completed: a probe that completed much later than the context's
 * usual lag was recorded while the context was off the GPU, which it had been since
 * about half-way between the previous probe's completion and this probe's recording,
 * until this probe's completion. Launch samples subtract the off time inside them
 * (pace_measure.c); the error is about half a probe step per turn, either way.
 *
 * Times are kept as "frame" times: GPU ns since the reference event (ref), which is
 * re-recorded every second (cuEventElapsedTime's float milliseconds lose precision over
 * long spans) with the offset carried in ref_base.
 *
 * Every CUDA call on the probing side is made under rs.mu, which also guards every
 * field; the thread stops calling CUDA at exit (an atexit handler registered after the
 * CUDA runtime's, so run before it) and while a stream capture is open (an event call
 * could break a capture in global mode).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "fork.h"
#include "log.h"
#include "residency.h"
#include "state.h"

#define PROBE_STEP_NS (2 * TESSERA_RESIDENCY_TURN_ERR_NS)
/* Probes outstanding at most: 24 ms of probing while the context is off the GPU. */
#define NPROBE 96
#define NOFF 128
/* A probe this much later than the context's usual lag was recorded while the context
 * was off the GPU (the usual lag varies by a few tens of us). */
#define LATE_NS 150000LL
/* Probes further apart than this (the thread was descheduled, or probing paused) may
 * have missed a turn between them: the coverage starts again. */
#define GAP_NS (8 * PROBE_STEP_NS)
#define REANCHOR_NS 1000000000LL
/* A record call that took longer than this (the thread was descheduled in it, or the
 * driver held it) leaves the probe's host time unsure by as much. */
#define RECORD_SURE_NS 30000LL
#define NBASE 128
#define HOLD_MAX_NS 1000000000LL
/* The probe recorded right before a measured start event may complete a little after
 * it, on its own stream: coverage may begin this much after the start. */
#define COVER_SLACK_NS 100000LL

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int started, stopping;
	CUcontext ctx;        /* the context probed; NULL: none */
	CUcontext made_in;    /* the context the stream and events below belong to */
	CUstream stream;
	CUevent ref, ref_next;
	int ref_next_pending;
	int64_t ref_base, reanchor_at;
	CUevent ev[NPROBE];
	int64_t host[NPROBE]; /* host ns right after each probe's record */
	uint8_t sure[NPROBE]; /* the record returned within RECORD_SURE_NS: its host time is exact */
	unsigned head, tail;  /* probes outstanding: [head, tail) */
	/* What the probing is for (a launch sample, a burst): each until its event has
	 * completed, or while it is open. Probing stops when none holds it, and by
	 * armed_until (1 s after the last hold) whatever happens. */
	struct {
		int on, open;
		CUevent until;
	} hold[TESSERA_RESIDENCY_HOLDS];
	int64_t armed_until;
	int have_prev;        /* probes continuous from cover_from to prev_g */
	int64_t prev_g, prev_host, cover_from;
	/* A probe's usual completion (frame) less its recording (host): the least of the
	 * last NBASE sure probes' (so one probe whose thread was descheduled, or whose
	 * clock read came late, does not move it for long). */
	int64_t base_d[NBASE];
	unsigned nbase;
	int64_t base;
	struct {
		int64_t a, b;
	} off[NOFF];
	unsigned noff;
	int64_t probes, late, covered, uncovered;
} rs = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static _Atomic int64_t late_seen_ns;

static int usable(void)
{
#ifdef TESSERA_NO_TURN_PROBES
	/* A diagnostic build (Makefile, HOOK_CFLAGS) that never probes, as on a driver
	 * without these calls: what the probes cost a program, set against the hook. */
	return 0;
#else
	return REAL(cuStreamCreate) && REAL(cuStreamDestroy_v2) && REAL(cuCtxSetCurrent) && REAL(cuEventCreate) &&
	       REAL(cuEventRecord) && REAL(cuEventQuery) && REAL(cuEventDestroy_v2) && REAL(cuEventElapsedTime_v2);
#endif
}

/* The event's frame time (caller holds rs.mu), or INT64_MIN if it cannot be read. */
static int64_t frame_of(CUevent e)
{
	float ms = 0;
	if (REAL(cuEventElapsedTime_v2)(&ms, rs.ref, e) != CUDA_SUCCESS || !(ms > -1e5f && ms < 1e5f))
		return INT64_MIN;
	return rs.ref_base + (int64_t)((double)ms * 1e6);
}

static void break_coverage(void)
{
	rs.have_prev = 0;
}

/* Drops the stream and events (caller holds rs.mu); they are destroyed only while
 * their context lives (a destroyed context took them with it). */
static void drop_probes(int destroy)
{
	if (rs.made_in == NULL)
		return;
	if (destroy && REAL(cuCtxSetCurrent)(rs.made_in) == CUDA_SUCCESS) {
		for (int i = 0; i < NPROBE; i++)
			REAL(cuEventDestroy_v2)(rs.ev[i]);
		REAL(cuEventDestroy_v2)(rs.ref);
		REAL(cuEventDestroy_v2)(rs.ref_next);
		REAL(cuStreamDestroy_v2)(rs.stream);
	}
	rs.made_in = NULL;
	rs.head = rs.tail = 0;
	rs.ref_next_pending = 0;
	rs.nbase = 0;
	rs.noff = 0;
	break_coverage();
}

/* The stream, reference and probes in the probed context, current on this thread
 * (caller holds rs.mu); 0 if they cannot be made. */
static int make_probes(void)
{
	if (rs.made_in == rs.ctx)
		return 1;
	drop_probes(1);
	if (REAL(cuCtxSetCurrent)(rs.ctx) != CUDA_SUCCESS)
		return 0;
	/* Non-blocking: an event on a blocking stream would wait for the legacy default
	 * stream's work, which is the program's. */
	if (REAL(cuStreamCreate)(&rs.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return 0;
	/* ev[0..NPROBE), then ref and ref_next: made in order, undone in order. */
	CUevent *all[NPROBE + 2];
	for (int i = 0; i < NPROBE; i++)
		all[i] = &rs.ev[i];
	all[NPROBE] = &rs.ref;
	all[NPROBE + 1] = &rs.ref_next;
	int n = 0;
	while (n < NPROBE + 2 && REAL(cuEventCreate)(all[n], CU_EVENT_DEFAULT) == CUDA_SUCCESS)
		n++;
	if (n < NPROBE + 2 || REAL(cuEventRecord)(rs.ref, rs.stream) != CUDA_SUCCESS) {
		while (n-- > 0)
			REAL(cuEventDestroy_v2)(*all[n]);
		REAL(cuStreamDestroy_v2)(rs.stream);
		return 0;
	}
	rs.made_in = rs.ctx;
	rs.ref_base = 0;
	rs.reanchor_at = tessera_now_ns() + REANCHOR_NS;
	rs.head = rs.tail = 0;
	rs.nbase = 0;
	rs.noff = 0;
	break_coverage();
	return 1;
}

static void add_off(int64_t a, int64_t b)
{
	if (rs.noff > 0) {
		unsigned i = (rs.noff - 1) % NOFF;
		if (a <= rs.off[i].b) {
			if (b > rs.off[i].b)
				rs.off[i].b = b;
			return;
		}
	}
	rs.off[rs.noff % NOFF].a = a;
	rs.off[rs.noff % NOFF].b = b;
	rs.noff++;
}

/* Reads the probes that have completed, in order (caller holds rs.mu). */
static void collect(void)
{
	if (rs.made_in == NULL)
		return;
	/* The reference moves on once the next one has completed. */
	if (rs.ref_next_pending && REAL(cuEventQuery)(rs.ref_next) == CUDA_SUCCESS) {
		int64_t nb = frame_of(rs.ref_next);
		rs.ref_next_pending = 0;
		CUevent t = rs.ref;
		rs.ref = rs.ref_next;
		rs.ref_next = t;
		rs.ref_base = nb;
		if (nb == INT64_MIN) {
			/* The old reference is too far back to read against (probing paused
			 * for minutes): a new frame, and nothing of the old one is kept. */
			rs.ref_base = 0;
			rs.nbase = 0;
			rs.noff = 0;
			break_coverage();
		}
	}
	while (rs.head != rs.tail) {
		unsigned i = rs.head % NPROBE;
		CUresult q = REAL(cuEventQuery)(rs.ev[i]);
		if (q == CUDA_ERROR_NOT_READY)
			return;
		rs.head++;
		int64_t g = q == CUDA_SUCCESS ? frame_of(rs.ev[i]) : INT64_MIN, h = rs.host[i];
		if (g == INT64_MIN) {
			break_coverage();
			continue;
		}
		rs.probes++;
		int64_t d = g - h;
		if (rs.sure[i]) {
			rs.base_d[rs.nbase++ % NBASE] = d;
			unsigned n = rs.nbase < NBASE ? rs.nbase : NBASE;
			rs.base = rs.base_d[0];
			for (unsigned k = 1; k < n; k++)
				if (rs.base_d[k] < rs.base)
					rs.base = rs.base_d[k];
		}
		if (rs.nbase == 0) {
			continue; /* no usual lag yet */
		} else if (!rs.have_prev || h - rs.prev_host > GAP_NS) {
			rs.have_prev = 1;
			rs.cover_from = g;
		} else if (d - rs.base > LATE_NS) {
			rs.late++;
			atomic_store_explicit(&late_seen_ns, tessera_now_ns(), memory_order_relaxed);
			/* Off the GPU from between the previous probe's completion and this
			 * one's recording (where it would have completed) until now. */
			int64_t due = h + rs.base, from = due > rs.prev_g ? rs.prev_g + (due - rs.prev_g) / 2 : rs.prev_g;
			if (g - from > LATE_NS)
				add_off(from, g);
		}
		rs.prev_g = g;
		rs.prev_host = h;
	}
}

static void probe_once(int64_t now)
{
	if (rs.made_in == NULL)
		return;
	if (!rs.ref_next_pending && now >= rs.reanchor_at) {
		if (REAL(cuEventRecord)(rs.ref_next, rs.stream) == CUDA_SUCCESS)
			rs.ref_next_pending = 1;
		rs.reanchor_at = now + REANCHOR_NS;
	}
	if (rs.tail - rs.head >= NPROBE)
		return; /* off the GPU for a while: the outstanding probes say until when */
	unsigned i = rs.tail % NPROBE;
	int64_t t0 = tessera_now_ns();
	if (REAL(cuEventRecord)(rs.ev[i], rs.stream) != CUDA_SUCCESS) {
		break_coverage();
		return;
	}
	/* Read after the record: a thread descheduled in between makes the probe look
	 * early, never late; and such a probe does not set the usual lag. */
	rs.host[i] = tessera_now_ns();
	rs.sure[i] = rs.host[i] - t0 <= RECORD_SURE_NS;
	rs.tail++;
}

/* Whether some hold is on (caller holds rs.mu). A probe is work of the context: on a
 * time-sliced GPU it makes the context runnable, and another context that has the GPU
 * then loses its turn to it (on an H200 a 70 % tenant whose neighbour probed between
 * its own bursts got 61 %). So the context is probed only while its own launches are
 * queued anyway: until the event after them has completed. */
static int holding(void)
{
	int any = 0;
	for (int i = 0; i < TESSERA_RESIDENCY_HOLDS; i++) {
		if (!rs.hold[i].on)
			continue;
		if (rs.hold[i].open || REAL(cuEventQuery)(rs.hold[i].until) == CUDA_ERROR_NOT_READY)
			any = 1;
		else
			rs.hold[i].on = 0;
	}
	return any;
}

static void *prober(void *arg)
{
	(void)arg;
	CUcontext mine = NULL; /* current on this thread */
	pthread_mutex_lock(&rs.mu);
	for (;;) {
		int64_t now = tessera_now_ns();
		if (rs.stopping)
			break;
		int want = rs.ctx != NULL && now < rs.armed_until && atomic_load(&tessera.captures) == 0;
		if (want && rs.made_in != rs.ctx && !make_probes()) {
			tessera_log(TESSERA_LOG_DEBUG, "pacing cannot probe the context's turns on the GPU");
			rs.ctx = NULL;
			continue;
		}
		/* The probes may have been made in a launching thread (tessera_residency_hold). */
		if (want && mine != rs.made_in && REAL(cuCtxSetCurrent)(rs.made_in) == CUDA_SUCCESS)
			mine = rs.made_in;
		if (!want || !holding()) {
			/* What the probes covered stays covered; the next probe, after the
			 * pause, starts anew (GAP_NS). */
			if (atomic_load(&tessera.captures) == 0)
				collect();
			pthread_cond_wait(&rs.cv, &rs.mu);
			continue;
		}
		collect();
		probe_once(now);
		pthread_mutex_unlock(&rs.mu);
		struct timespec ts = {0, PROBE_STEP_NS};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&rs.mu);
	}
	pthread_mutex_unlock(&rs.mu);
	return NULL;
}

static void stop_at_exit(void)
{
	pthread_mutex_lock(&rs.mu);
	rs.stopping = 1;
	pthread_cond_signal(&rs.cv);
	pthread_mutex_unlock(&rs.mu);
}

void tessera_residency_hold(CUcontext ctx, int who, int open, CUevent until)
{
	if (ctx == NULL || who < 0 || who >= TESSERA_RESIDENCY_HOLDS || !usable())
		return;
	pthread_mutex_lock(&rs.mu);
	int64_t now = tessera_now_ns();
	if (rs.stopping || (rs.ctx != NULL && rs.ctx != ctx && now < rs.armed_until)) {
		pthread_mutex_unlock(&rs.mu); /* one context at a time */
		return;
	}
	if (rs.ctx != ctx) {
		rs.ctx = ctx;
		memset(rs.hold, 0, sizeof(rs.hold));
		break_coverage();
	}
	rs.hold[who].on = open || until != NULL;
	rs.hold[who].open = open;
	rs.hold[who].until = until;
	if (!rs.hold[who].on) {
		pthread_mutex_unlock(&rs.mu);
		return;
	}
	rs.armed_until = now + HOLD_MAX_NS;
	/* A probe now, before the caller records the start of what it measures: the
	 * thread's first may come only after it. The first time, the probes are made here
	 * too, in the caller's thread, whose current context ctx is (pacing measures the
	 * current context). */
	if (open && atomic_load(&tessera.captures) == 0) {
		if (rs.made_in == NULL && !make_probes())
			rs.ctx = NULL;
		else if (rs.made_in == ctx)
			probe_once(now);
	}
	if (!rs.started) {
		pthread_t t;
		pthread_attr_t a;
		sigset_t all, old;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals are not for it */
		__atomic_store_n(&rs.started, pthread_create(&t, &a, prober, NULL) == 0, __ATOMIC_RELEASE);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&a);
		if (rs.started)
			atexit(stop_at_exit);
		else
			rs.stopping = 1;
	}
	pthread_cond_signal(&rs.cv);
	pthread_mutex_unlock(&rs.mu);
}

int64_t tessera_residency_off(CUcontext ctx, CUevent a, CUevent b, int *turns)
{
	pthread_mutex_lock(&rs.mu);
	int64_t off = -1;
	int n = 0;
	if (!rs.stopping && ctx != NULL && ctx == rs.made_in && atomic_load(&tessera.captures) == 0) {
		collect();
		int64_t fa = frame_of(a), fb = frame_of(b);
		/* Probes from before a to (about) b: a turn that began after the last probe
		 * would have held b back past it by the turn's length. */
		if (fa != INT64_MIN && fb >= fa && rs.have_prev && rs.cover_from <= fa + COVER_SLACK_NS &&
		    rs.prev_g >= fb - 2 * PROBE_STEP_NS) {
			off = 0;
			unsigned from = rs.noff > NOFF ? rs.noff - NOFF : 0;
			for (unsigned k = from; k < rs.noff; k++) {
				int64_t x = rs.off[k % NOFF].a > fa ? rs.off[k % NOFF].a : fa;
				int64_t y = rs.off[k % NOFF].b < fb ? rs.off[k % NOFF].b : fb;
				if (y > x) {
					off += y - x;
					n++;
				}
			}
			/* Four contexts in turns leave this one a quarter of the time: more off
			 * than that is a probe gone wrong, not a measure. */
			if (off > (fb - fa) * 4 / 5)
				off = -1;
		}
	}
	if (off >= 0)
		rs.covered++;
	else
		rs.uncovered++;
	pthread_mutex_unlock(&rs.mu);
	if (turns != NULL)
		*turns = off > 0 ? n : 0;
	return off;
}

void tessera_residency_unhold(CUevent until)
{
	pthread_mutex_lock(&rs.mu);
	for (int i = 0; i < TESSERA_RESIDENCY_HOLDS; i++)
		if (rs.hold[i].on && !rs.hold[i].open && rs.hold[i].until == until)
			rs.hold[i].on = 0;
	pthread_mutex_unlock(&rs.mu);
}

void tessera_residency_quiesce(void)
{
	if (!__atomic_load_n(&rs.started, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&rs.mu);
	pthread_mutex_unlock(&rs.mu);
}

void tessera_residency_forget(CUcontext ctx)
{
	pthread_mutex_lock(&rs.mu);
	if (rs.made_in == ctx)
		drop_probes(0);
	if (rs.ctx == ctx) {
		rs.ctx = NULL;
		memset(rs.hold, 0, sizeof(rs.hold));
	}
	pthread_mutex_unlock(&rs.mu);
}

static void after_fork(void)
{
	/* The child has none of the parent's threads or contexts. */
	pthread_mutex_init(&rs.mu, NULL);
	pthread_cond_init(&rs.cv, NULL);
	rs.started = rs.stopping = 0;
	rs.ctx = rs.made_in = NULL;
	rs.head = rs.tail = 0;
	rs.noff = 0;
	rs.have_prev = rs.ref_next_pending = 0;
	rs.nbase = 0;
	rs.armed_until = 0;
	memset(rs.hold, 0, sizeof(rs.hold));
	rs.probes = rs.late = rs.covered = rs.uncovered = 0;
	atomic_store(&late_seen_ns, 0);
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_RESIDENCY, after_fork);
}

int64_t tessera_residency_late_seen_ns(void)
{
	return atomic_load_explicit(&late_seen_ns, memory_order_relaxed);
}

void tessera_residency_stats(int64_t *probes, int64_t *late, int64_t *covered, int64_t *uncovered)
{
	pthread_mutex_lock(&rs.mu);
	*probes = rs.probes;
	*late = rs.late;
	*covered = rs.covered;
	*uncovered = rs.uncovered;
	pthread_mutex_unlock(&rs.mu);
}

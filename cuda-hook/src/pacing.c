/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Compute pacing: a container with cores = c% of a GPU may keep the GPU busy with its
 * kernels for at most c% of the GPU's time, and a container whose work needs less is
 * never held. docs/cuda-hook.md gives the reasoning and the measurements.
 *
 * The container's allowance is GPU time: every pacing period it receives c% of the
 * period in tokens (nanoseconds), at its refill point (phase% into the period, so the
 * refills of the containers on one GPU are spread over the period), keeping at most one
 * period's allowance. Each launch is charged its estimated GPU time up front; a launch
 * that finds the tokens spent waits for the next refill. Nothing else ever holds a
 * launch: a tenant that needs less than its share never waits.
 *
 * GPU time is measured, never assumed, with events on the launching stream:
 *  - per launch class (kernels, graphs), a random sample of launches (one in n, n chosen
 *    so that samples cost well under 1% of the GPU time they measure) is bracketed by an
 *    event pair, read later without blocking; the mean of the samples is what a launch
 *    is charged. Sampling at random over launches, not over time, keeps a program of
 *    mixed kernels charged their mean.
 *  - the launches between two waits for a refill (a burst) are bracketed by events too;
 *    their elapsed time bounds their GPU time from above, so what a burst ran under its
 *    charge is given back to the next allowance; when the GPU was still well behind
 *    the host at the burst's end (it ran the burst back to back), the elapsed time is
 *    exact, and what it ran over is taken from the next allowance. A burst still
 *    running at the next refill is waited for, and its overrun is owed.
 *  - on a time-sliced GPU, another container's turn runs inside a burst where the two
 *    containers' work meets: what a burst ran over its charge beyond what its launch
 *    samples explain is taken for that, and not owed (up to one time slice, but for
 *    a slot burst, which the next rule holds to its slot).
 *  - the refill points of a GPU's containers follow one another (the node agent
 *    places them), so each container's refill begins its slot. A slot burst (one that
 *    began at the container's refill after waiting for it) that runs past its slot's
 *    end gives what it ran past up from the next allowance, whoever's work made it
 *    spill: a time-sliced GPU that runs two busy contexts in turns loses time to the
 *    switches, so saturating containers whose bursts met would stay met; they now
 *    shed load until their bursts fit their slots again, and for a while after a
 *    collision leave a gap at their slots' end for the switch.
 *
 * The tokens belong to the container, not to a process: they live in the container's
 * accounting region (region.c), so two processes at 50% share one 50% allowance. A
 * thread takes 16 launches' worth at a time with one atomic operation while many are
 * left, and spends them with thread-local subtractions.
 *
 * This file is the allowance: the tokens, their refills, the unreserved share, the
 * bursts and what they owe or give back, the slow path and tessera_pace. What the
 * launches cost (the launch samples, the class estimates and per-kernel entries they
 * make, each context's events) is measured in pace_measure.c, which shares
 * pace_measure.h with this file alone; the GPU's turns are taken in pace_turns.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "devices.h"
#include "fork.h"
#include "log.h"
#include "pace.h"
#include "pace_measure.h"
#include "pace_tally.h"
#include "pacing.h"
#include "residency.h"
#include "share.h"
#include "state.h"
#include "turns.h"

#define TESSERA_PACE_TRACE_ROWS
#include "pace_trace.h"

/* The paced GPUs: some GPU has 0 < cores < 100, or is paced to its unreserved share
 * (pacing_any); the paced GPU when there is exactly one GPU, else -1 (pacing_only); this
 * process's view of each GPU's pacing (pacers, by limits index). Set at setup. */
static int pacing_any;
static int pacing_only;
static struct tessera_pacer pacers[TESSERA_MAX_GPUS];

/* Tokens a thread took ahead of use, in GPU ns, and which pacer they came from.
 * Initial-exec TLS: a plain load from the thread pointer, not a __tls_get_addr call;
 * the hook is loaded at process start (LD_PRELOAD or /etc/ld.so.preload), where static
 * TLS has room. */
static __thread int64_t local_left TLS_IE;
static __thread const struct tessera_shared_pacer *local_pacer TLS_IE;

/* A thread takes this many launches' worth of tokens at a time while the tokens hold
 * more than four times as many. */
#define TAKE_EVERY 16

/* A burst is read at its end, and ends where the tokens run out or the program waits.
 * One whose launches are charged far less than they run keeps its tokens while the
 * host, blocked in its launches on a full queue, waits for the GPU: S->F and the host's
 * time are both long, the GPU's lag at F is the queue's depth, and such a burst is
 * neither back to back (a lag under its host time and under half of S->F) nor bounded
 * (a blocked launch is no wait the hook sees), so nothing it ran over was owed. On the
 * fake driver, 20 us kernels with every eighth one of 1 ms at a grid never launched
 * before (charged the class's estimate until sampled): bursts of 114 ms on 16 ms of
 * charge, none read, 90-100 % at cap 80. A burst open for longer than this is chained
 * at the next launch that takes tokens from the container (the coarse clock read
 * every TAKE_EVERY launches while the tokens hold), once the burst before it has been read:
 * such bursts last about as long as the queue is deep, and their lag at F, over half
 * their S->F, shows them back to back. */
#define LONG_BURST_NS (2 * TESSERA_PACING_PERIOD_NS)

/* The limits file's charge line (limits.h), set at setup: per-kernel charges, their
 * gain and the measurement of bursts of two streams only with it; without it every
 * launch is charged its class's estimate (the class estimator), and a burst on more
 * than one stream is not measured. */
static int charge_kernel;

/* What the bursts say of the entries, class by class (KT_GAIN_ONE is 1): a launch is
 * charged its entry times its class's gain. The entries hold what the samples read,
 * each kernel with an event either side: a kernel of a few us reads its events' cost
 * and its launch latency on an idle stream too, and kernels of two streams that run
 * at once each read their own span, together more than the GPU time they took. The
 * samples cannot tell; bursts can, as they tell the class estimates, and move the
 * gain as they move those (half-way, or all the way down where a burst held the GPU's
 * turn). One factor for the class, not the entries one by one: moving every entry
 * with every burst took a 5 ms kernel's entry, sampled seldom, down to a fraction of
 * it (67-76 % at cap 25 in the fake driver's steps of one 5 ms kernel and 40 of
 * 20 us). */
_Atomic int64_t pace_kt_gain[2] = {KT_GAIN_ONE, KT_GAIN_ONE};

/* A host that waited for its work (a synchronize) is back this long after the GPU
 * has run it, at most. */
#define SYNC_WAKE_NS 50000LL

/* Which GPU's burst this thread's wait for its work is counted in (+1; 0: none). */
static __thread int sync_counted TLS_IE;

/* Everything this process has charged, in GPU ns. */
static _Atomic int64_t charged_ns;
/* After a slot burst met another container's turns, the container's allowance is this
 * much short of its slot for MET_HOLD_NS: a time-sliced GPU spends time switching from
 * one context to the next, which slots that fill the period exactly cannot hold, so
 * the bursts of saturating containers would drift into each other's slots. */
#define SLOT_GAP_NS 200000LL
#define MET_HOLD_NS (5 * 1000000000LL)
/* Until when (monotonic ns) the gap is kept: a slot burst of this process met more
 * than 0.5 ms and one launch of another container's turns. */
static _Atomic int64_t met_until_ns;

/* What pacing did in this process, for the debug log at exit (pace_measure.h). */
struct pace_stats pace_stat;

/* (pace_measure.h) */
int pace_bursts_use(const struct ctx_events *c)
{
	int busy = 0;
	for (int g = 0; g < tessera.limits.ngpus && !busy; g++)
		busy = (pacers[g].burst_started || pacers[g].fence_pending) && pacers[g].burst_ctx == c;
	return busy;
}

/* (pacing.h) */
void tessera_pacing_forget_stream(CUstream stream)
{
	uintptr_t t = (uintptr_t)stream + 1;
	pthread_mutex_lock(&pace_ev_mu);
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &pacers[g];
		uintptr_t o = t;
		atomic_compare_exchange_strong(&p->other_stream, &o, TESSERA_OTHER_MANY);
		if (p->xp_stream == t)
			p->xp_stream = 0;
	}
	pthread_mutex_unlock(&pace_ev_mu);
}

/* When a burst last moved the per-kernel gain. A gain no burst has moved for
 * GAIN_STALE_NS goes a quarter of the way back to 1 (the entries as sampled) every
 * GAIN_STALE_NS: what the bursts said of it was said of other work (a program of two
 * streams that now runs one, or launch-bound steps whose bursts are no longer back to
 * back), and a gain under 1 charges the launches less than their samples read. */
#define GAIN_STALE_NS (2 * 1000000000LL)
/* A burst of fewer launches than this does not move the gain: what its launches read
 * beside one another (two streams' kernels overlapping) is the gain's, and a burst of
 * one or two launches, ended at a synchronize, reads one kernel as its sample did (on
 * the fake's two streams, one-launch bursts at the end of a step read 1.9x their
 * charge, moved the gain up by half each, and the program ran 43 % at cap 50). */
#define GAIN_MIN_LAUNCHES 8
static int64_t gain_moved_ns;

static void after_fork(void)
{
	/* The child's bursts, charges and counts start afresh (its events, samples and
	 * estimates: pace_measure.c's handler, just after). */
	atomic_store(&pace_kt_gain[0], KT_GAIN_ONE);
	atomic_store(&pace_kt_gain[1], KT_GAIN_ONE);
	atomic_store(&charged_ns, 0);
	atomic_store(&met_until_ns, 0);
	gain_moved_ns = 0;
	memset(&pace_stat, 0, sizeof(pace_stat));
	for (int g = 0; g < TESSERA_MAX_GPUS; g++) {
		struct tessera_pacer *p = &pacers[g];
		p->slept = p->burst_started = p->fence_pending = 0;
		p->turn_held = 0; /* the parent's */
		p->sync_depth = 0; /* the parent's other threads' waits */
		atomic_store(&p->burst_stream_tag, 0);
	}
	sync_counted = 0;
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_PACING, after_fork);
}

/* A process that ends holding a GPU's turn lets it go: its work ends with it, and the
 * others need not wait for its word to run out. */
__attribute__((destructor)) static void turns_at_exit(void)
{
	for (int g = 0; g < TESSERA_MAX_GPUS; g++)
		pace_turn_release(&pacers[g]);
}

/* What pacing did, in the debug log when the process ends: where a program's time
 * went (holds), what its launches were measured at (samples that found the stream
 * idle against those queued behind other work) and what bursts owed or gave back. */
__attribute__((destructor)) static void pacing_summary(void)
{
	if (!pacing_any)
		return;
	pace_measure_summary();
	tessera_log(TESSERA_LOG_DEBUG,
		    "pacing summary charged_ns=%lld holds=%lld held_ns=%lld set_aside=%lld met=%lld sample_waits=%lld burst_waits=%lld "
		    "refilled_ns=%lld dropped_ns=%lld bursts=%lld skipped=%lld bounded=%lld credited_ns=%lld long_chains=%lld sync_ends=%lld reopens=%lld owed_ns=%lld returned_ns=%lld sliced_ns=%lld forfeit_ns=%lld turns_let_off=%lld restarts=%lld "
		    "conserved=%lld",
		    (long long)atomic_load(&charged_ns), (long long)atomic_load(&pace_stat.holds),
		    (long long)atomic_load(&pace_stat.held_ns), (long long)atomic_load(&pace_stat.set_aside),
		    (long long)atomic_load(&pace_stat.met),
		    (long long)atomic_load(&pace_stat.wait_syncs), (long long)atomic_load(&pace_stat.waits),
		    (long long)atomic_load(&pace_stat.refilled_ns), (long long)atomic_load(&pace_stat.dropped_ns),
		    (long long)atomic_load(&pace_stat.bursts), (long long)atomic_load(&pace_stat.bursts_skipped),
		    (long long)atomic_load(&pace_stat.bounded),
		    (long long)atomic_load(&pace_stat.credited_ns),
		    (long long)atomic_load(&pace_stat.long_chains),
		    (long long)atomic_load(&pace_stat.sync_ends), (long long)atomic_load(&pace_stat.reopens),
		    (long long)atomic_load(&pace_stat.owed_ns), (long long)atomic_load(&pace_stat.returned_ns),
		    (long long)atomic_load(&pace_stat.sliced_ns), (long long)atomic_load(&pace_stat.forfeit_ns),
		    (long long)atomic_load(&pace_stat.turns_let_off), (long long)atomic_load(&pace_stat.restarts), (long long)atomic_load(&pace_stat.conserved));
	pace_turns_summary();
}

/* ---- the container's allowance ------------------------------------------------- */

/*
 * A container granted no cores on a GPU whose share directory the node agent mounted
 * is paced to the GPU's unreserved share (share.h): its allowance and refill point
 * follow the file, read here (at set-up, then at most every TESSERA_SHARE_REREAD_NS,
 * with s->mu held once the pacer runs). A file that is missing, unreadable or
 * malformed keeps the last share read well, or, before any was, the least share
 * (TESSERA_SHARE_MIN): what the tenant can do to the file's directory (nothing: it is
 * read-only) or the agent's trouble never unpaces the container. Share 100 (nothing
 * reserved on the GPU) is not paced: the launch path then only checks, on a coarse
 * clock, whether the next read is due.
 */
static void share_apply(struct tessera_pacer *p, int64_t now)
{
	const char *uuid = tessera.limits.gpus[p - pacers].uuid;
	struct tessera_share sh;
	atomic_store(&p->share_read_ns, now);
	if (tessera_share_read(uuid, &sh) == 0) {
		if (!p->share_ok || sh.share != p->share_pct || sh.phase != p->share_phase)
			tessera_log(TESSERA_LOG_DEBUG, "GPU %s: paced to the unreserved share, %d %% from %d %%", uuid,
				    sh.share, sh.phase);
		p->share_ok = 1;
		p->share_pct = sh.share;
		p->share_phase = sh.phase;
	} else if (!p->share_ok) {
		if (p->share_pct != TESSERA_SHARE_MIN)
			tessera_log(TESSERA_LOG_WARN, "GPU %s: no valid share file in %s/%s: paced to the least share, %d %%", uuid,
				    TESSERA_SHARES_DIR, uuid, TESSERA_SHARE_MIN);
		p->share_pct = TESSERA_SHARE_MIN;
		p->share_phase = 0;
	}
	p->slot_off_ns = TESSERA_PACING_PERIOD_NS * p->share_phase / 100;
	p->slot_len_ns = TESSERA_PACING_PERIOD_NS * p->share_pct / 100;
	atomic_store(&p->enabled, p->share_pct < 100);
}

void tessera_pacing_setup(void)
{
	int paced = 0, last = -1;
	charge_kernel = tessera.limits.charge_kernel;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &pacers[g];
		const struct tessera_gpu_limit *l = &tessera.limits.gpus[g];
		p->s = tessera_region_pacer(tessera.region, g);
		p->ev_s = 0;
		p->ev_f = 1;
		p->ev_x = 2;
		p->ev_xp = 3;
		p->share_dynamic = l->cores == 0 && tessera.limits.mps_percent == 0 && tessera_share_present(l->uuid);
		if (p->share_dynamic) {
			share_apply(p, tessera_now_ns());
		} else {
			p->enabled = l->cores > 0 && l->cores < 100;
			p->slot_off_ns = TESSERA_PACING_PERIOD_NS * l->phase / 100;
			p->slot_len_ns = TESSERA_PACING_PERIOD_NS * l->cores / 100;
		}
		p->work_conserving = (p->enabled || p->share_dynamic) && tessera.limits.work_conserving;
		/* A container without cores takes no GPU turns: the node mounts it no turn file. */
		p->turn = p->enabled && !p->share_dynamic ? tessera_turn_open(l->uuid) : NULL;
		if (p->enabled || p->share_dynamic) {
			paced++;
			last = g;
		}
	}
	pacing_any = paced > 0;
	pace_turns_setup(tessera.limits.cgroup);
	pacing_only = tessera.limits.ngpus == 1 ? last : -1;
	if (paced > 0 && !pace_events_usable())
		tessera_log(TESSERA_LOG_WARN, "the driver lacks the event functions pacing measures with; "
					      "launches are paced by count only");
}

static int pacer_lock(struct tessera_shared_pacer *s)
{
	int rc = pthread_mutex_lock(&s->mu);
	if (rc == EOWNERDEAD) {
		/* A process died holding it: the tokens are whole. */
		pthread_mutex_consistent(&s->mu);
		return 0;
	}
	return rc;
}

/*
 * The pacer lives in the container's region, which any of its processes can write.
 * Values no pacer reaches (more tokens than three periods: a period's allowance, what
 * a container that takes the GPU's turns keeps beyond it, turn_bank, and what a burst
 * gives back; more debt than a thousand periods, a refill in the future) are reset
 * to a fresh pacer before they are used
 * (caller holds s->mu), so that no arithmetic on them overflows and no sleep is
 * computed from them. A tenant gains nothing by this that rewriting the pacer
 * consistently would not give it (docs/cuda-hook.md).
 */
static void pacer_check(struct tessera_shared_pacer *s, int64_t now)
{
	const int64_t P = TESSERA_PACING_PERIOD_NS;
	int64_t tokens = atomic_load(&s->tokens);
	if (tokens >= -1000 * P && tokens <= 3 * P && s->refill_k >= 0 && s->refill_k <= now / P + 2)
		return;
	static _Atomic int logged;
	if (atomic_exchange(&logged, 1) == 0)
		tessera_log(TESSERA_LOG_ERROR, "the container's compute pacer was damaged; starting it afresh");
	atomic_store(&s->tokens, 0);
	s->refill_k = 0;
}

/* A container that takes the GPU's turns may wait for one past its next refill
 * (another container's kernels run): it keeps this much more than one period's
 * allowance, one launch or half a period, the longer, so that the wait does not cost
 * it a refill; its turns are then longer, and fewer turns lose less of the GPU to
 * the hand-offs (in the fake driver, whose context switch costs 160 us, 5 ms kernels
 * at 30/70 got 29.9 / 66.2 % with one launch more, 29.9 / 67.6 % with this). */
int64_t pace_turn_bank(void)
{
	const int64_t P = TESSERA_PACING_PERIOD_NS;
	int64_t more = pace_est_longest() > P / 2 ? pace_est_longest() : P / 2;
	return more < P ? more : P;
}

#ifdef TESSERA_SHARED_LOSS
/* The shared-loss trial (turns.h; a diagnostic build): every SHARE_WINDOW_NS the
 * container says in the GPU's turn file what it was charged of the GPU's time and
 * whether it was short (under its cap less 3 points, never held by its allowance, and
 * cut by other contexts' turns for at least the difference), and keeps the part of its
 * allowance that the containers got together while another was short, where its own
 * measurements saw another context lately (caller holds s->mu). The holds and the
 * sliced time are the process's. */
#define SHARE_WINDOW_NS 250000000LL
static int64_t shared_loss(struct tessera_pacer *p, int64_t len, int64_t now)
{
	int64_t w = now - p->share_t0;
	int64_t charged = atomic_load(&p->s->charged), holds = atomic_load(&pace_stat.holds),
		sliced = atomic_load(&pace_stat.sliced_ns);
	if (p->share_t0 > 0 && w < SHARE_WINDOW_NS)
		return len * p->share_keep_pm / 1000;
	if (p->share_t0 > 0) {
		int cap_pm = (int)(p->slot_len_ns * 1000 / TESSERA_PACING_PERIOD_NS);
		int got_pm = (int)((charged - p->share_charged0) * 1000 / w);
		int cut_pm = (int)((sliced - p->share_sliced0) * 1000 / w);
		int is_short = holds == p->share_holds0 && got_pm < cap_pm - 30 && got_pm + cut_pm >= cap_pm - 30;
		int keep = pace_turn_share(p, now, cap_pm, got_pm, is_short ? cap_pm - got_pm : 0);
		p->share_keep_pm = pace_contended() ? keep : 1000;
	} else {
		p->share_keep_pm = 1000;
	}
	p->share_t0 = now;
	p->share_charged0 = charged;
	p->share_holds0 = holds;
	p->share_sliced0 = sliced;
	return len * p->share_keep_pm / 1000;
}
#endif

/* Adds the allowance of every refill point passed since the last (caller holds s->mu),
 * keeping at most one period's (more, turn_bank, while the container takes turns),
 * and returns the next refill point. */
static int64_t refill(struct tessera_pacer *p, int64_t now)
{
	struct tessera_shared_pacer *s = p->s;
	const int64_t P = TESSERA_PACING_PERIOD_NS;
	int64_t len = p->slot_len_ns;
#ifdef TESSERA_SHARED_LOSS
	len = shared_loss(p, len, now);
#endif
	if (now < atomic_load_explicit(&met_until_ns, memory_order_relaxed) && len > 4 * SLOT_GAP_NS)
		len -= SLOT_GAP_NS;
	int64_t k = (now - p->slot_off_ns) / P;
	if (now < p->slot_off_ns + k * P)
		k--;
	int64_t r = k + 1; /* refill points are off + (r-1) P */
	if (s->refill_k == 0 || r > s->refill_k) {
		int64_t n = s->refill_k == 0 ? 1 : r - s->refill_k;
		int64_t add = n > 1000 ? 1000 * len : n * len;
		int64_t t = atomic_load(&s->tokens);
		int64_t cap = len;
		if (p->turn_used_ns > 0 && now - p->turn_used_ns < CONTENDED_NS)
			cap += pace_turn_bank();
		int64_t want = t + add < cap ? t + add : cap;
		int64_t dropped = t + add - (want > t ? want : t);
		if (p->burst_started)
			p->burst_dropped_ns += dropped;
		PSTAT_ADD(dropped_ns, dropped);
		if (dropped > 0)
			tessera_log(TESSERA_LOG_DEBUG, "pacing refill dropped_ns=%lld periods=%lld tokens_ns=%lld in_burst=%d",
				    (long long)dropped, (long long)n, (long long)t, p->burst_started);
		if (want > t) {
			atomic_fetch_add(&s->tokens, want - t);
			PSTAT_ADD(refilled_ns, want - t);
		}
		s->refill_k = r;
	}
	return p->slot_off_ns + (k + 1) * P;
}

void pace_sleep_until(int64_t t)
{
	struct timespec ts = {.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int capturing(CUstream stream)
{
	CUstreamCaptureStatus st;
	if (atomic_load(&tessera.captures) > 0)
		return 1;
	return REAL(cuStreamIsCapturing) != NULL && REAL(cuStreamIsCapturing)(stream, &st) == CUDA_SUCCESS &&
	       st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The open burst is over without its F (caller holds pace_ev_mu): no more probing for
 * it. */
static void burst_unprobe(struct tessera_pacer *p)
{
	struct ctx_events *c = p->burst_ctx;
	if (p->burst_probed && c != NULL && c->gen == p->burst_ctx_gen && c->ctx != NULL)
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 0, NULL);
	p->burst_probed = 0;
}

/* The open burst has its context's turns probed from now on, for another second at
 * least (residency.c stops probing a second after the last call for it): a
 * work-conserving container's chained bursts, one per allowance, keep the probing on
 * while it has work, including a burst that began while another context had work and
 * was not probed then. */
static void burst_probe(struct tessera_pacer *p)
{
	pthread_mutex_lock(&pace_ev_mu);
	struct ctx_events *c = p->burst_ctx;
	if (p->burst_started && c != NULL && c->gen == p->burst_ctx_gen && c->ctx != NULL) {
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 1, NULL);
		p->burst_probed = 1;
	}
	pthread_mutex_unlock(&pace_ev_mu);
}

/* A burst begins (caller holds s->mu): event S before its first launch. The host's
 * clock is read right before S is recorded and right after F is (not when the slow
 * path began, which may be milliseconds earlier if the thread was descheduled or
 * waited meanwhile), so that the burst's host time is never short and the lag
 * settle_burst computes from it is never overstated. */
static void begin_burst(struct tessera_pacer *p, CUstream stream, int64_t charged0, int64_t all0, int at_refill)
{
	p->burst_started = 0;
	if (!pace_events_usable())
		return;
	pthread_mutex_lock(&pace_ev_mu);
	struct ctx_events *c = pace_events_current();
	/* Long launches beside another context: their turns are probed while it runs;
	 * so are any launches' while a sample's or a burst's overrun is unexplained. */
	int64_t est = pace_est_longest();
	p->burst_probed = c != NULL && ((est >= PROBE_MIN_NS && pace_contended()) || pace_unexplained() ||
					(p->work_conserving && !pace_others_have_work()));
	if (p->burst_probed)
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 1, NULL);
	/* The events' own time, measured now and then on the drained stream. */
	if (c != NULL)
		pace_event_cost(c, stream);
	int64_t t0 = tessera_now_ns();
	if (c != NULL && REAL(cuEventRecord)(c->ev[p->ev_s], stream) == CUDA_SUCCESS) {
		p->burst_started = 1;
		p->burst_ctx = c;
		p->burst_ctx_gen = c->gen;
		p->burst_stream = stream;
		atomic_store(&p->other_stream, 0);
		atomic_store(&p->class_charged, 0);
		atomic_store(&p->burst_classes, 0);
		p->burst_seq++;
		p->burst_fresh = 1;
		p->open_s_ev = p->ev_s;
		atomic_store(&p->burst_stream_tag, (uintptr_t)stream + 1);
		/* The container waited for this refill with nothing of this burst's stream
		 * left to run (settle_burst waited for it), so S completes as it is recorded. */
		p->lag_s_ns = 0;
		p->lag_s_sure = 1;
		p->burst_t0_ns = t0;
		atomic_store_explicit(&p->chain_at_ns, t0 + LONG_BURST_NS, memory_order_relaxed);
		p->burst_charged0 = charged0;
		p->burst_tally = charge_kernel && pace_tally_sum(&p->burst_cost0, &p->burst_launch0) == 0;
		p->burst_all0 = all0;
		p->burst_at_refill = at_refill;
		p->burst_turn = p->turn_held;
		p->burst_sync_ns = p->burst_syncs = 0;
		p->burst_dropped_ns = 0;
	}
	pthread_mutex_unlock(&pace_ev_mu);
}

/* The waits under way since sync_t0 are the open burst's until now, from its start
 * at the earliest (caller holds s->mu). */
static void sync_count(struct tessera_pacer *p, int64_t now)
{
	int64_t from = p->sync_t0 > p->burst_t0_ns ? p->sync_t0 : p->burst_t0_ns;
	p->burst_sync_ns += now > from ? now - from : 0;
}

/* The open burst ends here (caller holds s->mu): event F after its last launch. When
 * the container goes on without waiting (a refill came while it launched), the next
 * burst starts at F (chained). */
static void end_burst(struct tessera_pacer *p, CUstream stream, int chain)
{
	pthread_mutex_lock(&pace_ev_mu);
	struct ctx_events *c = p->burst_ctx;
	CUcontext cur = NULL;
	if (c->gen == p->burst_ctx_gen && c->ctx != NULL && REAL(cuCtxGetCurrent)(&cur) == CUDA_SUCCESS &&
	    cur == c->ctx && REAL(cuEventRecord)(c->ev[p->ev_f], stream) == CUDA_SUCCESS) {
		int64_t now = tessera_now_ns();
		p->fence_pending = 1;
		p->chained = chain;
		p->f_host_ns = now - p->burst_t0_ns;
		/* A wait still on: its part so far is this burst's, the rest the next's. */
		if (p->sync_depth > 0) {
			sync_count(p, now);
			p->sync_t0 = now;
		}
		p->f_sync_ns = p->burst_sync_ns;
		p->f_syncs = p->burst_syncs;
		p->burst_sync_ns = p->burst_syncs = 0;
		p->f_dropped_ns = p->burst_dropped_ns;
		p->burst_dropped_ns = 0;
		p->f_at_ns = now;
		p->f_charged = atomic_load(&charged_ns) - p->burst_charged0;
		p->f_all = atomic_load(&p->s->charged) - p->burst_all0;
		/* The streams of the burst: S's, F's and the one other a launch went to. Two
		 * are measured (X after the last launch on the one F is not on), more are not. */
		uintptr_t o = atomic_exchange(&p->other_stream, 0), a = (uintptr_t)p->burst_stream + 1,
			  fs = (uintptr_t)stream + 1, x = fs != a ? a : o;
		p->f_other = charge_kernel ? o == TESSERA_OTHER_MANY || (fs != a && o != 0 && o != fs) : o != 0 || fs != a;
		p->f_x_stream = 0;
		uintptr_t xp = p->xp_stream;
		p->xp_stream = 0; /* a start mark for the next burst only */
		if (!p->f_other && x != 0 && x != fs) {
			if (REAL(cuEventRecord)(c->ev[p->ev_x], (CUstream)(x - 1)) == CUDA_SUCCESS) {
				/* Where the work of the stream that is not S's began: after the last X
				 * recorded on it, if that is one, else (settle_burst) after S. */
				uintptr_t not_s = fs != a ? fs : x;
				p->f_xp_ev = xp == not_s && p->xp_gen == c->gen ? p->ev_xp : -1;
				p->f_x_ev = p->ev_x;
				p->f_x_stream = x;
				int t = p->ev_x;
				p->ev_x = p->ev_xp;
				p->ev_xp = t;
				p->xp_stream = x;
				p->xp_gen = c->gen;
			} else {
				p->f_other = 1;
			}
		}
		p->f_class = atomic_exchange(&p->class_charged, 0);
		p->f_classes = atomic_exchange(&p->burst_classes, 0);
		p->f_seq = p->burst_seq;
		p->burst_fresh = 0;
		/* With the charge line, a burst is charged what its launches were charged,
		 * from every thread's tally: the process's count moves as threads take tokens
		 * ahead (16 launches' worth at a time) and give back what they did not launch,
		 * which for a burst ended at a synchronize read as twice its launches, or less
		 * than nothing (H200, attention at cap 50: 117 of 187 bursts uncounted, half of
		 * them negative; two tenants' gains fell to 0.54 and 0.63); and one thread's
		 * launches alone leave out what another launched into the burst (PyTorch's
		 * backward pass: an attention step's bursts read 3.5x their opening thread's
		 * charges, and the gain fell to 0.57 with the cap 50 step at 85 % of its solo
		 * rate). f_launches is -1 where the tally is not known. */
		int64_t cost1;
		uint64_t launches1;
		int tally = p->burst_tally && pace_tally_sum(&cost1, &launches1) == 0;
		p->f_launches = -1;
		if (tally) {
			int64_t own = cost1 - p->burst_cost0;
			p->f_launches = (int64_t)(launches1 - p->burst_launch0);
			p->f_all += own - p->f_charged;
			p->f_charged = own;
		}
		p->f_lag_s_ns = p->lag_s_ns;
		p->f_lag_s_sure = p->lag_s_sure;
		p->f_at_refill = p->burst_at_refill;
		p->burst_at_refill = 0;
		p->f_turn = p->burst_turn && p->turn_held;
		p->burst_turn = p->turn_held;
		/* A chained burst goes on at F: the probing with it. */
		if (p->burst_probed && !chain)
			tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 0, c->ev[p->ev_f]);
		if (chain) {
			/* Known once this burst's F is read (settle_burst). */
			p->lag_s_ns = -1;
			p->lag_s_sure = 0;
			p->burst_seq++;
			p->open_s_ev = p->ev_f; /* its S, until the ended one is read: ev_s then */
			p->burst_stream = stream;
			atomic_store(&p->burst_stream_tag, (uintptr_t)stream + 1);
			p->burst_t0_ns = now;
			atomic_store_explicit(&p->chain_at_ns, now + LONG_BURST_NS, memory_order_relaxed);
			p->burst_charged0 = atomic_load(&charged_ns);
			p->burst_tally = tally;
			p->burst_cost0 = tally ? cost1 : 0;
			p->burst_launch0 = tally ? launches1 : 0;
			p->burst_all0 = atomic_load(&p->s->charged);
		} else {
			p->burst_started = 0;
			atomic_store(&p->burst_stream_tag, 0);
		}
	} else {
		p->burst_started = 0;
		p->burst_fresh = 0;
		atomic_store(&p->burst_stream_tag, 0);
		burst_unprobe(p);
	}
	pthread_mutex_unlock(&pace_ev_mu);
}

/* GPU ns from a to b, two completed events, signed (b may have completed first); 0
 * and *ok cleared if the driver cannot tell. */
static int64_t signed_ns(CUevent a, CUevent b, int *ok)
{
	float ms = 0;
	if (REAL(cuEventElapsedTime_v2)(&ms, a, b) != CUDA_SUCCESS || !(ms > -3.6e6f && ms < 3.6e6f)) {
		*ok = 0;
		return 0;
	}
	return (int64_t)((double)ms * 1e6);
}

/* The host time after S in which the GPU's queue surely held work of the ended burst
 * (caller holds pace_ev_mu), from its samples' spans, between the GPU's reaching S
 * (lag_s after S's record) and F's record: the GPU may have idled only in what is
 * left of that. A GPU runs an event on an idle stream a little after its record:
 * each span gives up BUSY_MARGIN_NS. */
#define BUSY_MARGIN_NS 10000LL
static int64_t burst_busy(struct tessera_pacer *p, int64_t lag_s)
{
	int i = (int)(p->f_seq & 1);
	if (p->busy[i].seq != p->f_seq)
		return 0;
	int64_t sum = 0, end = lag_s;
	for (int k = 0; k < p->busy[i].n; k++) {
		int64_t lo = p->busy[i].a[k] > end ? p->busy[i].a[k] : end;
		int64_t hi = p->busy[i].g[k] + lag_s - BUSY_MARGIN_NS;
		hi = hi < p->f_host_ns ? hi : p->f_host_ns;
		if (hi > lo) {
			sum += hi - lo;
			end = hi;
		}
	}
	return sum;
}

/* The ended burst's GPU time (caller holds s->mu), read without waiting unless wait
 * is set (the container waited for a refill: a burst the GPU still runs then has
 * overrun its allowance). What the burst owes is taken from the tokens here; what it
 * gives back (its launches were charged more than they ran) is returned for the
 * caller to add after the refill, where the cap of one period's allowance does not
 * swallow it: a container whose estimate runs above its launches' time would
 * otherwise lose the difference every period (10 us kernels at cap 80 ran 74.6 %).
 *
 * A burst's elapsed time e (S to F on its stream) bounds from above the GPU time its
 * launches took: when it is below their charge, they were charged too much, and the
 * difference is given back. It equals their GPU time only when the GPU ran them back
 * to back, with work of the burst always queued: then what e runs over the charge is
 * owed. The test for back to back is the queue's lag behind the host at F (how long
 * after the host issued the burst's last launch the GPU finished it): e - host time,
 * plus the lag at S for a burst that began at the previous one's F. A program whose
 * GPU waits for its host (a launch-bound loop, a training step ending in a
 * synchronize) has a lag of about one kernel at F; one that keeps the queue full has
 * a lag of many kernels, or of a kernel longer than the host took to issue the burst. */
static void gain_relax(void)
{
	int64_t now = tessera_now_ns();
	if (!charge_kernel || now - gain_moved_ns < GAIN_STALE_NS)
		return;
	gain_moved_ns = now;
	for (int cls = 0; cls < 2; cls++) {
		int64_t g = atomic_load(&pace_kt_gain[cls]);
		atomic_store(&pace_kt_gain[cls], g + (KT_GAIN_ONE - g) / 4);
	}
}

/* Slot bursts that would forfeit often are let off all of the other contexts' turns
 * in them (not half, up to 1 ms) unless another container's slot bursts forfeit
 * often too; what their own launches spill past the slot is still given up. Beside a
 * saturating container a forfeit is a rare correction that settles both into their
 * slots (the GPU suite's 30 / 70 FMA pair on an H200: 3 of the 30 % tenant's 271
 * counted bursts forfeited, all in its first two seconds), and where the GPU's
 * switches are dear both forfeit often and keep doing so (two 1 ms-kernel tenants on
 * the fake driver with 160 us switches held 1.2-2 points less of the GPU when they
 * stopped). Where another container's work keeps landing in the slot whatever this
 * one gives up (a host-paced neighbour, rarely held, keeps to no slot and never
 * forfeits), a quarter of the slot bursts forfeit and that only costs this one: 1 ms
 * kernels at 30 beside an LLM-shaped step at 70 got 25.3 % of the fake driver's GPU,
 * 28.0-28.6 let off those turns (as with no forfeit at all). Over the current window
 * of a second and the one before it, with at least FORFEITS_OFTEN_MIN slot bursts,
 * forfeits are often where at least one slot burst in FORFEITS_OFTEN_EVERY would have
 * given one up (those still count, so forfeits come back once the other's work stops
 * landing in the slot); the container then says so in the GPU's turn file (turns.h),
 * and reads whether another did within 2 s. Without a turn file the rule before
 * holds, as -DTESSERA_FORFEIT_ALWAYS builds it. Returns 1 where this burst is let off
 * all of the turns. Caller holds s->mu. */
#define FORFEITS_OFTEN_EVERY 10
#define FORFEITS_OFTEN_MIN 10
static int forfeit_frequent(struct tessera_pacer *p, int would, int64_t now)
{
	if (now - p->fw_t0 >= 1000000000LL) {
		int gone = now - p->fw_t0 >= 2000000000LL; /* no slot burst for a whole window */
		p->fw_bursts[0] = gone ? 0 : p->fw_bursts[1];
		p->fw_would[0] = gone ? 0 : p->fw_would[1];
		p->fw_bursts[1] = p->fw_would[1] = 0;
		p->fw_t0 = now;
	}
	p->fw_bursts[1]++;
	p->fw_would[1] += would;
	int n = p->fw_bursts[0] + p->fw_bursts[1], f = p->fw_would[0] + p->fw_would[1];
	if (n < FORFEITS_OFTEN_MIN || f * FORFEITS_OFTEN_EVERY < n)
		return 0;
	int others = pace_turn_forfeits(p, now);
#ifdef TESSERA_FORFEIT_ALWAYS
	others = 1;
#endif
	if (others == 0)
		PSTAT_ADD(turns_let_off, 1);
	return others == 0;
}

static int64_t settle_burst(struct tessera_pacer *p, int wait)
{
	struct tessera_shared_pacer *s = p->s;
	pthread_mutex_lock(&pace_ev_mu);
	struct ctx_events *c = p->burst_ctx;
	int ok = c->gen == p->burst_ctx_gen && c->ctx != NULL;
	CUresult q = ok ? REAL(cuEventQuery)(c->ev[p->ev_f]) : CUDA_ERROR_INVALID_VALUE;
	if (q == CUDA_SUCCESS && p->f_x_stream != 0)
		q = REAL(cuEventQuery)(c->ev[p->f_x_ev]);
	pthread_mutex_unlock(&pace_ev_mu);
	if (q == CUDA_ERROR_NOT_READY && !wait)
		return 0;
	if (q == CUDA_ERROR_NOT_READY) {
		PSTAT_ADD(waits, 1);
		q = REAL(cuEventSynchronize)(c->ev[p->ev_f]);
		if (q == CUDA_SUCCESS && p->f_x_stream != 0)
			q = REAL(cuEventSynchronize)(c->ev[p->f_x_ev]);
	}
	p->fence_pending = 0;
	gain_relax();
	int64_t e = -1, off = -1;
	pthread_mutex_lock(&pace_ev_mu);
	if (q == CUDA_SUCCESS && c->gen == p->burst_ctx_gen && c->ctx != NULL) {
		e = pace_elapsed_ns(c->ev[p->ev_s], c->ev[p->ev_f]);
		if (e >= 0)
			off = tessera_residency_off(c->ctx, c->ev[p->ev_s], c->ev[p->ev_f], NULL);
		if (e >= 0 && p->f_x_stream != 0) {
			/* Two streams: from the earlier start to the later end of the two (their
			 * kernels overlap, and each launch was charged its own length). S bounds
			 * the other stream's start where S found its stream idle (its work was
			 * launched after S ran); else, for a burst that began at the last one's
			 * F, the X recorded with that F on the other stream does. */
			int good = 1;
			int64_t x = signed_ns(c->ev[p->ev_s], c->ev[p->f_x_ev], &good), back = 0;
			if (p->f_lag_s_ns != 0 && p->f_xp_ev >= 0)
				back = signed_ns(c->ev[p->f_xp_ev], c->ev[p->ev_s], &good);
			else if (p->f_lag_s_ns != 0)
				good = 0;
			e = good ? (x > e ? x : e) + (back > 0 ? back : 0) : -1;
			off = -1;
		}
	}
	/* A launch sample of the burst has run by now (F has): read it, for what it says
	 * of the GPU waiting inside the burst (f_gap below). */
	pace_sample_settle();
	int f_gap = charge_kernel && (atomic_load(&p->gap_seq) == p->f_seq || atomic_load(&p->gap_seq_before) == p->f_seq);
	/* The GPU's lag at S where known (one stream: X's span may begin before S), and
	 * the host time after it in which the burst's samples show its queue held work. */
	int one_stream = p->f_x_stream == 0;
	int64_t lag_s = one_stream && p->f_lag_s_sure && p->f_lag_s_ns > 0 ? p->f_lag_s_ns : 0;
	int64_t busy = one_stream ? burst_busy(p, lag_s) : 0;
	double excess = pace_samples_excess(), ratio = pace_samples_signed();
	pthread_mutex_unlock(&pace_ev_mu);
	int64_t lag = e >= 0 && p->f_lag_s_ns >= 0 ? p->f_lag_s_ns + e - p->f_host_ns : -1;
	if (off > 0 || (off < 0 && excess >= 0 &&
			atomic_load(&pace_est_samples[0]) + atomic_load(&pace_est_samples[1]) >= EST_WINDOW &&
			e > p->f_charged + p->f_charged / 10 + 100000))
		pace_saw_other();
	/* Where the context's turns were probed, another context's turns inside the burst
	 * are known: they explain its overrun, up to all of it, and nothing is guessed. They
	 * never make a burst give back: on an H200, bursts of cuBLAS matmuls beside three
	 * other tenants read shorter than their launch samples once the probed turns were
	 * taken out (a context switch's save and restore count as off the GPU), the
	 * estimate followed them down to 12 % under the samples, and the tenants, charged
	 * too little, spilled out of their slots (20-23 % at 25 %, against 23.8 before). */
	int64_t sliced = 0;
	if (off > 0) {
		/* What the burst ran of its own is not below its charge, unless its launch
		 * samples (probed too) say the estimate runs over them. */
		int64_t floor = ratio < 0 ? (int64_t)((double)p->f_charged * (1 + ratio)) : p->f_charged;
		int64_t own = e - off < floor ? (floor < e ? floor : e) : e - off;
		sliced = e - own;
		e = own;
		PSTAT_ADD(sliced_ns, sliced);
	}
	if (lag < -1)
		lag = 0; /* the clocks of host and GPU differ by a little */
	if (p->chained) {
		/* The open burst began at F: F's event is its S now, and F's lag is S's. */
		int t = p->ev_s;
		p->ev_s = p->ev_f;
		p->ev_f = t;
		p->lag_s_ns = lag;
		p->lag_s_sure = p->f_lag_s_sure && p->f_x_stream == 0 && !p->f_other;
	}
	int64_t est = pace_est_longest();
	int64_t min_lag = 100000 + 2 * est;
	/* A queue many kernels deep at F, or one the GPU was behind on for longer than
	 * the host took to issue the burst; and most of S→F after the host's last launch
	 * (a burst whose host paused, a program sleeping or serving no request, with the
	 * stream idle, ends with its queue full of the launches after the pause: its S→F
	 * is mostly the pause). With the charge line, never a burst in which a launch
	 * sample found its stream idle (f_gap): the queue at F says how the burst ended,
	 * not how it went. An attention training step issues its forward pass's short
	 * kernels slower than the GPU runs them and ends with long kernels queued: S→F
	 * held the forward's idle gaps, the lag at F (the long kernels) passed for a full
	 * queue, and the gaps were owed and moved the gain up (the fake driver's step of
	 * 40 host-paced 20 us kernels and one of 1 ms: gain 1.116, 43.2 % at cap 50; on
	 * an H200, attention 44.4 % by its rate at cap 50 and 88.9 % of its solo rate at
	 * cap 80, which it needs 81 % of). */
	int back_to_back = !f_gap && lag >= 0 && (lag >= p->f_host_ns || (lag >= min_lag && 2 * lag >= e));
	/* Another process of the container launched during the burst: its work ran
	 * between this one's on the GPU, inside this burst's elapsed time. */
	int alone = p->f_all - p->f_charged <= p->f_charged / 20;
	/* Any other burst's GPU time is at least S->F less the host's time outside the
	 * program's waits for its work: the GPU idles inside a burst only once it has run
	 * all that was launched, and a wait (a synchronize, a synchronous copy) lasts
	 * until then, so the idle spells lie in the host's time between waits (less a
	 * wake-up's SYNC_WAKE_NS per wait, when the GPU is done and the host not yet
	 * back). A burst over its charge by that bound owes what it surely ran over: a
	 * program that synchronizes every few launches (its bursts run through the
	 * waits where the charge line is off, and every queue drains at a wait) had its
	 * bursts read not back to back, their overruns let go, and its launches charged
	 * too little ran on (the fake driver's 20 us and 1 ms kernels at 7:1, a
	 * synchronize every 40 launches: 84 % at cap 30, 99 % at cap 50). The idle
	 * spells also lie after the GPU reached S (the lag at S, where it is a floor) and
	 * outside the spans in which the burst's launch samples found its queue holding
	 * work (burst_busy): a chained burst whose host took about as long as its GPU (a
	 * slow host; the hook waiting for a sample behind a deep queue) was otherwise
	 * read as all host time, owed nothing, and the next chained on (the fake's
	 * handle-less 20 us / 1 ms launches with a host at the GPU's pace, 64-71 % at
	 * cap 30; 44-49 % with the spans, 31-34 % since samples fly side by side). The
	 * bound is no measure of the launches: it moves no estimate and no gain. */
	int64_t waited = p->f_sync_ns - lag_s > busy ? p->f_sync_ns - lag_s : busy;
	int64_t idle_most = p->f_host_ns - lag_s - waited + p->f_syncs * SYNC_WAKE_NS;
	int64_t surely = e >= 0 && !back_to_back ? e - (idle_most < p->f_host_ns ? idle_most : p->f_host_ns) : -1;
	int bounded = surely > p->f_charged && alone && !p->f_other;
	if (bounded) {
		e = surely;
		PSTAT_ADD(bounded, 1);
	}
	if (e < 0 || p->f_charged <= 0 || p->f_other || (e > p->f_charged && !(back_to_back && alone) && !bounded)) {
		PSTAT_ADD(bursts_skipped, 1);
		tessera_log(TESSERA_LOG_DEBUG,
			    "pacing burst not counted gpu_ns=%lld charged_ns=%lld host_ns=%lld lag_ns=%lld alone=%d gap=%d",
			    (long long)e, (long long)p->f_charged, (long long)p->f_host_ns, (long long)lag, alone, f_gap);
		return 0;
	}
	/* Another context's turns on a time-sliced GPU run inside a burst's elapsed time
	 * where the two containers' work meets, and the events of each bill them to both.
	 * What the burst ran over its charge beyond what its launch samples explain (their
	 * excess over the estimate) is taken for that, and neither owed nor read as
	 * launches charged too little: all of it for a burst that began at its slot's
	 * refill (what such a burst runs past its slot's end is given up below, whoever's
	 * work it was) or one in which the probes saw another context's turns, up to one
	 * time slice for any other. The rest is owed: all of it while the samples say the
	 * launches changed (a sample set aside). */
	if (off < 0 && excess >= 0 && e > p->f_charged) {
		int64_t explained = (int64_t)(excess * (double)p->f_charged);
		sliced = e - p->f_charged - explained;
		/* Unless the probes saw another context's turns since the burst began (a
		 * late probe), where the burst went uncovered only because its probes
		 * paused between its launches (their coverage starts again after a gap): a
		 * launch-bound loop beside a long-kernel tenant at 70 on the fake's
		 * time-sliced GPU owed 20-35 ms a burst so, and got 15.4-22.6 % at cap 30
		 * where time slicing gives it 21.5-22.6 unhooked; 20.3-22.3 now. */
		int seen = tessera_residency_late_seen_ns() >= p->f_at_ns - p->f_host_ns;
		if (!p->f_at_refill && !seen && sliced > TIME_SLICE_NS)
			sliced = TIME_SLICE_NS;
		if (sliced < 0)
			sliced = 0;
		/* Unseen turns, or the program's own long kernels that no sample met: the
		 * probes will tell (pace_measure.c, pace_unexplained). */
		if (sliced > 100000 + 2 * est)
			pace_saw_unexplained();
		/* With the charge line bursts end at every synchronize, several a period: a
		 * time slice a burst would let a program that synchronizes often run over
		 * its charge unowed, so those bursts share one time slice a period (but for
		 * those in which another context's turns were seen, above). */
		if (charge_kernel && !p->f_at_refill && !seen) {
			if (p->forgive_k != s->refill_k) {
				p->forgive_k = s->refill_k;
				p->forgiven_ns = 0;
			}
			int64_t room = TIME_SLICE_NS - p->forgiven_ns;
			if (sliced > room)
				sliced = room > 0 ? room : 0;
			p->forgiven_ns += sliced;
		}
		e -= sliced;
		PSTAT_ADD(sliced_ns, sliced);
	}
	/* A burst that ran under its charge gives the difference back, whether or not it
	 * ran back to back: nothing makes its elapsed time shorter than its GPU time. */
	double r = (double)e / (double)p->f_charged;
	int64_t over = (int64_t)((r - 1) * (double)p->f_charged);
	if (over > 50 * TESSERA_PACING_PERIOD_NS)
		over = 50 * TESSERA_PACING_PERIOD_NS;
	if (over < -p->slot_len_ns)
		over = -p->slot_len_ns;
	/* A burst that owes was charged less than it ran, so its tokens lasted while it
	 * ran, and a refill that found them left kept one period's allowance of the
	 * several that had passed: the allowance so dropped was spent on what the burst
	 * now owes, and is set against it. Without this the class model's program mixing
	 * 20 us and 1 ms kernels with a synchronize every 40 launches got 68-74 % at cap
	 * 80 over 4 s, and once long bursts were chained, the kernel model's 20 us and
	 * 1 ms kernels at random 75.6-77.8 % (its chained bursts dropped 90-210 ms over
	 * 4 s); 79.0-80.0 now. Only a counted burst gets it: one whose host idled inside
	 * it is not owed, and what the refills dropped meanwhile was not spent. */
	if (over > 0) {
		int64_t credit = p->f_dropped_ns < over ? p->f_dropped_ns : over;
		over -= credit;
		PSTAT_ADD(credited_ns, credit);
	}
	if (over > 0)
		atomic_fetch_sub(&s->tokens, over);
	/* A burst that began at its slot's refill and ran past the slot's end ran into the
	 * next container's slot (or kept a slot of free time from the next refill). What
	 * it ran past, beyond 50 us and two launches (the last launch may take the tokens
	 * below zero, which is owed already, and a time-sliced GPU runs the next
	 * container's work in turns with it, about as long again) and beyond what it
	 * owes for its overrun, is
	 * given up from the next allowance (less half of another container's turns in
	 * it, up to 1 ms). Each container thus pays for the time its slot bursts spill
	 * out of their slots, whether its own launches or another's turns made them
	 * spill: the load of two saturating containers whose turns meet drops until their
	 * bursts fit their slots again, where a time-sliced GPU runs each alone (two busy
	 * contexts in turns lose about 8 % of the GPU to the switches on an H200). A slot
	 * burst that met more than 0.5 ms and one launch of another's turns also opens a
	 * gap of SLOT_GAP_NS at the end of the container's slots for a while. */
	int64_t forfeit = 0;
	if (p->f_at_refill) {
		/* Counted from the refill point whenever its host woke for it: a host that
		 * woke late (descheduled, a loaded machine) delays this burst alone, and the
		 * next begins on time. So the spill is the burst's S→F beyond the slot's
		 * length, or beyond its charge where that is longer: tokens that earlier
		 * bursts gave back (charged more than they ran) were paid for, and a burst
		 * that ran them past its slot's end paid in its charge for that much (a
		 * program of kernels of very different lengths has bursts over and under
		 * their charge by turns: forfeiting what its give-backs paid for took the
		 * fake driver's 20 us / 1 ms program to 75-76 % at cap 80). */
		int64_t room = p->f_charged > p->slot_len_ns ? p->f_charged : p->slot_len_ns;
		int64_t spill = e + sliced - room;
		int64_t turns = sliced / 2 < TIME_SLICE_NS / 2 ? sliced / 2 : TIME_SLICE_NS / 2;
		/* A burst in which a launch sample found the GPU waiting for the host (f_gap)
		 * and whose other container's turns the probes saw is host-paced: it ran
		 * beside the other's work rather than spilling into it, and is let off all
		 * of those turns. On the fake driver with 160 us switches, host-paced steps
		 * of 20 us and 1 ms kernels at 30 / 70 forfeited a third of the 30 % tenant's
		 * allowance (20.7 % of the GPU; 27.6-28.9 now, the 70 % one 59.6-62.0 against
		 * 63.3 before); back-to-back bursts keep the rule above, which settles
		 * saturating pairs into their slots (the GPU suite's 30 / 70 pairs on an H100:
		 * 28.6 / 68.7 and 28.7 / 68.6 with this, 28.6 / 68.8 and 28.7 / 68.5 without). */
		if (f_gap && off > 0)
			turns = sliced;
		forfeit = spill - (50000 + 2 * est) - (over > 0 ? over : 0) - turns;
#ifdef TESSERA_NO_SPILL_FORFEIT
		/* A diagnostic build: slot bursts forfeit nothing (docs/cuda-hook.md, Known
		 * gaps: what the rule costs a pair of prefill + decode steps). */
		forfeit = 0;
#endif
		if (forfeit_frequent(p, forfeit > 0, tessera_now_ns()))
			forfeit -= sliced - turns; /* let off all of the others' turns */
		if (forfeit > 50 * TESSERA_PACING_PERIOD_NS)
			forfeit = 50 * TESSERA_PACING_PERIOD_NS;
		if (forfeit < 0)
			forfeit = 0;
		atomic_fetch_sub(&s->tokens, forfeit);
		PSTAT_ADD(forfeit_ns, forfeit);
		if (sliced > 500000 + est)
			atomic_store_explicit(&met_until_ns, tessera_now_ns() + MET_HOLD_NS, memory_order_relaxed);
	}
	PSTAT_ADD(bursts, 1);
	if (over > 0)
		PSTAT_ADD(owed_ns, over);
	else
		PSTAT_ADD(returned_ns, -over);
	/* The burst's launches were charged r times too little: so is the estimate (once
	 * it is past its first samples, whose bursts hold launches charged nothing). Half
	 * the way there, so that samples and bursts settle together; or, where the burst
	 * ran under half its charge and the samples agree, from scratch. A burst that held
	 * the GPU's turn throughout ran with no other context on the GPU, so S->F bounds
	 * its own GPU time: an estimate above it comes down all the way at once, however
	 * few samples it rests on (the first samples of two containers that start
	 * together, before they take turns, are cut by each other's time slices: 20 ms
	 * kernels were charged 37 ms and left the GPU idle between turns for a second). */
	if (r < 0.5) {
		pthread_mutex_lock(&pace_ev_mu);
		pace_restart_if_changed();
		pthread_mutex_unlock(&pace_ev_mu);
		r = 0.5;
	}
	if (r > 2)
		r = 2;
	int alone_down = p->f_turn && r < 1;
	double f = alone_down ? r : 1 + (r - 1) / 2;
	for (int cls = 0; cls < 2 && !bounded; cls++) {
		if (charge_kernel && !(p->f_classes & (1 << cls)))
			continue; /* as the gains below */
		int64_t est_c = atomic_load(&pace_est_ns[cls]);
		int64_t scaled = (int64_t)((double)est_c * f);
		if (est_c > 0 && scaled > 0 && scaled <= MAX_EST_NS && (atomic_load(&pace_est_samples[cls]) >= EST_WINDOW || alone_down))
			atomic_store(&pace_est_ns[cls], scaled);
	}
	/* The per-kernel entries through their class's gain, as the class estimates; only
	 * by bursts whose every launch was charged a settled entry (a program's first
	 * bursts charge its kernels their class's estimate, or entries on a sample or
	 * two, and ran well under or over their charge whatever the entries), and that
	 * the GPU ran back to back with no other context's turns seen in them (or held
	 * the GPU's turn throughout). Any other burst's S->F spans its host's pauses or
	 * another's turns, and the bursts that read under their charge all the same are
	 * the few whose launches were charged ahead (a thread takes tokens for several
	 * launches at a time): on an H200 an attention step's first two bursts read
	 * 0.73 and 0.69 of their charge, no later one was counted, and the gain stayed
	 * at 0.73 with entries within 1 % of the profiler's kernel times (cap 25 gave
	 * 30-32 %). The samples measure each kernel; the gain is for what they read
	 * beside it (events, overlap of two streams), which back-to-back bursts show. */
	int clean = (alone_down || (back_to_back && alone && off <= 0)) &&
		    p->f_launches >= GAIN_MIN_LAUNCHES;
	for (int cls = 0; cls < 2 && charge_kernel && !p->f_class && clean; cls++) {
		/* Only the gains of the classes the burst launched: what it read says nothing
		 * of the others (on an H200 a graph-free attention step's bursts that held
		 * the GPU's turn took its graph gain to 0.370). */
		if (!(p->f_classes & (1 << cls)))
			continue;
		int64_t g = (int64_t)((double)atomic_load(&pace_kt_gain[cls]) * f);
		g = g < KT_GAIN_ONE / 16 ? KT_GAIN_ONE / 16 : g > 4 * KT_GAIN_ONE ? 4 * KT_GAIN_ONE : g;
		if (atomic_load(&pace_est_samples[cls]) >= EST_WINDOW || alone_down) {
			atomic_store(&pace_kt_gain[cls], g);
			gain_moved_ns = tessera_now_ns();
		}
	}
	tessera_log(TESSERA_LOG_DEBUG,
		    "pacing burst gpu_ns=%lld charged_ns=%lld host_ns=%lld lag_ns=%lld owed_ns=%lld sliced_ns=%lld "
		    "forfeit_ns=%lld slot=%d excess=%.3f",
		    (long long)e + sliced, (long long)p->f_charged, (long long)p->f_host_ns, (long long)lag, (long long)over,
		    (long long)sliced, (long long)forfeit, p->f_at_refill, excess);
	return over < 0 ? -over : 0;
}

/* (pace_measure.h) Called by the launching thread after a sampled launch, under
 * pace_ev_mu (which begin_burst and end_burst hold where they change the burst's
 * number and S). A sample on another stream than the burst's, or in a burst of two,
 * says nothing of the GPU: the other stream's work may have kept it busy. Its start
 * event, if it had run when the launch returned, found the stream idle; else the
 * sample tells once read (pace_sample_settle), in a burst whose S was recorded on a
 * drained stream, and the same events (c) as the sample's. */
int pace_burst_sample(struct tessera_pacer *p, CUstream stream, struct ctx_events *c, int idle, int64_t t_start_ns,
		      CUevent *s, uint64_t *seq, int64_t *host_ns)
{
	if (!charge_kernel || p == NULL ||
	    atomic_load_explicit(&p->burst_stream_tag, memory_order_relaxed) != (uintptr_t)stream + 1 ||
	    atomic_load_explicit(&p->other_stream, memory_order_relaxed) != 0)
		return 0;
	if (idle) {
		pace_burst_gap(p, p->burst_seq);
		return 0;
	}
	if (!p->burst_started || p->burst_ctx != c || p->burst_ctx_gen != c->gen)
		return 0;
	*s = c->ev[p->open_s_ev];
	*seq = p->burst_seq;
	*host_ns = t_start_ns - p->burst_t0_ns;
	return p->burst_fresh ? 1 : 2;
}

/* A sample of a burst before the ended one (samples in flight may be read bursts
 * later): no burst to settle reads it, and kept, it would take the place of one. */
static int burst_gone(const struct tessera_pacer *p, uint64_t seq)
{
	return seq + 1 < p->burst_seq;
}

void pace_burst_gap(struct tessera_pacer *p, uint64_t seq)
{
	if (burst_gone(p, seq))
		return;
	uint64_t last = atomic_load_explicit(&p->gap_seq, memory_order_relaxed);
	if (last != seq && atomic_load_explicit(&p->gap_seq_before, memory_order_relaxed) != seq) {
		atomic_store_explicit(&p->gap_seq_before, last, memory_order_relaxed);
		atomic_store_explicit(&p->gap_seq, seq, memory_order_relaxed);
	}
}

/* (pace_measure.h) The spans of one burst come in the order of its samples, which is
 * the order of their launches and of their start events (one stream; the samples are
 * read oldest first, pace_sample_settle). One that starts inside the last joins it
 * (they meet whatever the lag at S); out of order (two threads' launches on the
 * stream), a span is clipped to the one before it or joins it, so the sum never grows;
 * past BUSY_SPANS the rest are not kept (the bound is then looser). */
void pace_burst_busy(struct tessera_pacer *p, uint64_t seq, int64_t host_ns, int64_t g)
{
	if (burst_gone(p, seq))
		return;
	int i = (int)(seq & 1);
	if (p->busy[i].seq != seq) {
		p->busy[i].seq = seq;
		p->busy[i].n = 0;
	}
	int n = p->busy[i].n;
	if (n > 0 && host_ns <= p->busy[i].g[n - 1]) {
		if (g > p->busy[i].g[n - 1])
			p->busy[i].g[n - 1] = g;
	} else if (n < BUSY_SPANS) {
		p->busy[i].a[n] = host_ns;
		p->busy[i].g[n] = g;
		p->busy[i].n = n + 1;
	}
}

/* (pace.h) */
int pace_burst_fence(struct tessera_pacer *p, CUevent *f)
{
	struct ctx_events *c = p->burst_ctx;
	pthread_mutex_lock(&pace_ev_mu);
	int ok = c->gen == p->burst_ctx_gen && c->ctx != NULL;
	*f = c->ev[p->ev_f];
	pthread_mutex_unlock(&pace_ev_mu);
	return ok;
}

/* The ended burst is read (waiting for its F where wait is set) before the refill, so
 * that what it owes is taken from what the refill brings, and what it gives back is
 * added after, where the cap does not swallow it (caller holds s->mu). *now is moved
 * on past the read; returns the next refill point. */
static int64_t settle_and_refill(struct tessera_pacer *p, int wait, int64_t *now)
{
	int64_t give = 0;
	if (p->fence_pending) {
		give = settle_burst(p, wait);
		*now = tessera_now_ns();
	}
	int64_t wake = refill(p, *now);
	if (give > 0)
		atomic_fetch_add(&p->s->tokens, give);
	return wake;
}

/* The tokens are spent: wait (asleep, without the lock, so that every launching
 * thread of the container gets its turn) for a refill, and charge this launch.
 * Returns 1 where it slept, with SLOW_OPENED where the launch opened a burst. */
#define SLOW_OPENED 2
static int slow_path(struct tessera_pacer *p, CUstream stream, int64_t cost)
{
	struct tessera_shared_pacer *s = p->s;
	int slept = 0;
	for (;;) {
		if (pacer_lock(s) != 0)
			return 0; /* cannot happen with a robust mutex made consistent; do not block */
		/* Work captured into a graph does not run now (its graph launch is paced), and
		 * an event call could join the capture. */
		if (capturing(stream)) {
			pthread_mutex_unlock(&s->mu);
			return 0;
		}
		int64_t now = tessera_now_ns();
		pacer_check(s, now);
		if (p->share_dynamic && now - atomic_load(&p->share_read_ns) >= TESSERA_SHARE_REREAD_NS) {
			share_apply(p, now);
			if (!p->enabled) {
				/* Nothing is reserved on the GPU any more: not paced. What was open
				 * is dropped; a burst begins afresh once the share falls again. */
				p->burst_started = p->fence_pending = p->slept = 0;
				atomic_store(&p->burst_stream_tag, 0);
				pthread_mutex_lock(&pace_ev_mu);
				burst_unprobe(p);
				pthread_mutex_unlock(&pace_ev_mu);
				pthread_mutex_unlock(&s->mu);
				return slept;
			}
		}
		if (slept)
			p->slept = 1;
		int64_t r0 = s->refill_k;
		int64_t wake = settle_and_refill(p, p->slept, &now);
		int refilled = s->refill_k != r0;
		if (p->slept && p->burst_started) {
			/* A chained burst that could not end before the wait: it spans the wait,
			 * when the GPU idled, and is not measured. */
			p->burst_started = 0;
			atomic_store(&p->burst_stream_tag, 0);
			pthread_mutex_lock(&pace_ev_mu);
			burst_unprobe(p);
			pthread_mutex_unlock(&pace_ev_mu);
		}
		if (atomic_load(&s->tokens) > 0) {
			/* A burst on a GPU whose containers take turns begins with the turn: taken
			 * here if free, else waited for without the lock (and the burst, begun
			 * late, is not its slot's). */
			if (!p->turn_held && !p->burst_started && pace_turn_use(p, now)) {
				if (!pace_turn_try(p)) {
					pthread_mutex_unlock(&s->mu);
					pace_turn_wait(p);
					continue;
				}
				pace_turn_took(p, now);
			}
			if (p->burst_started && refilled && !p->fence_pending) {
				if (p->turn_held && pace_turn_wanted(p, now)) {
					/* Another container waits for the turn: the burst ends here
					 * rather than going on with this refill. */
					end_burst(p, stream, 0);
					pthread_mutex_unlock(&s->mu);
					pace_turn_finish(p);
					continue;
				}
				end_burst(p, stream, 1);
			}
			int64_t charged0 = atomic_fetch_add(&charged_ns, cost);
			int64_t all0 = atomic_fetch_add(&s->charged, cost);
			atomic_fetch_sub(&s->tokens, cost);
			int began = !p->burst_started && !p->fence_pending;
			if (began)
				begin_burst(p, stream, charged0, all0, refilled && p->slept);
			p->slept = 0;
			pthread_mutex_unlock(&s->mu);
			return slept | (began ? SLOW_OPENED : 0);
		}
		if (p->work_conserving && !pace_others_have_work() && !(p->turn_held && pace_turn_wanted(p, now))) {
			/* Work-conserving, and no other context has had work on the GPU for
			 * CONTENDED_NS: the container takes the idle time, a slot's allowance at a
			 * time, without waiting for a refill. Each allowance is a burst of its own,
			 * with the context's turns probed, so that another context's first turn
			 * ends this; and the one before must have run first, so that no more than
			 * two allowances are queued when it ends (all that is queued then runs in
			 * the other's slots too: the fake driver's 70 % tenant got 61 % where
			 * its first periods met a queue this had not bounded). */
			if (p->fence_pending)
				settle_burst(p, 1);
			if (p->burst_started && !p->fence_pending)
				end_burst(p, stream, 1);
			burst_probe(p);
			int64_t t = atomic_load(&s->tokens);
			atomic_fetch_add(&s->tokens, p->slot_len_ns - t);
			PSTAT_ADD(conserved, 1);
			pthread_mutex_unlock(&s->mu);
			continue;
		}
		if (p->burst_started && !p->fence_pending)
			end_burst(p, stream, 0);
		pthread_mutex_unlock(&s->mu);
		if (p->turn_held)
			pace_turn_finish(p);
		PSTAT_ADD(holds, 1);
		PSTAT_ADD(held_ns, wake > now ? wake - now : 0);
		pace_sleep_until(wake);
		slept = 1;
	}
}

/* The open burst has gone on for LONG_BURST_NS: it ends here and the next begins at
 * its F (takes s->mu). */
static void chain_long_burst(struct tessera_pacer *p, CUstream stream)
{
	struct tessera_shared_pacer *s = p->s;
	int64_t now = tessera_now_ns();
	atomic_store_explicit(&p->chain_at_ns, now + TESSERA_PACING_PERIOD_NS / 20, memory_order_relaxed);
	if (capturing(stream) || pacer_lock(s) != 0)
		return;
	now = tessera_now_ns();
	if (p->burst_started && now - p->burst_t0_ns >= LONG_BURST_NS && !(p->turn_held && pace_turn_wanted(p, now))) {
		/* The burst before is read first (without waiting: one F is read at a time,
		 * and a queue as deep as the burst's host time has not run it yet). */
		settle_and_refill(p, 0, &now);
		if (!p->fence_pending) {
			end_burst(p, stream, 1);
			PSTAT_ADD(long_chains, 1);
		}
	}
	pthread_mutex_unlock(&s->mu);
}

/* The credit this thread took ahead from s was charged and not launched: it goes back
 * to the tokens and out of the charges (caller holds s->mu). */
static void return_credit(struct tessera_shared_pacer *s)
{
	if (local_pacer != s)
		return;
	if (local_left > 0) {
		atomic_fetch_add(&s->tokens, local_left);
		atomic_fetch_sub(&charged_ns, local_left);
		atomic_fetch_sub(&s->charged, local_left);
	}
	local_left = 0;
	local_pacer = NULL;
}

/* The program's wait (wait set) or a query that found its work done: with the charge
 * line the open burst ends here; a burst that goes on through a wait (without the
 * charge line, or where the last burst's F is not read yet) counts the wait's time
 * (settle_burst: the GPU did not idle in it), until tessera_pacing_synced. */
static int sync_begin(int wait)
{
	int g = pacing_only;
	if (!pacing_any || (!charge_kernel && !wait))
		return -1;
	if (g < 0 && tessera_current_gpu(&g) != CUDA_SUCCESS)
		return -1;
	struct tessera_pacer *p = &pacers[g];
	struct tessera_shared_pacer *s = p->s;
	if (!atomic_load_explicit(&p->enabled, memory_order_relaxed) || pacer_lock(s) != 0)
		return -1;
	int ended = -1;
	if (charge_kernel) {
		/* The thread takes 16 launches' worth at a time, and the program may not
		 * launch again for a while. */
		return_credit(s);
		if (p->burst_started && !p->fence_pending && !capturing(p->burst_stream)) {
			end_burst(p, p->burst_stream, 0);
			PSTAT_ADD(sync_ends, 1);
			ended = p->fence_pending ? g : -1;
		}
	}
	if (wait && p->burst_started && !sync_counted) {
		if (p->sync_depth++ == 0)
			p->sync_t0 = tessera_now_ns();
		sync_counted = g + 1;
	}
	pthread_mutex_unlock(&s->mu);
	return ended;
}

/* (pacing.h) The program waits for its work: with per-kernel charges, the open burst
 * ends here. A burst's charge is its S->F elapsed time, and a burst that spans a
 * synchronize spans the GPU idling from the moment its queue drains until the host's
 * next launch starts (the synchronize's wake-up, the launch latency on an idle queue,
 * the host's own work between steps): billed as GPU time, that idle time held a
 * program that synchronizes often under its cap (on the fake driver, kernels of two
 * streams joined every 40 launches, with 30 us of launch latency: 44.1 % at cap 50).
 * Ended at the synchronize, the burst is the work queued before it, which the GPU runs
 * back to back when the host queued it ahead, so the burst says what its launches
 * took; its next launch opens the next burst (tessera_pacing_synced). Without the
 * charge line a burst goes on through the wait, which sync_begin counts in it. */
int tessera_pacing_sync(void)
{
	return sync_begin(1);
}

/* This thread's wait, counted in a burst by sync_begin, is over. */
static void sync_end(void)
{
	struct tessera_pacer *p = &pacers[sync_counted - 1];
	sync_counted = 0;
	if (pacer_lock(p->s) != 0)
		return;
	if (p->sync_depth > 0 && --p->sync_depth == 0 && p->burst_started) {
		sync_count(p, tessera_now_ns());
		p->burst_syncs++;
	}
	pthread_mutex_unlock(&p->s->mu);
}

/* (pacing.h) After the program's wait: the burst that ended before it is read where F
 * has run (what it owes or gives back settles now), and the program's next launch
 * opens the next burst (reopen_burst), so that what it launches between two
 * synchronizes is measured too, not charged its estimates alone until the next
 * refill (a decode loop synchronizes every token: its launches after the first
 * synchronize of a slot would go unmeasured). */
void tessera_pacing_synced(int g)
{
	if (sync_counted)
		sync_end();
	if (g < 0)
		return;
	struct tessera_pacer *p = &pacers[g];
	struct tessera_shared_pacer *s = p->s;
	if (pacer_lock(s) != 0)
		return;
	if (p->fence_pending) {
		int64_t give = settle_burst(p, 0);
		if (give > 0)
			atomic_fetch_add(&s->tokens, give);
	}
	if (!p->fence_pending && !p->burst_started)
		atomic_store_explicit(&p->reopen, 1, memory_order_relaxed);
	pthread_mutex_unlock(&s->mu);
}

/* (pacing.h) A query found work of the program done (launch.c): the open burst ends
 * as at a synchronize, and one that ended before (at an earlier query of the same
 * wait: a program that polls one event per stream ends the burst at the first and
 * finds it ended at the second) is read where it has run, so that the next launch
 * opens the next burst. Never waits. */
void tessera_pacing_polled(void)
{
	int g = sync_begin(0);
	if (g < 0 && pacing_any && charge_kernel) {
		g = pacing_only;
		if (g < 0 && tessera_current_gpu(&g) != CUDA_SUCCESS)
			return;
		if (!atomic_load_explicit(&pacers[g].enabled, memory_order_relaxed) || !pacers[g].fence_pending)
			return;
	}
	tessera_pacing_synced(g);
}

/* The first launch after a synchronize opens a burst, charged as the slow path charges
 * (under the lock); 0 where it cannot (no tokens: the slow path waits for the refill,
 * which opens one; the GPU's turn not held where the node has turns; a burst open). */
static int reopen_burst(struct tessera_pacer *p, CUstream stream, int64_t cost)
{
	struct tessera_shared_pacer *s = p->s;
	atomic_store_explicit(&p->reopen, 0, memory_order_relaxed);
	if (pacer_lock(s) != 0)
		return 0;
	int64_t now = tessera_now_ns();
	int done = 0;
	if (!p->burst_started && !p->fence_pending && !capturing(stream) && atomic_load(&s->tokens) > cost &&
	    (p->turn_held || !pace_turn_use(p, now))) {
		return_credit(s);
		int64_t charged0 = atomic_fetch_add(&charged_ns, cost);
		int64_t all0 = atomic_fetch_add(&s->charged, cost);
		atomic_fetch_sub(&s->tokens, cost);
		begin_burst(p, stream, charged0, all0, 0);
		PSTAT_ADD(reopens, 1);
		done = 1;
	}
	pthread_mutex_unlock(&s->mu);
	return done;
}

void tessera_pace(CUstream stream, int cls, uintptr_t key, struct tessera_pace_ticket *t)
{
	t->sampled = 0;
	t->waited = 0;
	t->opened = 0;
	int g = pacing_only;
	if (!pacing_any)
		return;
	if (g < 0 && tessera_current_gpu(&g) != CUDA_SUCCESS)
		return; /* the launch itself will report the problem */
	struct tessera_pacer *p = &pacers[g];
	struct tessera_shared_pacer *s = p->s;
	if (!atomic_load_explicit(&p->enabled, memory_order_relaxed)) {
		/* Not paced; a container without cores checks its share file every
		 * TESSERA_SHARE_REREAD_NS (the coarse clock: a few ns, no system call). */
		if (!p->share_dynamic)
			return;
		int64_t coarse = tessera_coarse_ns();
		if (coarse - atomic_load_explicit(&p->share_read_ns, memory_order_relaxed) < TESSERA_SHARE_REREAD_NS ||
		    pacer_lock(s) != 0)
			return;
		int64_t now = tessera_now_ns();
		if (now - atomic_load(&p->share_read_ns) >= TESSERA_SHARE_REREAD_NS)
			share_apply(p, now);
		pthread_mutex_unlock(&s->mu);
		if (!p->enabled)
			return;
	}
	t->p = p;
	int64_t cost = -1;
	/* With the charge line, the launch's own estimate where its kernel has an entry
	 * (times its class's gain); an empty entry has the launch sampled, so that a
	 * kernel is charged its own time from its first sample. Without it, its class's. */
#ifdef TESSERA_PACE_TRACE
	tessera_trace_key_now = key;
#endif
	if (!charge_kernel)
		key = 0;
	if (key != 0) {
		uint64_t h = kt_hash(key);
		uint64_t w = atomic_load_explicit(&pace_kt_word[kt_index(h)], memory_order_relaxed);
		if ((w >> KT_NS_BITS) == kt_tag(h)) {
			cost = kt_charge(w, cls);
			/* An entry on its first samples: sampled again, launch after launch
			 * while one is free, until it rests on KT_WINDOW; and the burst says
			 * nothing of the gain. */
			if (!(w & KT_SETTLED)) {
				pace_sample_countdown = 1;
				if (!atomic_load_explicit(&p->class_charged, memory_order_relaxed))
					atomic_store_explicit(&p->class_charged, 1, memory_order_relaxed);
			}
		} else if (w == 0)
			pace_sample_countdown = 1;
	}
	if (cost < 0) {
		cost = atomic_load_explicit(&pace_est_ns[cls], memory_order_relaxed);
		if (charge_kernel && !atomic_load_explicit(&p->class_charged, memory_order_relaxed))
			atomic_store_explicit(&p->class_charged, 1, memory_order_relaxed);
	}
	trace_launch(tessera_trace_key_now, cls, cost);
	uintptr_t tag = atomic_load_explicit(&p->burst_stream_tag, memory_order_relaxed);
	if (tag != 0 && tag != (uintptr_t)stream + 1) {
		/* The first launch of the burst on another stream names it (a locked
		 * instruction once a burst); a third stream makes the burst one of many. */
		uintptr_t o = atomic_load_explicit(&p->other_stream, memory_order_relaxed);
		if (o == 0 && atomic_compare_exchange_strong(&p->other_stream, &o, (uintptr_t)stream + 1))
			;
		else if (charge_kernel && o != (uintptr_t)stream + 1 && o != TESSERA_OTHER_MANY)
			atomic_store_explicit(&p->other_stream, TESSERA_OTHER_MANY, memory_order_relaxed);
	}
	/* No locked instruction on most launches: after the driver has written a launch
	 * to the GPU's command buffer, one waits for those writes to drain (measured +40 ns
	 * per launch on an H200 host). A thread takes TAKE_EVERY launches' worth at a time
	 * while many are left, and spends them with thread-local subtractions. */
	if (charge_kernel && atomic_load_explicit(&p->reopen, memory_order_relaxed) && reopen_burst(p, stream, cost)) {
		t->opened = 1; /* charged, and the burst opened with this launch */
	} else if (local_pacer == s && local_left >= cost) {
		local_left -= cost;
	} else {
		int64_t have = local_pacer == s ? local_left : 0;
		int64_t tokens = atomic_load_explicit(&s->tokens, memory_order_relaxed);
		int plenty = tokens > 4 * TAKE_EVERY * cost;
		/* Every TAKE_EVERY launches while the tokens hold: the coarse clock, and an
		 * open burst that has gone on for long is chained (chain_long_burst). */
		if (plenty && tag != 0 && tessera_coarse_ns() >= atomic_load_explicit(&p->chain_at_ns, memory_order_relaxed))
			chain_long_burst(p, stream);
		int64_t take = plenty ? TAKE_EVERY * cost - have : cost - have;
		int64_t left = atomic_fetch_sub_explicit(&s->tokens, take, memory_order_relaxed);
		if (left > 0) {
			atomic_fetch_add_explicit(&charged_ns, take, memory_order_relaxed);
			atomic_fetch_add_explicit(&s->charged, take, memory_order_relaxed);
			local_left = have + take - cost;
			local_pacer = s;
		} else {
			/* With the charge line, the credit the thread held goes back with the
			 * take: it was charged and not launched, and a burst charged for it
			 * reads under its charge, which moved the per-kernel gain down (steps of
			 * 20 us kernels and a 1 ms one with a 10 us launch latency at cap 25 in
			 * the fake driver: gain 0.915 and 26.5 %, now 0.945 and 25.8 %). */
			if (!charge_kernel)
				have = 0; /* the class estimator gives it up: it was charged already */
			atomic_fetch_add_explicit(&s->tokens, take + have, memory_order_relaxed);
			if (have > 0) {
				atomic_fetch_sub_explicit(&charged_ns, have, memory_order_relaxed);
				atomic_fetch_sub_explicit(&s->charged, have, memory_order_relaxed);
			}
			local_left = 0;
			local_pacer = NULL;
			int w = slow_path(p, stream, cost);
			t->waited = w & 1;
			t->opened = (w & SLOW_OPENED) != 0;
		}
	}
	/* After any wait for a refill: the samples in flight have likely finished by then,
	 * and a launch that waited is sampled on a drained stream (pace_sample_settle). */
	/* With the charge line: the launch in its thread's tally, and its class in the
	 * burst it opened or went to (after the wait: a burst begun there starts with no
	 * class). */
	if (charge_kernel) {
		/* The thread's next launch after one that opened a burst is sampled (where
		 * no sample is in flight): a burst whose host falls behind the GPU from its
		 * start shows it there (pace_burst_sample). */
		if (t->opened && pace_sample_countdown > 2)
			pace_sample_countdown = 2;
		pace_tally_add(cost);
		if (!(atomic_load_explicit(&p->burst_classes, memory_order_relaxed) & (1 << cls)))
			atomic_fetch_or_explicit(&p->burst_classes, 1 << cls, memory_order_relaxed);
	}
	if (--pace_sample_countdown <= 0)
		pace_sample_due(t, cls, key, cost);
	if (t->sampled)
		pace_sample_start(stream, t);
}

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

/* A thread takes this many launches' worth of tokens at a time while the tokens hold
 * more than four times as many. */
#define TAKE_EVERY 16
/* One sample per this much estimated GPU time (a sample costs the host a few
 * microseconds: two event records, a query and an elapsed-time read). A diagnostic
 * build may set another (Makefile, HOOK_CFLAGS). */
#ifdef TESSERA_SAMPLE_EVERY_NS
#define SAMPLE_EVERY_NS TESSERA_SAMPLE_EVERY_NS
#else
#define SAMPLE_EVERY_NS 200000LL
#endif
#define SAMPLE_MAX_GAP 256
/* No estimate of one launch beyond this (ten periods): a sample that says more is
 * not a kernel's time. */
#define MAX_EST_NS (10 * TESSERA_PACING_PERIOD_NS)

/* ---- per-process measurement state -------------------------------------------- */

/* Estimated GPU ns per launch, per class (0: kernels, 1: graphs); 0 until measured.
 * The mean of the first EST_WINDOW samples, then a moving average over about as many. */
#define EST_WINDOW 32
static _Atomic int64_t est_ns[2];
static _Atomic int64_t est_samples[2]; /* samples taken so far */
static int rejected[2];                 /* samples set aside in a row (under ev_mu) */
static int met_rejected[2];             /* samples that met another context, in a row (under ev_mu) */
/* Per class (under ev_mu): the last RECENT samples, set aside or not, each with the
 * estimate it was read against, and when the last was read. */
#define RECENT 16
static struct {
	int64_t ns, est;
} recent[2][RECENT];
static int recent_n[2];
static int64_t last_at_ns[2];

/* Per-kernel estimates: a launch whose function (cuLaunchKernel's CUfunction) or
 * executable graph has an entry here is charged that entry's estimate, not its
 * class's. An attention step, a fused optimizer or an inference server mixes a few
 * kernels of milliseconds with many of microseconds; charged the class's mean, with
 * samples over 3x it set aside as another context's turns, its long kernels were
 * charged as short ones (on the H200 a flash-attention training step ran 87 % of its
 * rate at cap 25). Per function the lengths agree, so each entry is the mean of that
 * function's samples (the first KT_WINDOW, then a moving average over about as many)
 * and its 3x rule sets aside only what its own launches do not take.
 *
 * Direct-mapped: KT_SIZE entries indexed by a hash of the handle. What a launch reads
 * is one word, the entry's tag (24 bits of the hash, never 0) and its estimate (40
 * bits of ns), so a launch pays one relaxed load and a compare; the rest of an entry
 * is kept under ev_mu by the launch samples, which alone write the table. A function
 * whose entry another holds (a collision; the other sampled in the last KT_STALE_NS)
 * is charged its class's estimate; one whose entry is empty has its next launch
 * sampled, so that it is charged its own time from its first sample on. */
/* The limits file's charge line (limits.h), set at setup: per-kernel charges, their
 * gain and the measurement of bursts of two streams only with it; without it every
 * launch is charged its class's estimate (the class estimator), and a burst on more
 * than one stream is not measured. */
static int charge_kernel;

#define KT_BITS 9
#define KT_SIZE (1 << KT_BITS)
#define KT_NS_BITS 40
/* The estimate is the word's low 39 bits (549 s, far above MAX_EST_NS); bit 39 says it
 * rests on KT_WINDOW samples or more (settled). */
#define KT_SETTLED (1ULL << (KT_NS_BITS - 1))
#define KT_NS_MASK (KT_SETTLED - 1)
#define KT_WINDOW 8
#define KT_STALE_NS (10 * 1000000000LL)
static _Atomic uint64_t kt_word[KT_SIZE];
static struct {
	uintptr_t key;
	int cls;
	int rejected; /* samples set aside in a row */
	int64_t n;    /* samples taken */
	int64_t last_ns;
	int64_t win[KT_WINDOW]; /* the first KT_WINDOW samples */
} kt_meta[KT_SIZE];
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
#define KT_GAIN_SHIFT 16
#define KT_GAIN_ONE (1LL << KT_GAIN_SHIFT)
static _Atomic int64_t kt_gain[2] = {KT_GAIN_ONE, KT_GAIN_ONE};
static inline int64_t kt_charge(uint64_t w, int cls)
{
	return (int64_t)(((w & KT_NS_MASK) * (uint64_t)atomic_load_explicit(&kt_gain[cls], memory_order_relaxed)) >>
			 KT_GAIN_SHIFT);
}
/* The longest entry sampled in the last KT_STALE_NS (for est_longest), and when the
 * table was last scanned for it. */
static _Atomic int64_t kt_longest_ns;
static int64_t kt_scan_at_ns;

static inline uint64_t kt_hash(uintptr_t key)
{
	return (uint64_t)key * 0x9e3779b97f4a7c15ULL;
}
static inline unsigned kt_index(uint64_t h)
{
	return (unsigned)(h >> (64 - KT_BITS));
}
static inline uint64_t kt_tag(uint64_t h)
{
	return ((h >> 16) & 0xffffffULL) | 1;
}

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

/* What pacing did in this process, for the debug log at exit (all on slow paths). */
static struct {
	_Atomic int64_t samples[2], idle[2], idle_ns[2], busy_ns[2], set_aside, met, probed, off_ns;
	_Atomic int64_t waits, wait_syncs, holds, held_ns, restarts, conserved;
	_Atomic int64_t bursts, bursts_skipped, owed_ns, returned_ns, sliced_ns, forfeit_ns;
} pstat;
#define PSTAT_ADD(f, v) atomic_fetch_add_explicit(&pstat.f, (v), memory_order_relaxed)

/* Events of one context: 0-1 a launch sample, 2-3 a burst's start and end (which is
 * which changes as bursts chain: tessera_pacer.ev_s, ev_f). */
#define NCTX 4
struct ctx_events {
	CUcontext ctx;
	uint64_t gen; /* changes whenever the events are made anew or lost */
	CUevent ev[6];
};
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ctx_events evc[NCTX];
static uint64_t ev_gen;
static int evc_next;

/* The one launch sample in flight in this process. */
enum { SAMPLE_FREE, SAMPLE_CLAIMED, SAMPLE_FLYING };
static struct {
	_Atomic int state;
	struct ctx_events *c;
	uint64_t gen;
	int cls;
	uintptr_t key;       /* its function or executable graph (0: none, charged its class's) */
	int64_t host_gap_ns; /* the start event found the stream idle: host time before the kernel */
	int64_t launched_ns; /* when its launch was issued */
	int met;             /* its stream had drained, yet its start event waited: another context ran */
	int probed;          /* the context's turns on the GPU were probed for it (residency.c) */
#ifdef TESSERA_PACE_TRACE
	uintptr_t trace_key;
#endif
} smp;
/* Launch samples, and bursts, of launches estimated at least this long have the
 * context's turns on the GPU probed (residency.c) while they run: shorter ones are
 * seldom cut by a time slice, and a sample that is reads over 3x its estimate and is
 * set aside. */
#define PROBE_MIN_NS 200000LL
/* The longest launch estimated: the two classes' estimates and the longest
 * per-kernel entry in use. */
int64_t pace_est_longest(void)
{
	int64_t k = atomic_load(&est_ns[0]), g = atomic_load(&est_ns[1]), t = atomic_load(&kt_longest_ns);
	k = k > g ? k : g;
	return k > t ? k : t;
}

/* Rescans the table for its longest entry in use (caller holds ev_mu). */
static void kt_rescan(int64_t now)
{
	int64_t m = 0;
	for (int i = 0; i < KT_SIZE; i++)
		if (kt_meta[i].key != 0 && now - kt_meta[i].last_ns < KT_STALE_NS) {
			int64_t e = (int64_t)(atomic_load_explicit(&kt_word[i], memory_order_relaxed) & KT_NS_MASK);
			m = e > m ? e : m;
		}
	atomic_store(&kt_longest_ns, m);
	kt_scan_at_ns = now;
}

/* The entry of key: its slot, and its estimate (0 if it has none). */
static int64_t kt_lookup(uintptr_t key, int *slot)
{
	uint64_t h = kt_hash(key);
	*slot = (int)kt_index(h);
	uint64_t w = atomic_load_explicit(&kt_word[*slot], memory_order_relaxed);
	return (w >> KT_NS_BITS) == kt_tag(h) && kt_meta[*slot].key == key ? (int64_t)(w & KT_NS_MASK) : 0;
}

/* The entry of a kernel on its first n samples (n <= KT_WINDOW): their mean, without
 * those over 3x their lower median and 2 us. A kernel's first launch is often far
 * longer than the rest (on an H200, first samples of PyTorch kernels read 103 us for a
 * 0.75 us kernel, 643 us for a 49 us one: the code is loaded and the caches are
 * cold), and a kernel launched a few times a step is sampled only a few times in a
 * second: in the mean of its first samples, that one sample held the entry many times
 * over the kernel's length for seconds (launch-bound training steps at cap 25 ran 58-72 %
 * of their solo rate though they needed 13-26 % of the GPU). With two samples the
 * lower median is the smaller one. */
static int64_t kt_window_mean(const int64_t *w, int64_t n)
{
	int64_t v[KT_WINDOW];
	for (int64_t i = 0; i < n; i++) {
		int64_t x = w[i], j = i;
		for (; j > 0 && v[j - 1] > x; j--)
			v[j] = v[j - 1];
		v[j] = x;
	}
	int64_t lim = 3 * v[(n - 1) / 2] + 2000, sum = 0, k = 0;
	for (int64_t i = 0; i < n && v[i] <= lim; i++, k++)
		sum += v[i];
	return sum / k;
}

/* Folds a sample of ns into key's entry (caller holds ev_mu): the mean of its first
 * KT_WINDOW samples without the outliers (kt_window_mean), then a moving average; a
 * sample over 3x the entry is then set aside (it most likely holds another context's
 * time slice) unless three in a row say so. An entry that another key holds is taken
 * over once that key has not been sampled for KT_STALE_NS. */
static void kt_fold(uintptr_t key, int cls, int64_t ns)
{
	uint64_t h = kt_hash(key);
	int i = (int)kt_index(h);
	int64_t now = tessera_now_ns();
	int64_t e;
	if (kt_meta[i].key != key) {
		if (kt_meta[i].key != 0 && now - kt_meta[i].last_ns < KT_STALE_NS)
			return;
		kt_meta[i].key = key;
		kt_meta[i].cls = cls;
		kt_meta[i].rejected = 0;
		kt_meta[i].n = 1;
		kt_meta[i].win[0] = ns;
		e = ns;
	} else if (kt_meta[i].n < KT_WINDOW) {
		kt_meta[i].win[kt_meta[i].n++] = ns;
		e = kt_window_mean(kt_meta[i].win, kt_meta[i].n);
	} else {
		e = (int64_t)(atomic_load_explicit(&kt_word[i], memory_order_relaxed) & KT_NS_MASK);
		if (ns > 3 * e && kt_meta[i].rejected < 3) {
			kt_meta[i].rejected++;
			PSTAT_ADD(set_aside, 1);
			return;
		}
		kt_meta[i].rejected = 0;
		kt_meta[i].n++;
		e += (ns - e) / KT_WINDOW;
	}
	if (e < 1)
		e = 1;
	kt_meta[i].last_ns = now;
	atomic_store_explicit(&kt_word[i], kt_tag(h) << KT_NS_BITS | (uint64_t)e | (kt_meta[i].n >= KT_WINDOW ? KT_SETTLED : 0),
			      memory_order_relaxed);
	if (e > atomic_load(&kt_longest_ns) || now - kt_scan_at_ns > 100000000LL)
		kt_rescan(now);
}

/* Since when (monotonic ns) this process last saw another context on its GPU: a launch
 * sample whose start event waited on a drained stream, a burst that ran over its
 * charge, a probe that waited for the context's turn. Probing runs for CONTENDED_NS
 * after (pace.h): a container alone on its GPU has nothing to probe for. */
static _Atomic int64_t other_seen_ns;
static void saw_other(void)
{
	atomic_store_explicit(&other_seen_ns, tessera_now_ns(), memory_order_relaxed);
}
static int seen_lately(int64_t t)
{
	return t > 0 && tessera_now_ns() - t < CONTENDED_NS;
}
/* The same from the signs that can only be another context's work: a launch sample
 * that met another context's turn, a probe that waited for the context's turn (a
 * burst over its charge may also be the host's own gaps). A work-conserving
 * container runs beyond its share only while this is false. */
static _Atomic int64_t met_seen_ns;
static int others_have_work(void)
{
	return seen_lately(atomic_load_explicit(&met_seen_ns, memory_order_relaxed)) ||
	       seen_lately(tessera_residency_late_seen_ns());
}
int pace_contended(void)
{
	return seen_lately(atomic_load_explicit(&other_seen_ns, memory_order_relaxed)) || others_have_work();
}
/* A sample still running this long after its launch was queued behind more work than
 * the container was charged for: the launching thread waits for it. This bounds how
 * far a program whose launches are charged too little can run ahead of the GPU. */
#define MAX_AHEAD_NS (2 * TESSERA_PACING_PERIOD_NS)

static int events_usable(void)
{
	return REAL(cuEventCreate) && REAL(cuEventRecord) && REAL(cuEventQuery) && REAL(cuEventSynchronize) &&
	       REAL(cuEventDestroy_v2) && REAL(cuEventElapsedTime_v2) && REAL(cuCtxGetCurrent);
}

/* The events of the current context, made on first use (caller holds ev_mu); NULL if
 * there is no current context or they cannot be made. An entry a sample or a burst
 * still uses is not replaced. */
static struct ctx_events *events_current(void)
{
	CUcontext ctx = NULL;
	if (REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || ctx == NULL)
		return NULL;
	for (int i = 0; i < NCTX; i++)
		if (evc[i].ctx == ctx)
			return &evc[i];
	for (int tries = 0; tries < NCTX; tries++) {
		struct ctx_events *c = &evc[evc_next];
		evc_next = (evc_next + 1) % NCTX;
		int busy = atomic_load(&smp.state) != SAMPLE_FREE && smp.c == c;
		for (int g = 0; g < tessera.limits.ngpus && !busy; g++)
			busy = (pacers[g].burst_started || pacers[g].fence_pending) &&
			       pacers[g].burst_ctx == c;
		if (busy)
			continue;
		if (c->ctx != NULL)
			for (int e = 0; e < 6; e++) {
				tessera_residency_unhold(c->ev[e]); /* no probing until a destroyed event */
				REAL(cuEventDestroy_v2)(c->ev[e]);
			}
		c->ctx = NULL;
		c->gen = ++ev_gen;
		for (int e = 0; e < 6; e++) {
			if (REAL(cuEventCreate)(&c->ev[e], CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
				while (e-- > 0)
					REAL(cuEventDestroy_v2)(c->ev[e]);
				return NULL;
			}
		}
		c->ctx = ctx;
		return c;
	}
	return NULL;
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

/* GPU ns between two completed events; -1 if they cannot tell. */
static int64_t elapsed_ns(CUevent a, CUevent b)
{
	float ms = 0;
	if (REAL(cuEventElapsedTime_v2)(&ms, a, b) != CUDA_SUCCESS || !(ms >= 0) || ms > 3.6e6f)
		return -1;
	return (int64_t)((double)ms * 1e6);
}

/* Reads the sample in flight if its kernel has finished (caller holds ev_mu), and
 * folds it into its class's estimate. */
static void settle_sample(void)
{
	if (atomic_load(&smp.state) != SAMPLE_FLYING)
		return;
	struct ctx_events *c = smp.c;
	if (c->gen != smp.gen || c->ctx == NULL) {
		atomic_store(&smp.state, SAMPLE_FREE);
		return;
	}
	CUresult q = REAL(cuEventQuery)(c->ev[1]);
	if (q == CUDA_ERROR_NOT_READY)
		return;
	int64_t ns = q == CUDA_SUCCESS ? elapsed_ns(c->ev[0], c->ev[1]) : -1;
	/* Another context's turns inside the sample, where the probes saw them. */
	int64_t off = ns >= 0 && smp.probed ? tessera_residency_off(c->ctx, c->ev[0], c->ev[1]) : -1;
	atomic_store(&smp.state, SAMPLE_FREE);
	if (ns < 0)
		return;
#ifdef TESSERA_PACE_TRACE
	int64_t trace_raw = ns;
#endif
	if (off > 0 && off < ns) {
		ns -= off;
		PSTAT_ADD(off_ns, off);
	}
	if (off >= 0)
		PSTAT_ADD(probed, 1);
	last_at_ns[smp.cls] = tessera_now_ns();
	/* The start event found the stream idle: it completed when it was recorded, and
	 * the host's time to issue the launch after it is not the kernel's. */
	if (smp.host_gap_ns > 0)
		ns = ns - smp.host_gap_ns > ns / 10 ? ns - smp.host_gap_ns : ns / 10;
	if (ns < 1)
		ns = 1;
	if (ns > MAX_EST_NS)
		ns = MAX_EST_NS;
	int64_t e = atomic_load_explicit(&est_ns[smp.cls], memory_order_relaxed);
	/* What the sample is read against: its kernel's own entry where it has one
	 * (settled once it rests on KT_WINDOW samples), else its class's estimate. */
	int slot;
	int64_t ke = smp.key != 0 ? kt_lookup(smp.key, &slot) : 0;
	int64_t eref = ke > 0 ? ke : e;
	int settled = ke > 0 ? kt_meta[slot].n >= KT_WINDOW : atomic_load(&est_samples[smp.cls]) >= EST_WINDOW;
	/* The launch waited for a refill, so its stream had drained, yet its start event
	 * had not run when the launch returned: another context held the GPU (a
	 * time-sliced GPU runs one context at a time). A sample that ran well over the
	 * estimate then holds the rest of the other's turn: it says nothing of this
	 * container's launches, and is kept out of the estimate and of the samples that
	 * explain a burst's overrun (the burst's overrun is the other's turn, and is
	 * taken for that). Eight in a row are taken anyway: the launches may have
	 * changed while every sample met another's turn. */
	if (off < 0 && smp.met && eref > 0 && settled && ns > eref + eref / 20 + 20000 && met_rejected[smp.cls] < 8) {
		met_rejected[smp.cls]++;
		PSTAT_ADD(met, 1);
		trace_sample(smp.trace_key, smp.cls, trace_raw, smp.host_gap_ns, off, -1);
		return;
	}
	met_rejected[smp.cls] = 0;
	trace_sample(smp.trace_key, smp.cls, trace_raw, smp.host_gap_ns, off, ns);
	if (eref > 0) {
		int i = recent_n[smp.cls]++ % RECENT;
		recent[smp.cls][i].ns = ns;
		/* What it was charged: the entry times the class's gain. */
		recent[smp.cls][i].est = ke > 0 ? kt_charge((uint64_t)ke, smp.cls) : e;
	}
	if (smp.key != 0)
		kt_fold(smp.key, smp.cls, ns);
	/* A sample far above the estimate most likely waited for another context's
	 * time slice between its events; three in a row mean the work changed. */
	if (atomic_load(&est_samples[smp.cls]) >= EST_WINDOW && ns > 3 * e && rejected[smp.cls] < 3) {
		rejected[smp.cls]++;
		PSTAT_ADD(set_aside, 1);
		return;
	}
	rejected[smp.cls] = 0;

	PSTAT_ADD(samples[smp.cls], 1);
	if (smp.host_gap_ns > 0) {
		PSTAT_ADD(idle[smp.cls], 1);
		PSTAT_ADD(idle_ns[smp.cls], ns);
	} else {
		PSTAT_ADD(busy_ns[smp.cls], ns);
	}
	int64_t n = atomic_fetch_add(&est_samples[smp.cls], 1) + 1;
	if (n > EST_WINDOW)
		n = EST_WINDOW;
	atomic_store_explicit(&est_ns[smp.cls], e + (ns - e) / n, memory_order_relaxed);
}

/* Per-thread sampling: launches left until the next sample, and a random generator
 * (xorshift) that spaces samples at random so that no launch pattern aliases them. */
#define TLS_IE __attribute__((tls_model("initial-exec")))
static __thread int64_t sample_countdown TLS_IE;
static __thread uint32_t rng TLS_IE;
#ifdef TESSERA_PACE_TRACE
static __thread uintptr_t trace_key_now TLS_IE;
#endif

static uint32_t next_random(void)
{
	if (rng == 0)
		rng = (uint32_t)tessera_now_ns() ^ (uint32_t)(uintptr_t)&rng ^ 0x9e3779b9u;
	rng ^= rng << 13;
	rng ^= rng >> 17;
	rng ^= rng << 5;
	return rng;
}

/* A sample is due: read the one in flight, and claim the next for this launch. */
static void sample_due(struct tessera_pace_ticket *t, int cls, uintptr_t key, int64_t cost)
{
	int64_t m = cost > 0 ? SAMPLE_EVERY_NS / cost : 1;
	if (m < 1 || atomic_load_explicit(&est_samples[cls], memory_order_relaxed) < EST_WINDOW)
		m = 1;
	if (m > SAMPLE_MAX_GAP)
		m = SAMPLE_MAX_GAP;
	sample_countdown = m == 1 ? 1 : 1 + (int64_t)(next_random() % (uint32_t)(2 * m - 1));
	/* An event call during a capture could join the capture or break it. */
	if (atomic_load(&tessera.captures) > 0 || !events_usable() || pthread_mutex_trylock(&ev_mu) != 0)
		return;
	/* Until a class has an estimate its launches are charged nothing: the first
	 * sample is waited for, so that a program cannot queue far ahead uncharged; so is
	 * one queued behind more work than a period or two. */
	if (atomic_load(&smp.state) == SAMPLE_FLYING && smp.c->gen == smp.gen && smp.c->ctx != NULL &&
	    (cost == 0 || tessera_now_ns() - smp.launched_ns > MAX_AHEAD_NS)) {
		PSTAT_ADD(wait_syncs, 1);
		REAL(cuEventSynchronize)(smp.c->ev[1]);
	}
	settle_sample();
	if (atomic_load(&smp.state) == SAMPLE_FREE) {
		struct ctx_events *c = events_current();
		if (c != NULL) {
			smp.c = c;
			smp.gen = c->gen;
			smp.cls = cls;
			smp.key = key;
#ifdef TESSERA_PACE_TRACE
			smp.trace_key = trace_key_now;
#endif
			/* A launch long enough for another context's time slice to cut it has the
			 * context's turns probed while it runs, while another context shares the
			 * GPU or the estimate is being formed (its first samples; containers that
			 * start together meet there). Not before the first sample: a program of
			 * short launches never starts the probing thread (a second thread alone
			 * costs a single-threaded program's launches 11 ns each in the fake
			 * driver, B3). */
			smp.probed = cost >= PROBE_MIN_NS && (atomic_load(&est_samples[cls]) < EST_WINDOW || pace_contended());
			if (smp.probed)
				tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 1, NULL);
			atomic_store(&smp.state, SAMPLE_CLAIMED);
			t->sampled = 1;
			t->cls = cls;
			t->ev = c;
		}
	}
	pthread_mutex_unlock(&ev_mu);
}

/* Records the sample's start event, right before the driver's launch. */
static void sample_start(CUstream stream, struct tessera_pace_ticket *t)
{
	struct ctx_events *c = t->ev;
	if (REAL(cuEventRecord)(c->ev[0], stream) != CUDA_SUCCESS) {
		t->sampled = 0;
		atomic_store(&smp.state, SAMPLE_FREE);
		return;
	}
	t->t_start_ns = tessera_now_ns();
}

void tessera_pace_done_slow(CUstream stream, struct tessera_pace_ticket *t, CUresult launched)
{
	struct ctx_events *c = t->ev;
	if (launched != CUDA_SUCCESS || REAL(cuEventRecord)(c->ev[1], stream) != CUDA_SUCCESS) {
		if (smp.probed)
			tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 0, NULL);
		atomic_store(&smp.state, SAMPLE_FREE);
		return;
	}
	/* Probed until the sampled launch has run. */
	if (smp.probed)
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 0, c->ev[1]);
	/* A start event already complete after the launch was issued found the stream
	 * idle: the kernel began only when the launch reached the GPU. */
	int64_t now = tessera_now_ns();
	int started = REAL(cuEventQuery)(c->ev[0]) == CUDA_SUCCESS;
	smp.host_gap_ns = started ? now - t->t_start_ns : 0;
	smp.met = t->waited && !started;
	if (smp.met) {
		saw_other();
		atomic_store_explicit(&met_seen_ns, now, memory_order_relaxed);
	}
	smp.launched_ns = now;
	atomic_store(&smp.state, SAMPLE_FLYING);
}

void tessera_pacing_forget_ctx(CUcontext ctx)
{
	if (ctx == NULL)
		return;
	pthread_mutex_lock(&ev_mu);
	for (int i = 0; i < NCTX; i++)
		if (evc[i].ctx == ctx) {
			/* Its events went with it. */
			evc[i].ctx = NULL;
			evc[i].gen = ++ev_gen;
		}
	pthread_mutex_unlock(&ev_mu);
	tessera_residency_forget(ctx);
}

/* (pacing.h) */
void tessera_pacing_forget_stream(CUstream stream)
{
	uintptr_t t = (uintptr_t)stream + 1;
	pthread_mutex_lock(&ev_mu);
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		struct tessera_pacer *p = &pacers[g];
		uintptr_t o = t;
		atomic_compare_exchange_strong(&p->other_stream, &o, TESSERA_OTHER_MANY);
		if (p->xp_stream == t)
			p->xp_stream = 0;
	}
	pthread_mutex_unlock(&ev_mu);
}

static void after_fork(void)
{
	/* The child has none of the parent's contexts or events. */
	pthread_mutex_init(&ev_mu, NULL);
	memset(evc, 0, sizeof(evc));
	atomic_store(&smp.state, SAMPLE_FREE);
	atomic_store(&est_ns[0], 0);
	atomic_store(&est_ns[1], 0);
	atomic_store(&est_samples[0], 0);
	atomic_store(&est_samples[1], 0);
	rejected[0] = rejected[1] = 0;
	met_rejected[0] = met_rejected[1] = 0;
	memset(recent, 0, sizeof(recent));
	recent_n[0] = recent_n[1] = 0;
	last_at_ns[0] = last_at_ns[1] = 0;
	for (int i = 0; i < KT_SIZE; i++)
		atomic_store(&kt_word[i], 0);
	memset(kt_meta, 0, sizeof(kt_meta));
	atomic_store(&kt_longest_ns, 0);
	kt_scan_at_ns = 0;
	atomic_store(&kt_gain[0], KT_GAIN_ONE);
	atomic_store(&kt_gain[1], KT_GAIN_ONE);
	atomic_store(&charged_ns, 0);
	atomic_store(&met_until_ns, 0);
	atomic_store(&other_seen_ns, 0);
	atomic_store(&met_seen_ns, 0);
	memset(&pstat, 0, sizeof(pstat));
	for (int g = 0; g < TESSERA_MAX_GPUS; g++) {
		struct tessera_pacer *p = &pacers[g];
		p->slept = p->burst_started = p->fence_pending = 0;
		p->turn_held = 0; /* the parent's */
		atomic_store(&p->burst_stream_tag, 0);
	}
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
	for (int cls = 0; cls < 2; cls++) {
		int64_t n = atomic_load(&pstat.samples[cls]), idle = atomic_load(&pstat.idle[cls]);
		if (n == 0)
			continue;
		tessera_log(TESSERA_LOG_DEBUG,
			    "pacing summary class=%d estimate_ns=%lld samples=%lld idle=%lld idle_mean_ns=%lld busy_mean_ns=%lld",
			    cls, (long long)atomic_load(&est_ns[cls]), (long long)n, (long long)idle,
			    (long long)(idle ? atomic_load(&pstat.idle_ns[cls]) / idle : 0),
			    (long long)(n > idle ? atomic_load(&pstat.busy_ns[cls]) / (n - idle) : 0));
	}
	tessera_log(TESSERA_LOG_DEBUG, "pacing summary kernel_gain=%.3f graph_gain=%.3f",
		    (double)atomic_load(&kt_gain[0]) / KT_GAIN_ONE, (double)atomic_load(&kt_gain[1]) / KT_GAIN_ONE);
	for (int i = 0; i < KT_SIZE; i++)
		if (kt_meta[i].key != 0)
			tessera_log(TESSERA_LOG_DEBUG, "pacing summary kernel=%#llx class=%d estimate_ns=%lld samples=%lld",
				    (unsigned long long)kt_meta[i].key, kt_meta[i].cls,
				    (long long)(atomic_load(&kt_word[i]) & KT_NS_MASK), (long long)kt_meta[i].n);
	int64_t probes, late, covered, uncovered;
	tessera_residency_stats(&probes, &late, &covered, &uncovered);
	if (probes > 0)
		tessera_log(TESSERA_LOG_DEBUG,
			    "pacing summary probes=%lld late=%lld windows_covered=%lld windows_not_covered=%lld "
			    "samples_probed=%lld samples_off_ns=%lld",
			    (long long)probes, (long long)late, (long long)covered, (long long)uncovered,
			    (long long)atomic_load(&pstat.probed), (long long)atomic_load(&pstat.off_ns));
	tessera_log(TESSERA_LOG_DEBUG,
		    "pacing summary charged_ns=%lld holds=%lld held_ns=%lld set_aside=%lld met=%lld sample_waits=%lld burst_waits=%lld "
		    "bursts=%lld skipped=%lld owed_ns=%lld returned_ns=%lld sliced_ns=%lld forfeit_ns=%lld restarts=%lld conserved=%lld",
		    (long long)atomic_load(&charged_ns), (long long)atomic_load(&pstat.holds),
		    (long long)atomic_load(&pstat.held_ns), (long long)atomic_load(&pstat.set_aside), (long long)atomic_load(&pstat.met),
		    (long long)atomic_load(&pstat.wait_syncs), (long long)atomic_load(&pstat.waits),
		    (long long)atomic_load(&pstat.bursts), (long long)atomic_load(&pstat.bursts_skipped),
		    (long long)atomic_load(&pstat.owed_ns), (long long)atomic_load(&pstat.returned_ns),
		    (long long)atomic_load(&pstat.sliced_ns), (long long)atomic_load(&pstat.forfeit_ns),
		    (long long)atomic_load(&pstat.restarts), (long long)atomic_load(&pstat.conserved));
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
		p->ev_s = 2;
		p->ev_f = 3;
		p->ev_x = 4;
		p->ev_xp = 5;
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
	if (paced > 0 && !events_usable())
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

/* Adds the allowance of every refill point passed since the last (caller holds s->mu),
 * keeping at most one period's (more, turn_bank, while the container takes turns),
 * and returns the next refill point. */
static int64_t refill(struct tessera_pacer *p, int64_t now)
{
	struct tessera_shared_pacer *s = p->s;
	const int64_t P = TESSERA_PACING_PERIOD_NS;
	int64_t len = p->slot_len_ns;
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
		if (want > t)
			atomic_fetch_add(&s->tokens, want - t);
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

/* The open burst is over without its F (caller holds ev_mu): no more probing for it. */
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
	pthread_mutex_lock(&ev_mu);
	struct ctx_events *c = p->burst_ctx;
	if (p->burst_started && c != NULL && c->gen == p->burst_ctx_gen && c->ctx != NULL) {
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 1, NULL);
		p->burst_probed = 1;
	}
	pthread_mutex_unlock(&ev_mu);
}

/* A burst begins (caller holds s->mu): event S before its first launch. The host's
 * clock is read right before S is recorded and right after F is (not when the slow
 * path began, which may be milliseconds earlier if the thread was descheduled or
 * waited meanwhile), so that the burst's host time is never short and the lag
 * settle_burst computes from it is never overstated. */
static void begin_burst(struct tessera_pacer *p, CUstream stream, int64_t charged0, int64_t all0, int at_refill)
{
	p->burst_started = 0;
	if (!events_usable())
		return;
	pthread_mutex_lock(&ev_mu);
	struct ctx_events *c = events_current();
	/* Long launches beside another context: their turns are probed while it runs. */
	int64_t est = pace_est_longest();
	p->burst_probed = c != NULL && ((est >= PROBE_MIN_NS && pace_contended()) || (p->work_conserving && !others_have_work()));
	if (p->burst_probed)
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_BURST, 1, NULL);
	int64_t t0 = tessera_now_ns();
	if (c != NULL && REAL(cuEventRecord)(c->ev[p->ev_s], stream) == CUDA_SUCCESS) {
		p->burst_started = 1;
		p->burst_ctx = c;
		p->burst_ctx_gen = c->gen;
		p->burst_stream = stream;
		atomic_store(&p->other_stream, 0);
		atomic_store(&p->class_charged, 0);
		atomic_store(&p->burst_stream_tag, (uintptr_t)stream + 1);
		/* The container waited for this refill with nothing of this burst's stream
		 * left to run (settle_burst waited for it), so S completes as it is recorded. */
		p->lag_s_ns = 0;
		p->burst_t0_ns = t0;
		p->burst_charged0 = charged0;
		p->burst_all0 = all0;
		p->burst_at_refill = at_refill;
		p->burst_turn = p->turn_held;
	}
	pthread_mutex_unlock(&ev_mu);
}

/* The open burst ends here (caller holds s->mu): event F after its last launch. When
 * the container goes on without waiting (a refill came while it launched), the next
 * burst starts at F (chained). */
static void end_burst(struct tessera_pacer *p, CUstream stream, int chain)
{
	pthread_mutex_lock(&ev_mu);
	struct ctx_events *c = p->burst_ctx;
	CUcontext cur = NULL;
	if (c->gen == p->burst_ctx_gen && c->ctx != NULL && REAL(cuCtxGetCurrent)(&cur) == CUDA_SUCCESS &&
	    cur == c->ctx && REAL(cuEventRecord)(c->ev[p->ev_f], stream) == CUDA_SUCCESS) {
		int64_t now = tessera_now_ns();
		p->fence_pending = 1;
		p->chained = chain;
		p->f_host_ns = now - p->burst_t0_ns;
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
		p->f_lag_s_ns = p->lag_s_ns;
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
			p->burst_stream = stream;
			atomic_store(&p->burst_stream_tag, (uintptr_t)stream + 1);
			p->burst_t0_ns = now;
			p->burst_charged0 = atomic_load(&charged_ns);
			p->burst_all0 = atomic_load(&p->s->charged);
		} else {
			p->burst_started = 0;
			atomic_store(&p->burst_stream_tag, 0);
		}
	} else {
		p->burst_started = 0;
		atomic_store(&p->burst_stream_tag, 0);
		burst_unprobe(p);
	}
	pthread_mutex_unlock(&ev_mu);
}

/* How far above their estimate the launch samples say a burst's launches ran, as a
 * fraction of its charge (caller holds ev_mu): for each class in use (sampled in the
 * last 25 periods), its last RECENT samples, set aside or not, against the estimates
 * they were read against, without the largest (one sample that met another context's
 * turn does not explain a burst's overrun for the next RECENT samples). A program of
 * mixed kernels, whose long kernels the estimate may set aside, thus has its overrun
 * explained and owed. -1 (the overrun is all owed) while a class rests on its first
 * few samples. */
#define AGREE_SAMPLES 8
static double samples_ratio(double x);
static double samples_excess(void)
{
	return samples_ratio(0);
}
/* The same, signed: how far under their estimates (below 0) or over them the last
 * samples ran, the largest over the classes in use; 0 when they cannot tell. */
static double samples_signed(void)
{
	double x = samples_ratio(-1);
	return x < -0.9 ? 0 : x;
}
static double samples_ratio(double x)
{
	int64_t now = tessera_now_ns();
	for (int cls = 0; cls < 2; cls++) {
		int64_t n = atomic_load(&est_samples[cls]);
		if (n == 0 || now - last_at_ns[cls] > 25 * TESSERA_PACING_PERIOD_NS)
			continue;
		int m = recent_n[cls] < RECENT ? recent_n[cls] : RECENT;
		if (n < AGREE_SAMPLES || m < AGREE_SAMPLES)
			return -1;
		int64_t sum = 0, sum_est = 0;
		int top = 0;
		for (int i = 0; i < m; i++) {
			sum += recent[cls][i].ns;
			sum_est += recent[cls][i].est;
			if (recent[cls][i].ns > recent[cls][top].ns)
				top = i;
		}
		sum -= recent[cls][top].ns;
		sum_est -= recent[cls][top].est;
		if (sum_est <= 0)
			return -1;
		double r = (double)sum / (double)sum_est - 1;
		if (r > x)
			x = r;
	}
	return x;
}

/* A burst ran under half its charge (caller holds ev_mu). Where a class's last
 * RESTART_SAMPLES samples all ran under half its estimate too, the program's launches
 * changed (a phase of long kernels, a warm-up or a batch of large matmuls, then small
 * requests or a launch-bound loop): the class's estimate starts afresh from those
 * samples, as a new program's does from its first. Brought down by a quarter a burst
 * instead, the long kernels' estimate held the short launches at their cap while the
 * few launches each allowance paid for brought it down (the fake driver's 3 us
 * launches after 2 ms kernels, at cap 20: held 260 ms, now 60-80 ms; a PyTorch
 * training loop after matmuls in one process on an H200: 82.5 % of its rate where it
 * needs 12 % of the GPU). A program of mixed kernels charged their mean may restart
 * now and then (the fake's 20 us and 1 ms kernels at 7:1 did in about half its
 * runs): its estimate is then the mean of its samples since, as at its start, and a
 * burst that runs over it owes the difference; its cap held (26-31 % at cap 30 in
 * the fake suite, 27-32 before). */
#define RESTART_SAMPLES 4
static void restart_if_changed(void)
{
	int64_t now = tessera_now_ns();
	for (int cls = 0; cls < 2; cls++) {
		int64_t e = atomic_load(&est_ns[cls]), sum = 0;
		if (atomic_load(&est_samples[cls]) < EST_WINDOW || recent_n[cls] < RESTART_SAMPLES ||
		    now - last_at_ns[cls] > 25 * TESSERA_PACING_PERIOD_NS)
			continue;
		int under = 0;
		for (int j = 1; j <= RESTART_SAMPLES; j++) {
			int64_t ns = recent[cls][(recent_n[cls] - j) % RECENT].ns;
			under += 2 * ns < e;
			sum += ns;
		}
		if (under < RESTART_SAMPLES)
			continue;
		/* The estimate is their mean, as if they were the class's first samples. */
		atomic_store(&est_ns[cls], sum / RESTART_SAMPLES > 0 ? sum / RESTART_SAMPLES : 1);
		atomic_store(&est_samples[cls], RESTART_SAMPLES);
		recent_n[cls] = 0;
		rejected[cls] = met_rejected[cls] = 0;
		PSTAT_ADD(restarts, 1);
		tessera_log(TESSERA_LOG_DEBUG, "pacing class=%d estimate_ns=%lld restarted at %lld: the launches changed", cls,
			    (long long)e, (long long)(sum / RESTART_SAMPLES));
	}
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
/* When a burst last moved the per-kernel gain. A gain no burst has moved for
 * GAIN_STALE_NS goes a quarter of the way back to 1 (the entries as sampled) every
 * GAIN_STALE_NS: what the bursts said of it was said of other work (a program of two
 * streams that now runs one, or launch-bound steps whose bursts are no longer back to
 * back), and a gain under 1 charges the launches less than their samples read. */
#define GAIN_STALE_NS (2 * 1000000000LL)
static int64_t gain_moved_ns;
static void gain_relax(void)
{
	int64_t now = tessera_now_ns();
	if (!charge_kernel || now - gain_moved_ns < GAIN_STALE_NS)
		return;
	gain_moved_ns = now;
	for (int cls = 0; cls < 2; cls++) {
		int64_t g = atomic_load(&kt_gain[cls]);
		atomic_store(&kt_gain[cls], g + (KT_GAIN_ONE - g) / 4);
	}
}

static int64_t settle_burst(struct tessera_pacer *p, int wait)
{
	struct tessera_shared_pacer *s = p->s;
	pthread_mutex_lock(&ev_mu);
	struct ctx_events *c = p->burst_ctx;
	int ok = c->gen == p->burst_ctx_gen && c->ctx != NULL;
	CUresult q = ok ? REAL(cuEventQuery)(c->ev[p->ev_f]) : CUDA_ERROR_INVALID_VALUE;
	if (q == CUDA_SUCCESS && p->f_x_stream != 0)
		q = REAL(cuEventQuery)(c->ev[p->f_x_ev]);
	pthread_mutex_unlock(&ev_mu);
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
	pthread_mutex_lock(&ev_mu);
	if (q == CUDA_SUCCESS && c->gen == p->burst_ctx_gen && c->ctx != NULL) {
		e = elapsed_ns(c->ev[p->ev_s], c->ev[p->ev_f]);
		if (e >= 0)
			off = tessera_residency_off(c->ctx, c->ev[p->ev_s], c->ev[p->ev_f]);
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
	double excess = samples_excess(), ratio = samples_signed();
	pthread_mutex_unlock(&ev_mu);
	int64_t lag = e >= 0 && p->f_lag_s_ns >= 0 ? p->f_lag_s_ns + e - p->f_host_ns : -1;
	if (off > 0 || (off < 0 && excess >= 0 && atomic_load(&est_samples[0]) + atomic_load(&est_samples[1]) >= EST_WINDOW &&
			e > p->f_charged + p->f_charged / 10 + 100000))
		saw_other();
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
	}
	int64_t est = pace_est_longest();
	int64_t min_lag = 100000 + 2 * est;
	/* A queue many kernels deep at F, or one the GPU was behind on for longer than
	 * the host took to issue the burst; and most of S→F after the host's last launch
	 * (a burst whose host paused, a program sleeping or serving no request, with the
	 * stream idle, ends with its queue full of the launches after the pause: its S→F
	 * is mostly the pause). */
	int back_to_back = lag >= 0 && (lag >= p->f_host_ns || (lag >= min_lag && 2 * lag >= e));
	/* Another process of the container launched during the burst: its work ran
	 * between this one's on the GPU, inside this burst's elapsed time. */
	int alone = p->f_all - p->f_charged <= p->f_charged / 20;
	if (e < 0 || p->f_charged <= 0 || p->f_other || (e > p->f_charged && !(back_to_back && alone))) {
		PSTAT_ADD(bursts_skipped, 1);
		tessera_log(TESSERA_LOG_DEBUG, "pacing burst not counted gpu_ns=%lld charged_ns=%lld host_ns=%lld lag_ns=%lld alone=%d",
			    (long long)e, (long long)p->f_charged, (long long)p->f_host_ns, (long long)lag, alone);
		return 0;
	}
	/* Another context's turns on a time-sliced GPU run inside a burst's elapsed time
	 * where the two containers' work meets, and the events of each bill them to both.
	 * What the burst ran over its charge beyond what its launch samples explain (their
	 * excess over the estimate) is taken for that, and neither owed nor read as
	 * launches charged too little: all of it for a burst that began at its slot's
	 * refill (what such a burst runs past its slot's end is given up below, whoever's
	 * work it was), up to one time slice for any other. The rest is owed: all of it
	 * while the samples say the launches changed (a sample set aside). */
	if (off < 0 && excess >= 0 && e > p->f_charged) {
		int64_t explained = (int64_t)(excess * (double)p->f_charged);
		sliced = e - p->f_charged - explained;
		if (!p->f_at_refill && sliced > TIME_SLICE_NS)
			sliced = TIME_SLICE_NS;
		if (sliced < 0)
			sliced = 0;
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
		 * length. */
		int64_t spill = e + sliced - p->slot_len_ns;
		int64_t turns = sliced / 2 < TIME_SLICE_NS / 2 ? sliced / 2 : TIME_SLICE_NS / 2;
		forfeit = spill - (50000 + 2 * est) - (over > 0 ? over : 0) - turns;
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
		pthread_mutex_lock(&ev_mu);
		restart_if_changed();
		pthread_mutex_unlock(&ev_mu);
		r = 0.5;
	}
	if (r > 2)
		r = 2;
	int alone_down = p->f_turn && r < 1;
	double f = alone_down ? r : 1 + (r - 1) / 2;
	for (int cls = 0; cls < 2; cls++) {
		int64_t est_c = atomic_load(&est_ns[cls]);
		int64_t scaled = (int64_t)((double)est_c * f);
		if (est_c > 0 && scaled > 0 && scaled <= MAX_EST_NS && (atomic_load(&est_samples[cls]) >= EST_WINDOW || alone_down))
			atomic_store(&est_ns[cls], scaled);
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
	int clean = alone_down || (back_to_back && alone && off <= 0);
	for (int cls = 0; cls < 2 && charge_kernel && !p->f_class && clean; cls++) {
		int64_t g = (int64_t)((double)atomic_load(&kt_gain[cls]) * f);
		g = g < KT_GAIN_ONE / 16 ? KT_GAIN_ONE / 16 : g > 4 * KT_GAIN_ONE ? 4 * KT_GAIN_ONE : g;
		if (atomic_load(&est_samples[cls]) >= EST_WINDOW || alone_down) {
			atomic_store(&kt_gain[cls], g);
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

/* (pace.h) */
int pace_burst_fence(struct tessera_pacer *p, CUevent *f)
{
	struct ctx_events *c = p->burst_ctx;
	pthread_mutex_lock(&ev_mu);
	int ok = c->gen == p->burst_ctx_gen && c->ctx != NULL;
	*f = c->ev[p->ev_f];
	pthread_mutex_unlock(&ev_mu);
	return ok;
}

/* The tokens are spent: wait (asleep, without the lock, so that every launching
 * thread of the container gets its turn) for a refill, and charge this launch. */
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
				pthread_mutex_lock(&ev_mu);
				burst_unprobe(p);
				pthread_mutex_unlock(&ev_mu);
				pthread_mutex_unlock(&s->mu);
				return slept;
			}
		}
		if (slept)
			p->slept = 1;
		/* The ended burst is settled before the refill, so that what it owes is
		 * taken from what the refill brings; what it gives back is added after. */
		int64_t give = 0;
		if (p->fence_pending) {
			give = settle_burst(p, p->slept);
			now = tessera_now_ns();
		}
		int64_t r0 = s->refill_k;
		int64_t wake = refill(p, now);
		if (give > 0)
			atomic_fetch_add(&s->tokens, give);
		int refilled = s->refill_k != r0;
		if (p->slept && p->burst_started) {
			/* A chained burst that could not end before the wait: it spans the wait,
			 * when the GPU idled, and is not measured. */
			p->burst_started = 0;
			atomic_store(&p->burst_stream_tag, 0);
			pthread_mutex_lock(&ev_mu);
			burst_unprobe(p);
			pthread_mutex_unlock(&ev_mu);
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
			if (!p->burst_started && !p->fence_pending)
				begin_burst(p, stream, charged0, all0, refilled && p->slept);
			p->slept = 0;
			pthread_mutex_unlock(&s->mu);
			return slept;
		}
		if (p->work_conserving && !others_have_work() && !(p->turn_held && pace_turn_wanted(p, now))) {
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

/* Tokens a thread took ahead of use, in GPU ns, and which pacer they came from.
 * Initial-exec TLS: a plain load from the thread pointer, not a __tls_get_addr call;
 * the hook is loaded at process start (LD_PRELOAD or /etc/ld.so.preload), where static
 * TLS has room. */
static __thread int64_t local_left TLS_IE;
static __thread const struct tessera_shared_pacer *local_pacer TLS_IE;

void tessera_pace(CUstream stream, int cls, uintptr_t key, struct tessera_pace_ticket *t)
{
	t->sampled = 0;
	t->waited = 0;
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
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
		int64_t coarse = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
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
	trace_key_now = key;
#endif
	if (!charge_kernel)
		key = 0;
	if (key != 0) {
		uint64_t h = kt_hash(key);
		uint64_t w = atomic_load_explicit(&kt_word[kt_index(h)], memory_order_relaxed);
		if ((w >> KT_NS_BITS) == kt_tag(h)) {
			cost = kt_charge(w, cls);
			/* An entry on its first samples: sampled again, launch after launch
			 * while one is free, until it rests on KT_WINDOW; and the burst says
			 * nothing of the gain. */
			if (!(w & KT_SETTLED)) {
				sample_countdown = 1;
				if (!atomic_load_explicit(&p->class_charged, memory_order_relaxed))
					atomic_store_explicit(&p->class_charged, 1, memory_order_relaxed);
			}
		} else if (w == 0)
			sample_countdown = 1;
	}
	if (cost < 0) {
		cost = atomic_load_explicit(&est_ns[cls], memory_order_relaxed);
		if (charge_kernel && !atomic_load_explicit(&p->class_charged, memory_order_relaxed))
			atomic_store_explicit(&p->class_charged, 1, memory_order_relaxed);
	}
	trace_launch(trace_key_now, cls, cost);
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
	if (local_pacer == s && local_left >= cost) {
		local_left -= cost;
	} else {
		int64_t have = local_pacer == s ? local_left : 0;
		int64_t tokens = atomic_load_explicit(&s->tokens, memory_order_relaxed);
		int64_t take = tokens > 4 * TAKE_EVERY * cost ? TAKE_EVERY * cost - have : cost - have;
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
			t->waited = slow_path(p, stream, cost);
		}
	}
	/* After any wait for a refill: the sample in flight has likely finished by then,
	 * and a launch that waited is sampled on a drained stream (settle_sample). */
	if (--sample_countdown <= 0)
		sample_due(t, cls, key, cost);
	if (t->sampled)
		sample_start(stream, t);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What pacing measures of the launches it charges: pacing.c spends the container's
 * allowance, this says what a launch costs. Per launch class (kernels, graphs), an
 * estimate, the mean of random launch samples, each a launch bracketed by an event
 * pair on its stream and read later without blocking (pace_sample_due,
 * pace_sample_settle). With the limits file's charge line, per kernel, an entry of its own
 * samples in a direct-mapped table, which a launch reads in one load (pace_measure.h).
 * Here too: each context's events, which pacing.c's bursts record on as well; the
 * signs that another context shares the GPU; and what the last samples say of a
 * burst's overrun and of launches that changed. The bursts move the class estimates
 * and the per-kernel gain (pacing.c's settle_burst). docs/cuda-hook.md gives the
 * reasoning.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "clock.h"
#include "fork.h"
#include "log.h"
#include "pace.h"
#include "pace_measure.h"
#include "pacing.h"
#include "residency.h"
#include "state.h"

#include "pace_trace.h"

/* One sample per this much estimated GPU time (a sample costs the host a few
 * microseconds: two event records, a query and an elapsed-time read). A diagnostic
 * build may set another (Makefile, HOOK_CFLAGS). */
#ifdef TESSERA_SAMPLE_EVERY_NS
#define SAMPLE_EVERY_NS TESSERA_SAMPLE_EVERY_NS
#else
#define SAMPLE_EVERY_NS 200000LL
#endif
#define SAMPLE_MAX_GAP 256

/* ---- per-process measurement state -------------------------------------------- */

/* Estimated GPU ns per launch, per class (0: kernels, 1: graphs); 0 until measured.
 * The mean of the first EST_WINDOW samples, then a moving average over about as many. */
_Atomic int64_t pace_est_ns[2];
_Atomic int64_t pace_est_samples[2]; /* samples taken so far */
static int rejected[2];              /* samples set aside in a row (under pace_ev_mu) */
static int met_rejected[2];          /* samples that met another context, in a row (under pace_ev_mu) */
/* Per class (under pace_ev_mu): the last RECENT samples, set aside or not, each with
 * the estimate it was read against, and when the last was read. */
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
 * is kept under pace_ev_mu by the launch samples, which alone write the table. A
 * function whose entry another holds (a collision; the other sampled in the last
 * KT_STALE_NS) is charged its class's estimate; one whose entry is empty has its next
 * launch sampled, so that it is charged its own time from its first sample on. */
#define KT_WINDOW 8
#define KT_STALE_NS (10 * 1000000000LL)
_Atomic uint64_t pace_kt_word[KT_SIZE];
static struct {
	uintptr_t key;
	int cls;
	int rejected; /* samples set aside in a row */
	int64_t n;    /* samples taken */
	int64_t last_ns;
	int64_t win[KT_WINDOW]; /* the first KT_WINDOW samples */
	/* The samples kept that found their stream idle, and those queued behind the
	 * program's own work (KT_QUEUED), and what each kind read in all, once the entry
	 * has settled (its first samples hold its kernel's cold first launch): the debug
	 * summary sets the two kinds' means side by side. */
	int64_t idle_n, idle_ns, queued_n, queued_ns;
} kt_meta[KT_SIZE];
/* The longest entry sampled in the last KT_STALE_NS (for est_longest), and when the
 * table was last scanned for it. */
static _Atomic int64_t kt_longest_ns;
static int64_t kt_scan_at_ns;

/* Each context's events (pace_measure.h), for NCTX contexts at a time. */
#define NCTX 4
pthread_mutex_t pace_ev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ctx_events evc[NCTX];
static uint64_t ev_gen;
static int evc_next;

/* With the charge line: what a launch sample reads beyond its kernel, its events' own
 * time on the GPU's queue (an event is work the queue runs: on an H200, 10 us FMA
 * kernels were charged 10.1-10.5 us against 9.1-9.8 back to back). Where a program's
 * bursts ran back to back the gain took that out, but the bursts of a step whose GPU
 * waits for its host never are
 * (the fake driver's host-bound step with 3 us events: 46.1-46.8 % at cap 50). Read
 * from a pair of events (a context's ev[EVCOST_A] and ev[EVCOST_B]) recorded back to
 * back, with nothing between them, right before a burst's S on its drained stream (so
 * that no other context's turn falls between them), or right after a launch sample
 * (the pair then waits behind its kernel), whether or not another context has been
 * seen: the first EVCOST_FIRST pairs of the process, then one in EVCOST_EVERY bursts,
 * read at a later burst's start or pair without waiting, as evcal_read says. The pair reads the
 * events' time only where the GPU ran them back to back: where it ran the first
 * before the host had recorded the second (the first had run when the second's record
 * returned), the two read the host's time between the records, about as long as a
 * record call takes (1.7 us in the fake driver for events of 1 us, with 1.5 us a
 * call), and are not read. A reading over EVCOST_MAX_NS held something else (a context
 * switch). Under pace_ev_mu but for the value. */
#define EVCOST_FIRST 8
#define EVCOST_A 4
#define EVCOST_B 5
#define EVCOST_EVERY 64
#define EVCOST_MAX_NS 20000
_Static_assert(EVCOST_FIRST <= KT_WINDOW, "kt_window_mean takes at most KT_WINDOW readings");
static _Atomic int64_t ev_cost_ns;
static int64_t ev_cost_n;
static struct {
	struct ctx_events *c; /* the pair in flight, NULL if none */
	uint64_t gen;
	unsigned bursts; /* bursts begun since the last pair */
	unsigned tries;  /* pairs recorded in all, but those below */
	unsigned idle_tries; /* pairs recorded behind a launch sample that found its stream idle */
	int64_t apart;   /* pairs not read: the GPU ran them apart */
	int64_t set_aside; /* readings over 3x the mean: something else fell between */
	int64_t first[EVCOST_FIRST];
} evcal;

/* How often a launch due for a sample found every slot in use (pace_sample_due;
 * under pace_ev_mu): always, until due launches say otherwise. */
static int due_busy = 1024;

/* The launch samples in flight, up to SAMPLE_SLOTS at once, each with its context's
 * pair of events for its slot (ctx_events.smp_ev). A slot is claimed under pace_ev_mu
 * by a due launch, filled in by that launch's thread (pace_sample_start,
 * tessera_pace_done_slow) and read under pace_ev_mu once its end event has run
 * (pace_sample_settle). Several in flight, so that a due launch seldom finds none
 * free and the samples fall where the random countdown puts them. With one, a launch
 * due while it ran was not sampled and the first due after it had run was: in a step
 * of fixed order, one of the step's first launches (the queue drains at the step's
 * synchronize), and in a random mix, a launch right after a long kernel had run. The
 * fake driver's step of one 1 ms kernel and 40 of 20 us had its long kernel in 18 %
 * of its samples against 2.4 % of its launches (2.4 % now), so a probed long sample
 * could not be kept in a class's mean; a host at about the GPU's pace, launching
 * 20 us and 1 ms kernels at 7 to 1, had its rare long samples set aside and ran
 * 40-45 % at cap 30 (31-34 % now). */
enum { SAMPLE_FREE, SAMPLE_CLAIMED, SAMPLE_FLYING };
struct sample {
	_Atomic int state;
	uint64_t order; /* claimed as the order'th sample (under pace_ev_mu) */
	struct ctx_events *c;
	uint64_t gen;
	int cls;
	uintptr_t key;       /* its function or executable graph (0: none, charged its class's) */
	CUstream stream;
	int64_t host_gap_ns; /* the start event found the stream idle: host time before the kernel */
	int64_t issue_ns;    /* the host's time from its start event's record to its launch's return */
	int64_t launched_ns; /* when its launch was issued */
	int met;             /* its stream had drained, yet its start event waited: another context ran */
	int probed;          /* the context's turns on the GPU were probed for it (residency.c) */
	int streams;         /* its burst had launched on another stream too when it was issued */
	/* Where it can tell whether the GPU waited for the host inside its burst
	 * (gap_p set; pace_burst_sample): the burst's pacer, number and S event, and the
	 * host's time from S to the sample's start event. */
	struct tessera_pacer *gap_p;
	uint64_t gap_seq;
	CUevent gap_s;
	int64_t gap_host_ns;
	int gap_fresh; /* S was recorded on a drained stream: the GPU's lag there was 0 */
#ifdef TESSERA_PACE_TRACE
	uintptr_t trace_key;
#endif
};
static struct sample smp[SAMPLE_SLOTS];
static uint64_t smp_claimed; /* samples claimed so far (under pace_ev_mu) */

/* A slot in flight whose events are still its context's. */
static int sample_live(const struct sample *m)
{
	return atomic_load(&m->state) == SAMPLE_FLYING && m->c->gen == m->gen && m->c->ctx != NULL;
}

/* A free slot, NULL if every one is in use (caller holds pace_ev_mu). */
static struct sample *sample_free(void)
{
	for (int i = 0; i < SAMPLE_SLOTS; i++)
		if (atomic_load(&smp[i].state) == SAMPLE_FREE)
			return &smp[i];
	return NULL;
}

/* The oldest sample in flight, NULL if none (caller holds pace_ev_mu). */
static struct sample *sample_oldest(void)
{
	struct sample *o = NULL;
	for (int i = 0; i < SAMPLE_SLOTS; i++)
		if (sample_live(&smp[i]) && (o == NULL || smp[i].order < o->order))
			o = &smp[i];
	return o;
}

/* The longest launch estimated: the two classes' estimates and the longest
 * per-kernel entry in use. */
int64_t pace_est_longest(void)
{
	int64_t k = atomic_load(&pace_est_ns[0]), g = atomic_load(&pace_est_ns[1]), t = atomic_load(&kt_longest_ns);
	k = k > g ? k : g;
	return k > t ? k : t;
}

/* Rescans the table for its longest entry in use (caller holds pace_ev_mu). */
static void kt_rescan(int64_t now)
{
	int64_t m = 0;
	for (int i = 0; i < KT_SIZE; i++)
		if (kt_meta[i].key != 0 && now - kt_meta[i].last_ns < KT_STALE_NS) {
			int64_t e = (int64_t)(atomic_load_explicit(&pace_kt_word[i], memory_order_relaxed) & KT_NS_MASK);
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
	uint64_t w = atomic_load_explicit(&pace_kt_word[*slot], memory_order_relaxed);
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

/* The kinds of a sample, for its kernel's entry: one whose start event found the
 * stream idle; one queued behind this program's own work on its one stream, with no
 * other context's turn met or seen in it; any other. */
enum { KT_IDLE, KT_QUEUED, KT_OTHER };

/* Folds a sample of ns, of the given kind, into key's entry (caller holds
 * pace_ev_mu): the mean of its first KT_WINDOW samples without the outliers
 * (kt_window_mean), then a moving average; a sample over 3x the entry is then set
 * aside (it may hold another context's time slice) unless three in a row say so, or
 * the probes covered it (probed: their off time is out of it already, and what is
 * left is the kernel's own). An entry that another key holds is taken over once that
 * key has not been sampled for KT_STALE_NS. Returns 1 where the sample was set aside.
 *
 * Every sample counts for what it read, whether it found its stream idle or queued
 * behind the program's own work: samples are drawn at random over the launches, so
 * the two kinds come in about the parts the launches do, and neither kind reads the
 * other's launches right. A kernel queued behind an event starts afresh once the
 * event has run, later than one queued behind a kernel: on an H100 an LLM step's
 * short kernels' queued samples read 1.2-1.8 us over their idle ones, whose mean matched
 * the profiler's kernel time; charged their queued samples' mean in place of the
 * idle ones' (as kernels sampled both ways were), the step was charged 13 % over its
 * kernel time and held 7 points under its cap at 50. The other way, a 2048^2
 * matmul's idle samples read 22.4 us against 26.5 us queued and 26.8 back to back:
 * a kernel mostly queued is charged about its queued samples. */
static int kt_fold(uintptr_t key, int cls, int64_t ns, int probed, int kind)
{
	uint64_t h = kt_hash(key);
	int i = (int)kt_index(h);
	int64_t now = tessera_now_ns();
	int64_t e;
	if (kt_meta[i].key != key) {
		if (kt_meta[i].key != 0 && now - kt_meta[i].last_ns < KT_STALE_NS)
			return 0;
		kt_meta[i].key = key;
		kt_meta[i].cls = cls;
		kt_meta[i].rejected = 0;
		kt_meta[i].n = 1;
		kt_meta[i].win[0] = ns;
		kt_meta[i].idle_n = kt_meta[i].idle_ns = kt_meta[i].queued_n = kt_meta[i].queued_ns = 0;
		e = ns;
	} else if (kt_meta[i].n < KT_WINDOW) {
		kt_meta[i].win[kt_meta[i].n++] = ns;
		e = kt_window_mean(kt_meta[i].win, kt_meta[i].n);
	} else {
		e = (int64_t)(atomic_load_explicit(&pace_kt_word[i], memory_order_relaxed) & KT_NS_MASK);
		if (ns > 3 * e && kt_meta[i].rejected < 3 && !probed) {
			kt_meta[i].rejected++;
			PSTAT_ADD(set_aside, 1);
			return 1;
		}
		kt_meta[i].rejected = 0;
		kt_meta[i].n++;
		e += (ns - e) / KT_WINDOW;
		if (kind == KT_IDLE) {
			kt_meta[i].idle_n++;
			kt_meta[i].idle_ns += ns;
		} else if (kind == KT_QUEUED) {
			kt_meta[i].queued_n++;
			kt_meta[i].queued_ns += ns;
		}
	}
	if (e < 1)
		e = 1;
	kt_meta[i].last_ns = now;
	atomic_store_explicit(&pace_kt_word[i],
			      kt_tag(h) << KT_NS_BITS | (uint64_t)e | (kt_meta[i].n >= KT_WINDOW ? KT_SETTLED : 0),
			      memory_order_relaxed);
	if (e > atomic_load(&kt_longest_ns) || now - kt_scan_at_ns > 100000000LL)
		kt_rescan(now);
	return 0;
}

/* Since when (monotonic ns) this process last saw another context on its GPU: a launch
 * sample whose start event waited on a drained stream, a burst that ran over its
 * charge, a probe that waited for the context's turn. Probing runs for CONTENDED_NS
 * after (pace.h): a container alone on its GPU has nothing to probe for. */
static _Atomic int64_t other_seen_ns;
void pace_saw_other(void)
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
int pace_others_have_work(void)
{
	return seen_lately(atomic_load_explicit(&met_seen_ns, memory_order_relaxed)) ||
	       seen_lately(tessera_residency_late_seen_ns());
}
int pace_contended(void)
{
	return seen_lately(atomic_load_explicit(&other_seen_ns, memory_order_relaxed)) || pace_others_have_work();
}
/* Since when a launch sample ran over three times its estimate, or a burst over its
 * charge by more than its samples explain (pacing.c's settle_burst), with no probe to
 * tell whose time that was: another context's turn, or kernels of the program's far
 * longer than the rest of its class or function (a handle-less program mixing
 * kernels of 20 us and 1 ms; one function launched on grids of very different
 * sizes), which a sample meets only now and then. Taken for turns, such kernels were
 * charged as short ones: the fake driver's 20 us / 1 ms program at 7:1 ran 50-57 % at
 * cap 50 and 80-99 % at cap 80. For CONTENDED_NS after, every launch sample
 * (pace_sample_due) and every burst (pacing.c) has the context's turns probed,
 * whatever its length: the probes then say which it was. A covered sample in which
 * they saw no turn is folded in whatever its length, and a covered burst owes what
 * they do not explain. */
static _Atomic int64_t unexplained_ns;
void pace_saw_unexplained(void)
{
	atomic_store_explicit(&unexplained_ns, tessera_now_ns(), memory_order_relaxed);
}
int pace_unexplained(void)
{
	return seen_lately(atomic_load_explicit(&unexplained_ns, memory_order_relaxed));
}
/* A sample still running this long after its launch was queued behind more work than
 * the container was charged for: the launching thread waits for it. This bounds how
 * far a program whose launches are charged too little can run ahead of the GPU. */
#define MAX_AHEAD_NS (2 * TESSERA_PACING_PERIOD_NS)

/* A context's events one after the other: ev, then the sample slots' pairs. */
#define ALL_EVENTS (CTX_EVENTS + 2 * SAMPLE_SLOTS)
static CUevent *ctx_event(struct ctx_events *c, int e)
{
	return e < CTX_EVENTS ? &c->ev[e] : &c->smp_ev[(e - CTX_EVENTS) / 2][(e - CTX_EVENTS) % 2];
}

int pace_events_usable(void)
{
	return REAL(cuEventCreate) && REAL(cuEventRecord) && REAL(cuEventQuery) && REAL(cuEventSynchronize) &&
	       REAL(cuEventDestroy_v2) && REAL(cuEventElapsedTime_v2) && REAL(cuCtxGetCurrent);
}

/* The context's lead word, which a graph launch's sample sets before its start event
 * (pace_sample_start); LEAD_NONE where it cannot be made.
 *
 * A start event recorded on an idle stream can run while the context does not hold the
 * GPU, and the launch after it then waits inside the sample for the context's turn.
 * On an H100, two unhooked processes of the graph + eager step (a replay first in each
 * step, after the synchronize that ended the step before) read their replays at
 * 264-327 us in means over a few seconds (medians 52-326), against 52-58 us alone; with
 * a 4-byte cuMemsetD32Async on the stream before the start event, 49.5-50.7 us (a
 * 20 us kernel there did the same, 48.3-49.7; a wait on a word the host set after the
 * launch, or on an event already complete, did not: 232-268 and 260-300). Charged six
 * times its time, the 30 % tenant of such a pair was held and slowed to 46-92 % of
 * its unhooked rate though it needs less than its cap. Graph launches only: a replay
 * is where a step starts after its host waited, and a kernel's samples that met
 * another's turn are set aside by their entries (kt_fold) where they are the few. The
 * word costs the context one small allocation (within its context charge), the
 * memset a microsecond or two of the GPU a sample. The word's allocation is known by
 * its buffer ID, unique in the process, and is set only while the address still has
 * it: a context reset (cudaDeviceReset) frees the word with the program's memory, and
 * the address may then be the program's. A diagnostic build
 * (-DTESSERA_LEAD_ALL, Makefile) leads every sample in, to try kernels' too; one with
 * -DTESSERA_NO_LEAD none, to set the lead-in against the hook without it. */
#if defined(TESSERA_LEAD_ALL)
#define LED_IN(cls) 1
#elif defined(TESSERA_NO_LEAD)
#define LED_IN(cls) 0
#else
#define LED_IN(cls) ((cls) == 1)
#endif
static CUdeviceptr lead_make(unsigned long long *id)
{
	CUdeviceptr d = 0;
	if (REAL(cuMemsetD32Async) == NULL || REAL(cuPointerGetAttribute) == NULL || REAL(cuMemAlloc_v2) == NULL ||
	    REAL(cuMemAlloc_v2)(&d, 4) != CUDA_SUCCESS)
		return LEAD_NONE;
	if (d == 0 || d == LEAD_NONE || REAL(cuPointerGetAttribute)(id, CU_POINTER_ATTRIBUTE_BUFFER_ID, d) != CUDA_SUCCESS) {
		if (d != 0 && REAL(cuMemFree_v2) != NULL)
			REAL(cuMemFree_v2)(d);
		return LEAD_NONE;
	}
	return d;
}

/* Whether the context's lead word is there and still its own. */
static int lead_ok(const struct ctx_events *c)
{
	unsigned long long id = 0;
	return c->lead != 0 && c->lead != LEAD_NONE &&
	       REAL(cuPointerGetAttribute)(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, c->lead) == CUDA_SUCCESS && id == c->lead_id;
}

/* The events of the current context, made on first use (caller holds pace_ev_mu); NULL
 * if there is no current context or they cannot be made. An entry a sample or a burst
 * still uses is not replaced. */
struct ctx_events *pace_events_current(void)
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
		int busy = pace_bursts_use(c);
		for (int i = 0; i < SAMPLE_SLOTS; i++)
			busy |= atomic_load(&smp[i].state) != SAMPLE_FREE && smp[i].c == c;
		if (busy)
			continue;
		if (c->ctx != NULL) {
			for (int e = 0; e < ALL_EVENTS; e++) {
				tessera_residency_unhold(*ctx_event(c, e)); /* no probing until a destroyed event */
				REAL(cuEventDestroy_v2)(*ctx_event(c, e));
			}
			if (lead_ok(c))
				REAL(cuMemFree_v2)(c->lead);
		}
		c->ctx = NULL;
		c->lead = 0;
		c->gen = ++ev_gen;
		for (int e = 0; e < ALL_EVENTS; e++) {
			if (REAL(cuEventCreate)(ctx_event(c, e), CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
				while (e-- > 0)
					REAL(cuEventDestroy_v2)(*ctx_event(c, e));
				return NULL;
			}
		}
		c->ctx = ctx;
		return c;
	}
	return NULL;
}

/* GPU ns between two completed events; -1 if they cannot tell. */
int64_t pace_elapsed_ns(CUevent a, CUevent b)
{
	float ms = 0;
	if (REAL(cuEventElapsedTime_v2)(&ms, a, b) != CUDA_SUCCESS || !(ms >= 0) || ms > 3.6e6f)
		return -1;
	return (int64_t)((double)ms * 1e6);
}

/* Reads sample m if its kernel has finished (caller holds pace_ev_mu), and folds it
 * into its class's estimate; 0 where it has not run yet. */
static int sample_read(struct sample *m)
{
	struct ctx_events *c = m->c;
	if (c->gen != m->gen || c->ctx == NULL) {
		atomic_store(&m->state, SAMPLE_FREE);
		return 1;
	}
	CUevent *ev = c->smp_ev[m - smp];
	CUresult q = REAL(cuEventQuery)(ev[1]);
	if (q == CUDA_ERROR_NOT_READY)
		return 0;
	int64_t ns = q == CUDA_SUCCESS ? pace_elapsed_ns(ev[0], ev[1]) : -1;
	/* Another context's turns inside the sample, where the probes saw them. */
	int turns = 0;
	int64_t off = ns >= 0 && m->probed ? tessera_residency_off(c->ctx, ev[0], ev[1], &turns) : -1;
	/* Free from here: no slot is claimed but under pace_ev_mu, which the caller holds
	 * while what follows reads it. */
	atomic_store(&m->state, SAMPLE_FREE);
	if (ns < 0)
		return 1;
#ifdef TESSERA_PACE_TRACE
	int64_t trace_raw = ns;
#endif
	int cut = off > 0 && off < ns;
	if (cut) {
		ns -= off;
		PSTAT_ADD(off_ns, off);
	}
	if (off >= 0)
		PSTAT_ADD(probed, 1);
	/* The GPU's lag behind the host at the sample's start, as settle_burst reads it
	 * at F: S (on a drained stream: no lag there) to the start event, less the host's
	 * time between them. None: the stream was idle when the launch was issued, and
	 * the GPU waited for the host inside the burst. Read here rather than by a query
	 * right after the launch, which a GPU that processes an event a few us after it
	 * is recorded (the fake's FAKE_CUDA_EVENT_NS) answers "not yet" on an idle
	 * stream. The sample then holds the host's time to issue the launch, as one
	 * that the query found idle does (below). */
	if (m->gap_p != NULL) {
		int64_t g = pace_elapsed_ns(m->gap_s, ev[0]);
		if (m->gap_fresh && m->gap_p->burst_seq == m->gap_seq && g >= 0 && g <= m->gap_host_ns) {
			pace_burst_gap(m->gap_p, m->gap_seq);
			if (m->host_gap_ns == 0)
				m->host_gap_ns = m->issue_ns;
		} else if (g >= 0) {
			/* From its launch until its start event ran, the stream's queue held work
			 * of the burst: from gap_host_ns after S's record to g after the GPU
			 * reached S, which is the lag at S after its record (settle_burst). An S
			 * recorded again since reads after the sample's start (g < 0) and tells
			 * nothing. */
			pace_burst_busy(m->gap_p, m->gap_seq, m->gap_host_ns, g);
		}
	}
	last_at_ns[m->cls] = tessera_now_ns();
	/* The start event found the stream idle: it completed when it was recorded, and
	 * the host's time to issue the launch after it is not the kernel's. */
	if (m->host_gap_ns > 0)
		ns = ns - m->host_gap_ns > ns / 10 ? ns - m->host_gap_ns : ns / 10;
	/* With the charge line, less the events' own time (at most half the sample). */
	int64_t ev_cost = atomic_load_explicit(&ev_cost_ns, memory_order_relaxed);
	if (ev_cost > 0 && tessera.limits.charge_kernel)
		ns = ns - ev_cost > ns / 2 ? ns - ev_cost : ns / 2;
	if (ns < 1)
		ns = 1;
	if (ns > MAX_EST_NS)
		ns = MAX_EST_NS;
	int64_t e = atomic_load_explicit(&pace_est_ns[m->cls], memory_order_relaxed);
	/* What the sample is read against: its kernel's own entry where it has one
	 * (settled once it rests on KT_WINDOW samples), else its class's estimate. */
	int slot;
	int64_t ke = m->key != 0 ? kt_lookup(m->key, &slot) : 0;
	int64_t eref = ke > 0 ? ke : e;
	int settled = ke > 0 ? kt_meta[slot].n >= KT_WINDOW : atomic_load(&pace_est_samples[m->cls]) >= EST_WINDOW;
	/* The launch waited for a refill, so its stream had drained, yet its start event
	 * had not run when the launch returned: another context held the GPU (a
	 * time-sliced GPU runs one context at a time). A sample that ran well over the
	 * estimate then holds the rest of the other's turn: it says nothing of this
	 * container's launches, and is kept out of the estimate and of the samples that
	 * explain a burst's overrun (the burst's overrun is the other's turn, and is
	 * taken for that). Eight in a row are taken anyway: the launches may have
	 * changed while every sample met another's turn. */
	if (off < 0 && m->met && eref > 0 && settled && ns > eref + eref / 20 + 20000 && met_rejected[m->cls] < 8) {
		met_rejected[m->cls]++;
		PSTAT_ADD(met, 1);
		trace_sample(m->trace_key, m->cls, trace_raw, m->host_gap_ns, off, -1);
		return 1;
	}
	met_rejected[m->cls] = 0;
	trace_sample(m->trace_key, m->cls, trace_raw, m->host_gap_ns, off, ns);
	if (eref > 0) {
		int i = recent_n[m->cls]++ % RECENT;
		recent[m->cls][i].ns = ns;
		/* What it was charged: the entry times the class's gain. */
		recent[m->cls][i].est = ke > 0 ? kt_charge((uint64_t)ke, m->cls) : e;
	}
	/* A sample the probes covered, and in which they saw no other context's turn,
	 * is the kernel's own time, however far above the estimate. So is one they saw
	 * turns in, once those are out, where what is left is long against the probes'
	 * error (half a probe step a turn, either way, many times a short kernel): at
	 * least four times it, within a quarter. Before, a long kernel's samples were
	 * set aside whenever they met another context's turn: of two host-paced programs
	 * mixing 20 us and 1 ms kernels at 7 to 1 on the fake driver's time-sliced GPU
	 * at 30 / 70, the 30 % tenant folded 48-52 % of its long samples (those with the
	 * turn taken out read 1.05 ms) and charged its launches 90 us against 142 us
	 * run; 68-72 % now. Not one whose burst ran on two streams (a kernel waits there
	 * for the program's own work on the other stream, which is charged already). */
	int probed = !m->streams && (off == 0 || (cut && ns >= 4 * turns * TESSERA_RESIDENCY_TURN_ERR_NS));
	/* Set aside with no turn seen in it: the probes stay on (pace_unexplained). */
	int kind = m->host_gap_ns > 0			      ? KT_IDLE
		   : !m->met && off <= 0 && !m->streams ? KT_QUEUED
							  : KT_OTHER;
	if (m->key != 0 && kt_fold(m->key, m->cls, ns, probed, kind) && off <= 0)
		pace_saw_unexplained();
	/* A sample far above the estimate may have waited for another context's time
	 * slice between its events; three in a row mean the work changed. One the probes
	 * covered (above) is the class's own, and is kept where the launches sampled are
	 * any launches. Where due launches find every sample slot in use, they are not
	 * sampled, and the first due after a slot frees is, which in a step's fixed order
	 * of kernels is no launch at random (with one slot, a step of one 1 ms kernel
	 * issued first and 40 of 20 us had most samples on the long kernel, its estimate
	 * rose to 3x its mean and it ran 15.5 % at cap 25; one whose backward pass another
	 * thread launches, 8x its mean and 27 % at cap 50). So a long sample is kept only
	 * while due launches seldom find every slot in use (under a quarter of them). */
	if (atomic_load(&pace_est_samples[m->cls]) >= EST_WINDOW && ns > 3 * e && rejected[m->cls] < 3 &&
	    !(probed && due_busy < 256)) {
		rejected[m->cls]++;
		PSTAT_ADD(set_aside, 1);
		if (off <= 0)
			pace_saw_unexplained();
		return 1;
	}
	rejected[m->cls] = 0;

	PSTAT_ADD(samples[m->cls], 1);
	if (m->host_gap_ns > 0) {
		PSTAT_ADD(idle[m->cls], 1);
		PSTAT_ADD(idle_ns[m->cls], ns);
	} else {
		PSTAT_ADD(busy_ns[m->cls], ns);
	}
	int64_t n = atomic_fetch_add(&pace_est_samples[m->cls], 1) + 1;
	if (n > EST_WINDOW)
		n = EST_WINDOW;
	atomic_store_explicit(&pace_est_ns[m->cls], e + (ns - e) / n, memory_order_relaxed);
	return 1;
}

/* (pace_measure.h) Oldest first, so that a burst's spans come in the order of its
 * samples (pace_burst_busy); a sample not yet run holds back the later ones on its
 * stream, which run after it. */
void pace_sample_settle(void)
{
	struct sample *fly[SAMPLE_SLOTS];
	int n = 0;
	for (int i = 0; i < SAMPLE_SLOTS; i++) {
		if (atomic_load(&smp[i].state) != SAMPLE_FLYING)
			continue;
		int j = n++;
		for (; j > 0 && fly[j - 1]->order > smp[i].order; j--)
			fly[j] = fly[j - 1];
		fly[j] = &smp[i];
	}
	CUstream held[SAMPLE_SLOTS];
	int nheld = 0;
	for (int i = 0; i < n; i++) {
		int h = 0;
		while (h < nheld && held[h] != fly[i]->stream)
			h++;
		if (h == nheld && !sample_read(fly[i]))
			held[nheld++] = fly[i]->stream;
	}
}

/* (pace_measure.h) */
void pace_event_cost(struct ctx_events *c, CUstream stream)
{
	if (!tessera.limits.charge_kernel)
		return;
	evcal.bursts++;
	pace_event_pair(c, stream, 0);
}

/* Reads the pair in flight once the GPU has run it (caller holds pace_ev_mu): the
 * first EVCOST_FIRST readings' mean without those over 3x their lower median and 2 us
 * (kt_window_mean), then a moving average that sets aside a reading over 3x it and
 * 1 us. A pair may wait behind a kernel that another context's turn, or an MPS
 * neighbour's work, delays; what falls between its two events is then not theirs. */
static void evcal_read(void)
{
	if (evcal.c == NULL)
		return;
	struct ctx_events *k = evcal.c;
	int gone = k->gen != evcal.gen || k->ctx == NULL;
	CUresult q = gone ? CUDA_ERROR_INVALID_VALUE : REAL(cuEventQuery)(k->ev[EVCOST_B]);
	if (q == CUDA_ERROR_NOT_READY)
		return;
	evcal.c = NULL;
	int64_t ns = q == CUDA_SUCCESS ? pace_elapsed_ns(k->ev[EVCOST_A], k->ev[EVCOST_B]) : -1;
	if (ns < 0 || ns > EVCOST_MAX_NS)
		return;
	int64_t v = atomic_load_explicit(&ev_cost_ns, memory_order_relaxed);
	if (ev_cost_n < EVCOST_FIRST) {
		evcal.first[ev_cost_n++] = ns;
		v = kt_window_mean(evcal.first, ev_cost_n);
	} else if (ns > 3 * v + 1000) {
		evcal.set_aside++;
		return;
	} else {
		ev_cost_n++;
		v += (ns - v) / EVCOST_FIRST;
	}
	atomic_store_explicit(&ev_cost_ns, v, memory_order_relaxed);
}

/* (pace_measure.h) */
void pace_event_pair(struct ctx_events *c, CUstream stream, int idle)
{
	if (!tessera.limits.charge_kernel)
		return;
	evcal_read();
	if (evcal.c != NULL)
		return;
	/* Due: one of the first pairs (a program whose pairs the GPU always runs apart
	 * tries 4 x EVCOST_FIRST times in a row, then as often as the rest; those behind
	 * a kernel that found its stream idle, often apart behind a short one, count
	 * apart from the others), or EVCOST_EVERY bursts since the last. */
	unsigned *tries = idle ? &evcal.idle_tries : &evcal.tries;
	if ((ev_cost_n >= EVCOST_FIRST || *tries >= 4 * EVCOST_FIRST) && evcal.bursts < EVCOST_EVERY)
		return;
	if (atomic_load(&tessera.captures) > 0 || REAL(cuEventRecord)(c->ev[EVCOST_A], stream) != CUDA_SUCCESS ||
	    REAL(cuEventRecord)(c->ev[EVCOST_B], stream) != CUDA_SUCCESS)
		return;
	evcal.bursts = 0;
	(*tries)++;
	if (REAL(cuEventQuery)(c->ev[EVCOST_A]) != CUDA_ERROR_NOT_READY) {
		evcal.apart++;
		return;
	}
	evcal.c = c;
	evcal.gen = c->gen;
}

/* Per-thread sampling: launches left until the next sample, and a random generator
 * (xorshift) that spaces samples at random so that no launch pattern aliases them. */
__thread int64_t pace_sample_countdown TLS_IE;
static __thread uint32_t rng TLS_IE;
/* Launches between the thread's samples, a moving average over about 16 due launches,
 * in 1/16ths of a launch; 0 until the first. */
static __thread int64_t sample_gap16 TLS_IE;

static uint32_t next_random(void)
{
	if (rng == 0)
		rng = (uint32_t)tessera_now_ns() ^ (uint32_t)(uintptr_t)&rng ^ 0x9e3779b9u;
	rng ^= rng << 13;
	rng ^= rng >> 17;
	rng ^= rng << 5;
	return rng;
}

/* A sample is due: read those in flight that have run, and claim a slot for this
 * launch. */
void pace_sample_due(struct tessera_pace_ticket *t, int cls, uintptr_t key, int64_t cost)
{
	/* One sample per SAMPLE_EVERY_NS of estimated GPU time, the launches between
	 * them averaged over the last due launches, not set by this launch's estimate
	 * alone. Spaced by the estimate of the moment, an entry whose estimate moves
	 * (a kernel of one function and grid whose length its data decides, a class of
	 * kernels of 20 us and 1 ms) was sampled seldom while its estimate was low and
	 * at every launch while high: the launches between two samples went as one over
	 * the estimate they were charged, and the launches' mean charge was the
	 * estimates' harmonic mean, far under the kernels' mean (the fake driver's
	 * one-function kernels of 20 us and 1 ms, host-paced: charged 91 us a launch
	 * against 142 us run, 82.4-84.9 % of the GPU at cap 80 and 53.8-56.4 at 50;
	 * spaced by the average, 129 us, 79.9-81.8 and 50.8-51.6). */
	int64_t gap16 = cost > 0 ? SAMPLE_EVERY_NS * 16 / cost : 16;
	if (gap16 > SAMPLE_MAX_GAP * 16)
		gap16 = SAMPLE_MAX_GAP * 16;
	sample_gap16 = sample_gap16 <= 0 ? gap16 : sample_gap16 + (gap16 - sample_gap16) / 16;
	int64_t every = sample_gap16 / 16;
	if (every < 1 || atomic_load_explicit(&pace_est_samples[cls], memory_order_relaxed) < EST_WINDOW)
		every = 1;
	if (every > SAMPLE_MAX_GAP)
		every = SAMPLE_MAX_GAP;
	pace_sample_countdown = every == 1 ? 1 : 1 + (int64_t)(next_random() % (uint32_t)(2 * every - 1));
	/* An event call during a capture could join the capture or break it. */
	if (atomic_load(&tessera.captures) > 0 || !pace_events_usable() || pthread_mutex_trylock(&pace_ev_mu) != 0)
		return;
	/* Until a class has an estimate its launches are charged nothing: the first
	 * sample is waited for, so that a program cannot queue far ahead uncharged; so is
	 * one queued behind more work than a period or two. And so is the oldest sample,
	 * where every slot is in use, before the first launch of a kernel with no entry
	 * (kernel model), so that this one is sampled: a kernel launched once a step at a
	 * point where the samples before it are still in flight (behind another context's
	 * time slice) was otherwise never sampled and charged its class's estimate for
	 * good. A step of 40 host-paced 20 us kernels and one of 1 ms, at 30 beside the
	 * same at 70 on the fake's time-sliced GPU, had its 1 ms kernel charged 20 us in
	 * 4 runs of 12 and took 36.5-49.3 % of the GPU. Once a kernel: its first sample
	 * gives it an entry. */
	int fresh = key != 0 && atomic_load_explicit(&pace_kt_word[kt_index(kt_hash(key))], memory_order_relaxed) == 0;
	struct sample *old = sample_oldest();
	if (old != NULL &&
	    (cost == 0 || (fresh && sample_free() == NULL) || tessera_now_ns() - old->launched_ns > MAX_AHEAD_NS)) {
		PSTAT_ADD(wait_syncs, 1);
		REAL(cuEventSynchronize)(old->c->smp_ev[old - smp][1]);
		/* The stream may have drained while the host waited here: an idle stream at
		 * this launch is the hook's doing, not the program's host falling behind
		 * (two 20 ms kernels' overrun went unowed: 23.7 % at cap 20). */
		t->opened = 1;
	}
	pace_sample_settle();
	struct sample *free_slot = sample_free();
	/* How often a due launch found every slot in use (1/1024ths, a moving average
	 * over about 16 due launches). */
	int busy = free_slot == NULL;
	due_busy += ((busy ? 1024 : 0) - due_busy) / 16;
	if (!busy) {
		struct ctx_events *c = pace_events_current();
		if (c != NULL) {
			struct sample *m = free_slot;
			m->order = ++smp_claimed;
			m->c = c;
			m->gen = c->gen;
			m->cls = cls;
			m->key = key;
#ifdef TESSERA_PACE_TRACE
			m->trace_key = tessera_trace_key_now;
#endif
			/* A launch long enough for another context's time slice to cut it has the
			 * context's turns probed while it runs, while another context shares the
			 * GPU or the estimate is being formed (its first samples; containers that
			 * start together meet there). Not before the first sample: a program of
			 * short launches never starts the probing thread (a second thread alone
			 * costs a single-threaded program's launches 11 ns each in the fake
			 * driver, B3). */
			m->probed = (cost >= PROBE_MIN_NS && (atomic_load(&pace_est_samples[cls]) < EST_WINDOW || pace_contended())) ||
				     pace_unexplained();
			if (m->probed)
				tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 1, NULL);
			if (LED_IN(cls) && c->lead == 0)
				c->lead = lead_make(&c->lead_id);
			atomic_store(&m->state, SAMPLE_CLAIMED);
			t->sampled = 1;
			t->slot = (int)(m - smp);
			t->cls = cls;
			t->ev = c;
		}
	}
	pthread_mutex_unlock(&pace_ev_mu);
}

/* Records the sample's start event, right before the driver's launch; a graph
 * launch's behind a memset of the context's lead word (lead_make). */
void pace_sample_start(CUstream stream, struct tessera_pace_ticket *t)
{
	struct ctx_events *c = t->ev;
	struct sample *m = &smp[t->slot];
	if (LED_IN(t->cls) && lead_ok(c))
		REAL(cuMemsetD32Async)(c->lead, 0, 1, stream);
	if (REAL(cuEventRecord)(c->smp_ev[t->slot][0], stream) != CUDA_SUCCESS) {
		t->sampled = 0;
		atomic_store(&m->state, SAMPLE_FREE);
		return;
	}
	t->t_start_ns = tessera_now_ns();
}

void tessera_pace_done_slow(CUstream stream, struct tessera_pace_ticket *t, CUresult launched)
{
	struct ctx_events *c = t->ev;
	struct sample *m = &smp[t->slot];
	CUevent *ev = c->smp_ev[t->slot];
	/* The host's time from the start event's record to the launch's return, read
	 * before the end event is recorded: a driver's event record costs its host a
	 * microsecond or two after the kernel has been queued, time in which the GPU runs
	 * the kernel, and counted in, an idle-stream sample of a kernel of a few
	 * microseconds lost it from its own time (the fake driver's host-bound step of
	 * 5 us kernels, with 1.5 us a call, ran 19-22 % at cap 10: unpaced). */
	int64_t issued = tessera_now_ns();
	if (launched != CUDA_SUCCESS || REAL(cuEventRecord)(ev[1], stream) != CUDA_SUCCESS) {
		if (m->probed)
			tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 0, NULL);
		atomic_store(&m->state, SAMPLE_FREE);
		return;
	}
	/* Probed until the sampled launch has run. */
	if (m->probed)
		tessera_residency_hold(c->ctx, TESSERA_RESIDENCY_SAMPLE, 0, ev[1]);
	/* A start event already complete after the launch was issued found the stream
	 * idle: the kernel began only when the launch reached the GPU. */
	int started = REAL(cuEventQuery)(ev[0]) == CUDA_SUCCESS;
	m->issue_ns = issued - t->t_start_ns;
	m->host_gap_ns = started ? m->issue_ns : 0;
	m->gap_p = NULL;
	m->gap_fresh = 0;
	if (tessera.limits.charge_kernel) {
		pthread_mutex_lock(&pace_ev_mu);
		/* A pair of events recorded now waits behind the kernel while it runs, and the
		 * GPU runs the two back to back (pace_event_pair; a pair the GPU ran apart,
		 * behind a kernel shorter than the records, is not read). Also while another
		 * context shares the GPU: a turn of it between the two reads far over their
		 * time and is set aside (evcal_read). Tried only where the stream had work
		 * queued and no other context was seen, a host-paced program alone, which its
		 * own host gaps make look contended and whose kernels find their stream idle,
		 * had no reading in a run: its idle samples then held the events' 1.5-2 us,
		 * and an LLM step's decode kernels of 1.5-5 us were charged 1.23x the
		 * profiler's time for them (on an H100). */
		pace_event_pair(c, stream, started);
		/* A launch that opened its burst, or came right after the hook waited for a
		 * sample, may find its stream drained by the hook's doing: it tells of no
		 * gap, only, where it queued, of the GPU busy. */
		int told = t->opened && started ? 0
						: pace_burst_sample(t->p, stream, c, started, t->t_start_ns, &m->gap_s,
								    &m->gap_seq, &m->gap_host_ns);
		if (told) {
			m->gap_p = t->p;
			m->gap_fresh = told == 1 && !t->opened;
		}
		pthread_mutex_unlock(&pace_ev_mu);
	}
	m->met = t->waited && !started;
	m->streams = atomic_load_explicit(&t->p->other_stream, memory_order_relaxed) != 0;
	if (m->met) {
		pace_saw_other();
		atomic_store_explicit(&met_seen_ns, issued, memory_order_relaxed);
	}
	m->launched_ns = issued;
	m->stream = stream;
	atomic_store(&m->state, SAMPLE_FLYING);
}

void tessera_pacing_forget_ctx(CUcontext ctx)
{
	if (ctx == NULL)
		return;
	pthread_mutex_lock(&pace_ev_mu);
	for (int i = 0; i < NCTX; i++)
		if (evc[i].ctx == ctx) {
			/* Its events and its lead word went with it. */
			evc[i].ctx = NULL;
			evc[i].lead = 0;
			evc[i].gen = ++ev_gen;
		}
	pthread_mutex_unlock(&pace_ev_mu);
	tessera_residency_forget(ctx);
}

/* How far above their estimate the launch samples say a burst's launches ran, as a
 * fraction of its charge (caller holds pace_ev_mu): for each class in use (sampled in
 * the last 25 periods), its last RECENT samples, set aside or not, against the
 * estimates they were read against, without the largest (one sample that met another
 * context's turn does not explain a burst's overrun for the next RECENT samples). A
 * program of mixed kernels, whose long kernels the estimate may set aside, thus has its
 * overrun explained and owed. -1 (the overrun is all owed) while a class rests on its
 * first few samples. */
#define AGREE_SAMPLES 8
static double samples_ratio(double x);
double pace_samples_excess(void)
{
	return samples_ratio(0);
}
/* The same, signed: how far under their estimates (below 0) or over them the last
 * samples ran, the largest over the classes in use; 0 when they cannot tell. */
double pace_samples_signed(void)
{
	double x = samples_ratio(-1);
	return x < -0.9 ? 0 : x;
}
static double samples_ratio(double x)
{
	int64_t now = tessera_now_ns();
	for (int cls = 0; cls < 2; cls++) {
		int64_t n = atomic_load(&pace_est_samples[cls]);
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

/* A burst ran under half its charge (caller holds pace_ev_mu). Where a class's last
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
void pace_restart_if_changed(void)
{
	int64_t now = tessera_now_ns();
	for (int cls = 0; cls < 2; cls++) {
		int64_t e = atomic_load(&pace_est_ns[cls]), sum = 0;
		if (atomic_load(&pace_est_samples[cls]) < EST_WINDOW || recent_n[cls] < RESTART_SAMPLES ||
		    now - last_at_ns[cls] > 25 * TESSERA_PACING_PERIOD_NS)
			continue;
		int under = 0, older = 0, older_under = 0;
		for (int j = 1; j <= RESTART_SAMPLES; j++) {
			int64_t ns = recent[cls][(recent_n[cls] - j) % RECENT].ns;
			under += 2 * ns < e;
			sum += ns;
		}
		for (int j = RESTART_SAMPLES + 1; j <= recent_n[cls] && j <= RECENT; j++, older++)
			older_under += 2 * recent[cls][(recent_n[cls] - j) % RECENT].ns < e;
		/* Short launches that were there before the last few, as often as not, are
		 * the program's mix, not a change: four short samples in a row come in about
		 * half the runs of a tenth of a second of 20 us and 1 ms launches at 7 to 1,
		 * and a restart near a window's end took it 5-10 points over its cap there
		 * (the fake's `mixed`, 0.8 s at cap 30). */
		if (under < RESTART_SAMPLES || (older > 0 && 2 * older_under >= older))
			continue;
		/* The estimate is their mean, as if they were the class's first samples. */
		atomic_store(&pace_est_ns[cls], sum / RESTART_SAMPLES > 0 ? sum / RESTART_SAMPLES : 1);
		atomic_store(&pace_est_samples[cls], RESTART_SAMPLES);
		recent_n[cls] = 0;
		rejected[cls] = met_rejected[cls] = 0;
		PSTAT_ADD(restarts, 1);
		tessera_log(TESSERA_LOG_DEBUG, "pacing class=%d estimate_ns=%lld restarted at %lld: the launches changed", cls,
			    (long long)e, (long long)(sum / RESTART_SAMPLES));
	}
}

static void after_fork(void)
{
	/* The child has none of the parent's contexts or events. */
	pthread_mutex_init(&pace_ev_mu, NULL);
	memset(evc, 0, sizeof(evc));
	for (int i = 0; i < SAMPLE_SLOTS; i++)
		atomic_store(&smp[i].state, SAMPLE_FREE);
	smp_claimed = 0;
	atomic_store(&pace_est_ns[0], 0);
	atomic_store(&pace_est_ns[1], 0);
	atomic_store(&pace_est_samples[0], 0);
	atomic_store(&pace_est_samples[1], 0);
	rejected[0] = rejected[1] = 0;
	met_rejected[0] = met_rejected[1] = 0;
	memset(recent, 0, sizeof(recent));
	recent_n[0] = recent_n[1] = 0;
	last_at_ns[0] = last_at_ns[1] = 0;
	for (int i = 0; i < KT_SIZE; i++)
		atomic_store(&pace_kt_word[i], 0);
	memset(kt_meta, 0, sizeof(kt_meta));
	atomic_store(&kt_longest_ns, 0);
	kt_scan_at_ns = 0;
	atomic_store(&other_seen_ns, 0);
	atomic_store(&met_seen_ns, 0);
	atomic_store(&unexplained_ns, 0);
	atomic_store(&ev_cost_ns, 0);
	ev_cost_n = 0;
	memset(&evcal, 0, sizeof(evcal));
	due_busy = 1024;
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_PACE_MEASURE, after_fork);
}

/* (pace_measure.h) */
void pace_measure_summary(void)
{
	for (int cls = 0; cls < 2; cls++) {
		int64_t n = atomic_load(&pace_stat.samples[cls]), idle = atomic_load(&pace_stat.idle[cls]);
		if (n == 0)
			continue;
		tessera_log(TESSERA_LOG_DEBUG,
			    "pacing summary class=%d estimate_ns=%lld samples=%lld idle=%lld idle_mean_ns=%lld busy_mean_ns=%lld",
			    cls, (long long)atomic_load(&pace_est_ns[cls]), (long long)n, (long long)idle,
			    (long long)(idle ? atomic_load(&pace_stat.idle_ns[cls]) / idle : 0),
			    (long long)(n > idle ? atomic_load(&pace_stat.busy_ns[cls]) / (n - idle) : 0));
	}
	tessera_log(TESSERA_LOG_DEBUG,
		    "pacing summary kernel_gain=%.3f graph_gain=%.3f event_ns=%lld event_readings=%lld event_pairs_apart=%lld "
		    "event_readings_set_aside=%lld",
		    (double)atomic_load(&pace_kt_gain[0]) / KT_GAIN_ONE, (double)atomic_load(&pace_kt_gain[1]) / KT_GAIN_ONE,
		    (long long)atomic_load(&ev_cost_ns), (long long)ev_cost_n, (long long)evcal.apart,
		    (long long)evcal.set_aside);
	for (int i = 0; i < KT_SIZE; i++)
		if (kt_meta[i].key != 0)
			tessera_log(TESSERA_LOG_DEBUG,
				    "pacing summary kernel=%#llx class=%d estimate_ns=%lld samples=%lld idle=%lld idle_mean_ns=%lld "
				    "queued=%lld queued_mean_ns=%lld",
				    (unsigned long long)kt_meta[i].key, kt_meta[i].cls,
				    (long long)(atomic_load(&pace_kt_word[i]) & KT_NS_MASK), (long long)kt_meta[i].n,
				    (long long)kt_meta[i].idle_n,
				    (long long)(kt_meta[i].idle_n ? kt_meta[i].idle_ns / kt_meta[i].idle_n : 0),
				    (long long)kt_meta[i].queued_n,
				    (long long)(kt_meta[i].queued_n ? kt_meta[i].queued_ns / kt_meta[i].queued_n : 0));
	int64_t probes, late, covered, uncovered;
	tessera_residency_stats(&probes, &late, &covered, &uncovered);
	if (probes > 0)
		tessera_log(TESSERA_LOG_DEBUG,
			    "pacing summary probes=%lld late=%lld windows_covered=%lld windows_not_covered=%lld "
			    "samples_probed=%lld samples_off_ns=%lld",
			    (long long)probes, (long long)late, (long long)covered, (long long)uncovered,
			    (long long)atomic_load(&pace_stat.probed), (long long)atomic_load(&pace_stat.off_ns));
}

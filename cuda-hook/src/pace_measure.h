/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What pacing.c (the allowance, the bursts) and pace_measure.c (the launch samples, the
 * estimates they make, each context's events) share beyond pace.h. Nothing else
 * includes it. What a launch reads (an estimate, a per-kernel entry and its gain, the
 * countdown to the next sample) is here as variables and inline functions, so that a
 * launch pays the loads it paid when the two were one file.
 */
#ifndef TESSERA_PACE_MEASURE_H
#define TESSERA_PACE_MEASURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "pacing.h"
#include "tessera_cuda.h"

/* Initial-exec TLS (pacing.c's tessera_pace). */
#ifndef TLS_IE
#define TLS_IE __attribute__((tls_model("initial-exec")))
#endif

/* No estimate of one launch beyond this (ten periods): a sample that says more is
 * not a kernel's time. */
#define MAX_EST_NS (10 * TESSERA_PACING_PERIOD_NS)

/* Launch samples, and bursts, of launches estimated at least this long have the
 * context's turns on the GPU probed (residency.c) while they run: shorter ones are
 * seldom cut by a time slice, and a sample that is reads over 3x its estimate and is
 * set aside. */
#define PROBE_MIN_NS 200000LL

/* ---- pace_measure.c, for pacing.c ---- */

/* Estimated GPU ns per launch, per class (0: kernels, 1: graphs); 0 until measured.
 * The mean of the first EST_WINDOW samples, then a moving average over about as many. */
#define EST_WINDOW 32
extern _Atomic int64_t pace_est_ns[2];
extern _Atomic int64_t pace_est_samples[2]; /* samples taken so far */

/* The per-kernel entries (pace_measure.c): a launch's key hashed to its slot, whose
 * word holds the entry's tag and estimate. */
#define KT_BITS 9
#define KT_SIZE (1 << KT_BITS)
#define KT_NS_BITS 40
/* The estimate is the word's low 39 bits (549 s, far above MAX_EST_NS); bit 39 says it
 * rests on KT_WINDOW samples or more (settled). */
#define KT_SETTLED (1ULL << (KT_NS_BITS - 1))
#define KT_NS_MASK (KT_SETTLED - 1)
extern _Atomic uint64_t pace_kt_word[KT_SIZE];
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

/* Per thread: launches left until the next sample. */
extern __thread int64_t pace_sample_countdown TLS_IE;
/* A sample is due: read those in flight that have run, and claim a slot for this
 * launch. */
void pace_sample_due(struct tessera_pace_ticket *t, int cls, uintptr_t key, int64_t cost);
/* Records the sample's start event, right before the driver's launch. */
void pace_sample_start(CUstream stream, struct tessera_pace_ticket *t);

/* Launch samples in flight at once (pace_measure.c). */
#define SAMPLE_SLOTS 16
/* Events of one context: 0-1 a burst's start and end (which is which changes as
 * bursts chain: tessera_pacer.ev_s, ev_f), 2-3 a burst's mark on its second stream,
 * 4-5 the events' own time (pace_event_cost); and each launch sample slot's start
 * and end (smp_ev). */
#define CTX_EVENTS 6
struct ctx_events {
	CUcontext ctx;
	uint64_t gen; /* changes whenever the events are made anew or lost */
	CUevent ev[CTX_EVENTS];
	CUevent smp_ev[SAMPLE_SLOTS][2];
	/* A word of the context's device memory that a graph launch's sample sets before
	 * its start event (pace_sample_start); 0 until made, LEAD_NONE where it cannot be. */
	CUdeviceptr lead;
	unsigned long long lead_id; /* its allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID */
};
#define LEAD_NONE ((CUdeviceptr)1)
/* Held over the contexts' events, the launch samples in flight, the estimates' recent
 * samples and the per-kernel entries, and by the bursts over their events. */
extern pthread_mutex_t pace_ev_mu;
/* The driver has every event function pacing measures with. */
int pace_events_usable(void);
/* The events of the current context, made on first use (caller holds pace_ev_mu). */
struct ctx_events *pace_events_current(void);
/* GPU ns between two completed events; -1 if they cannot tell. */
int64_t pace_elapsed_ns(CUevent a, CUevent b);

/* Another context was seen on the GPU: a burst ran over its charge, or the probes saw
 * the context off the GPU inside it. */
void pace_saw_other(void);
/* A launch sample or a burst ran far over its estimate lately with no probe to say
 * why (pace_saw_unexplained): every sample and burst has the context's turns probed
 * meanwhile. */
void pace_saw_unexplained(void);
int pace_unexplained(void);
/* Another context has had work on the GPU lately (a launch sample met its turn, or a
 * probe waited for this context's): a work-conserving container runs beyond its share
 * only while this is false. */
int pace_others_have_work(void);

/* What the last launch samples say of a burst's launches (caller holds pace_ev_mu): how
 * far above their estimates they ran (-1: not known yet); and how far under (below 0)
 * or over them (0: not known). */
double pace_samples_excess(void);
double pace_samples_signed(void);
/* A burst ran under half its charge (caller holds pace_ev_mu): a class whose last
 * samples did too starts its estimate afresh from them. */
void pace_restart_if_changed(void);

/* The estimates', the entries' and the probes' lines of the debug log's summary. */
void pace_measure_summary(void);

/* ---- pacing.c, for pace_measure.c ---- */

/* Whether the GPU waited for the host inside a burst, from its launch samples
 * (caller holds pace_ev_mu; with the charge line). pace_burst_sample, for a sampled
 * launch, right after it (idle: its start event had run when the launch returned;
 * never for an idle one that opened its burst or followed the hook's own wait, whose
 * stream the hook drained): where the sample can tell more once read, the burst's S event, number
 * and the host's time from S to the sample's start event in *s, *seq and *host_ns,
 * and 1 where S was recorded on a drained stream (the sample then tells whether the
 * GPU waited for the host), 2 where the burst chained at an F (it tells only how
 * long the GPU was surely busy); else 0. pace_burst_gap: the GPU waited for the
 * host in burst seq. pace_burst_busy: in burst seq the GPU's queue was not drained
 * from host_ns to g after S. */
int pace_burst_sample(struct tessera_pacer *p, CUstream stream, struct ctx_events *c, int idle, int64_t t_start_ns,
		      CUevent *s, uint64_t *seq, int64_t *host_ns);
void pace_burst_gap(struct tessera_pacer *p, uint64_t seq);
void pace_burst_busy(struct tessera_pacer *p, uint64_t seq, int64_t host_ns, int64_t g);
/* Reads the launch samples in flight that have run (caller holds pace_ev_mu). */
void pace_sample_settle(void);
/* A burst begins on stream, drained, with c's events (caller holds pace_ev_mu, and
 * calls it before S is recorded): with the charge line, reads the last pair of events
 * that measure the events' own time if it has run, and now and then records the next
 * pair. */
void pace_event_cost(struct ctx_events *c, CUstream stream);
/* Records the pair that measures the events' own time on the stream, if one is due
 * and none is in flight (caller holds pace_ev_mu), where the GPU will run the two back
 * to back: right before a burst's S (pace_event_cost), or behind a launch sample's
 * kernel (tessera_pace_done_slow; idle: the kernel found its stream idle). */
void pace_event_pair(struct ctx_events *c, CUstream stream, int idle);

/* What the bursts say of the entries (pacing.c): a launch is charged its entry times
 * its class's gain (KT_GAIN_ONE is 1). */
#define KT_GAIN_SHIFT 16
#define KT_GAIN_ONE (1LL << KT_GAIN_SHIFT)
extern _Atomic int64_t pace_kt_gain[2];
static inline int64_t kt_charge(uint64_t w, int cls)
{
	return (int64_t)(((w & KT_NS_MASK) * (uint64_t)atomic_load_explicit(&pace_kt_gain[cls], memory_order_relaxed)) >>
			 KT_GAIN_SHIFT);
}

/* An open or ended burst of some GPU still uses c's events (caller holds
 * pace_ev_mu). */
int pace_bursts_use(const struct ctx_events *c);

/* What pacing did in this process, for the debug log at exit (all on slow paths). */
struct pace_stats {
	_Atomic int64_t samples[2], idle[2], idle_ns[2], busy_ns[2], set_aside, met, probed, off_ns;
	_Atomic int64_t waits, wait_syncs, holds, held_ns, restarts, conserved;
	_Atomic int64_t bursts, bursts_skipped, bounded, credited_ns, long_chains, owed_ns, returned_ns, sliced_ns,
		forfeit_ns, turns_let_off, sync_ends, reopens, refilled_ns, dropped_ns;
};
extern struct pace_stats pace_stat;
#define PSTAT_ADD(f, v) atomic_fetch_add_explicit(&pace_stat.f, (v), memory_order_relaxed)

#endif

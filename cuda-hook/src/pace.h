/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pacing's internal header: what pacing.c (the allowance, the bursts), pace_measure.c
 * (the launch samples and per-kernel estimates) and pace_turns.c (the use of the GPU's
 * turns) share. Nothing outside the three includes it; each keeps its own state
 * static. What pacing.c and pace_measure.c alone share is in pace_measure.h.
 */
#ifndef TESSERA_PACE_H
#define TESSERA_PACE_H

#include <stdatomic.h>
#include <stdint.h>

#include "region.h"
#include "tessera_cuda.h"
#include "turns.h"

/* The disjoint spans of a burst's queue held busy that its launch samples prove
 * (tessera_pacer.busy). A host at the GPU's pace has a sample queued through tens of
 * times a burst once samples are in flight side by side; kept to 8, the rest of its
 * busy time went unproved and was taken for idle (the fake's `hostmix130` at cap 80:
 * 91.7-92.5 %, 83.2-83.3 % with 128). */
#define BUSY_SPANS 128

/* This process's view of one GPU's pacing. The burst fields belong to the slow path
 * and are used under the shared pacer's lock. */
struct tessera_pacer {
	struct tessera_shared_pacer *s;
	_Atomic int enabled; /* paced now (a container without cores: while its share is under 100) */
	int64_t slot_off_ns, slot_len_ns; /* the container's refill point and allowance per period */
	int work_conserving;              /* the limits' work-conserving line, and the GPU is paced */
	/* The GPU's turns (turns.h), NULL where the node provides none; whether this
	 * process holds the turn, and until when it takes none (a wait for it ran out). */
	struct tessera_turn *turn;
	int turn_held;
	int64_t turn_used_ns; /* when this process last took the turn */
	int64_t turn_off_until_ns;

	/* The launches between two waits for a refill, or between two refills (a burst):
	 * event S (ev_s) before the first, F (ev_f) after the last; their GPU time against
	 * what they were charged. */
	int slept;          /* this process waited for a refill since the last burst began */
	int burst_started;  /* S is recorded: a burst is open */
	int fence_pending;  /* F is recorded and not yet read */
	int chained;        /* the open burst began at F */
	int ev_s, ev_f;     /* which of the context's events are S and F */
	void *burst_ctx;    /* the events (of one context) S was recorded with */
	uint64_t burst_ctx_gen;
	CUstream burst_stream;
	int64_t burst_t0_ns, burst_charged0, burst_all0;
	/* When the open burst is chained at the next launch that takes tokens from the
	 * container (chain_long_burst): LONG_BURST_NS of host time after it began, or
	 * a little after a try that found the burst before it not yet read. */
	_Atomic int64_t chain_at_ns;
	/* The process's launches and their charges at S (pace_tally.h), where known
	 * (burst_tally; with the charge line only). */
	int burst_tally;
	uint64_t burst_launch0;
	int64_t burst_cost0;
	/* What bursts that did not begin at a refill had forgiven of another context's
	 * turns in the period forgive_k (settle_burst). */
	int64_t forgive_k, forgiven_ns;
	/* The program synchronized and its burst ended there: its next launch opens one
	 * (pacing.c, tessera_pacing_synced). */
	_Atomic int reopen;
	/* The ended burst, until F is read: host time, this process's charges and the
	 * container's. */
	int64_t f_host_ns, f_charged, f_all, f_at_ns;
	int f_other;
	int f_class; /* a launch of the ended burst was charged its class's estimate */
	int f_classes;
	int64_t f_launches; /* its launches, -1 where not known */
	/* The open (ended) burst began at the container's refill, after a wait for it: it
	 * is a slot burst, which its slot's length holds. */
	int burst_at_refill, f_at_refill;
	/* The open (ended) burst held the GPU's turn from its S (to its F). */
	int burst_turn, f_turn;
	int burst_probed; /* the context's turns are probed while the open burst runs */
	/* The program's waits for its work (synchronizes, synchronous copies) that the
	 * open burst goes on through: threads waiting now (sync_depth, since sync_t0),
	 * the host time in which some thread waited (burst_sync_ns) and how many such
	 * spells ended (burst_syncs); the ended burst's (f_sync_ns, f_syncs). */
	int sync_depth;
	int64_t sync_t0, burst_sync_ns, burst_syncs, f_sync_ns, f_syncs;
	/* What the refills dropped over the cap on banked tokens while the open (ended)
	 * burst ran: allowance its launches, charged less than they ran, had in fact
	 * spent (settle_burst). */
	int64_t burst_dropped_ns, f_dropped_ns;
	/* How far the GPU was behind the host (ns) at the open burst's S and at the
	 * ended burst's S; -1 when not known. */
	int64_t lag_s_ns, f_lag_s_ns;
	/* That lag is no more than the GPU's (S drained, or S at the F of a burst on one
	 * stream, whose elapsed time is its own): a floor the bound of its GPU time may
	 * take (settle_burst). */
	int lag_s_sure, f_lag_s_sure;
	/* Read by every launch: the open burst's stream + 1, or 0; the one other stream a
	 * launch of the burst went to + 1 (0: none, TESSERA_OTHER_MANY: more than one); and
	 * whether one was charged its class's estimate (its kernel has no entry of its
	 * own) or an entry still on its first samples. */
	_Atomic uintptr_t burst_stream_tag;
	_Atomic uintptr_t other_stream;
	_Atomic int class_charged;
	/* With the charge line: the classes (1 << cls) the open burst launched, so that a
	 * burst moves the gain of those alone (f_classes: the ended burst's). */
	_Atomic int burst_classes;
	/* With the charge line, whether the GPU waited for the host inside a burst (it
	 * then did not run back to back, whatever its queue at F): each burst's number
	 * (burst_seq, a new one at every S, under pace_ev_mu), whether the open burst's
	 * S was recorded by begin_burst, on a drained stream (burst_fresh, under
	 * pace_ev_mu; not a burst chained at an F), the ended burst's number (f_seq), and
	 * the last two bursts in which a launch sample found the burst's only stream
	 * idle (gap_seq, gap_seq_before; pace_burst_sample: a burst's sample may be read
	 * after the next burst's, which chained at its F). */
	uint64_t burst_seq, f_seq;
	int burst_fresh;
	_Atomic uint64_t gap_seq, gap_seq_before;
	/* The open burst's S: which of the context's events (ev_s where begin_burst
	 * recorded it, ev_f where the burst chained at an F; under pace_ev_mu). And for
	 * the last two bursts (by burst_seq & 1, under pace_ev_mu), what their launch
	 * samples say of the GPU's queue: a sample launched a after S on the host, whose
	 * start event ran g after S on the GPU, shows the burst's stream not drained from
	 * a to g + the lag at S (host time after S; pace_burst_busy, settle_burst). Up to
	 * BUSY_SPANS spans a burst, in the order of their samples. */
	int open_s_ev;
	struct {
		uint64_t seq;
		int n;
		int64_t a[BUSY_SPANS], g[BUSY_SPANS];
	} busy[2];
	/* A burst of two streams: event X (ev_x) after the last launch on the stream F is
	 * not on, so that S to the later of F and X bounds both streams' work. xp: the
	 * last X recorded (event ev_xp, on stream xp_stream - 1, of the events of
	 * xp_gen), which work launched on that stream since runs after; f_x_stream: the
	 * ended burst's X's stream + 1 (0: one stream), f_xp: its start on that stream
	 * was xp (f_xp_ev; -1: S, where S found its stream idle). */
	int ev_x, ev_xp;
	uintptr_t xp_stream, f_x_stream;
	uint64_t xp_gen;
	int f_x_ev, f_xp_ev;

	/* A container granted no cores on this GPU, whose share directory the node agent
	 * mounted: paced to the GPU's unreserved share (share.h), re-read at most every
	 * TESSERA_SHARE_REREAD_NS under the shared pacer's lock; the last share read well
	 * (share_ok), and when the file was last read. */
	int share_dynamic;
	int share_ok, share_pct, share_phase;
	_Atomic int64_t share_read_ns;
#ifdef TESSERA_SHARED_LOSS
	/* The shared-loss trial (turns.h): the window's start, the container's charges,
	 * the process's holds and sliced time then, and the part of its allowance kept. */
	int64_t share_t0, share_charged0, share_holds0, share_sliced0;
	int share_keep_pm;
#endif
	/* Slot bursts, and those that would have forfeited, in the current window and the
	 * one before it (pacing.c, forfeit_frequent; under s->mu). */
	int64_t fw_t0;
	int fw_bursts[2], fw_would[2];
};

#define TESSERA_OTHER_MANY UINTPTR_MAX

/* Another context was seen on the GPU this recently (ns): the GPU is contended. */
#define CONTENDED_NS (2 * 1000000000LL)
/* How much of a burst's overrun may be another context's turn: the driver's time
 * slice between busy contexts is of this order (ms). */
#define TIME_SLICE_NS 2000000LL

/* ---- pace_measure.c, for the turns (and pacing.c) ---- */
/* The longest launch estimated: the two classes' estimates and the longest
 * per-kernel entry in use. */
int64_t pace_est_longest(void);
/* Another context has been seen on the GPU lately, or has work there now. */
int pace_contended(void);

/* ---- pacing.c, for the turns ---- */
/* What a container that takes the GPU's turns keeps beyond one period's allowance. */
int64_t pace_turn_bank(void);
void pace_sleep_until(int64_t t);
/* The ended burst's F event; 0 when its context's events are gone. */
int pace_burst_fence(struct tessera_pacer *p, CUevent *f);

/* ---- pace_turns.c: the GPU's turns, on pacing's slow path (under the shared
 * pacer's lock, but for pace_turn_wait and pace_turn_finish) ---- */
void pace_turns_setup(const char *cgroup);
/* Whether the next burst takes the GPU's turn. */
int pace_turn_use(struct tessera_pacer *p, int64_t now);
/* Takes the turn if it is free (then pace_turn_took); 0 if another holds it. */
int pace_turn_try(struct tessera_pacer *p);
void pace_turn_took(struct tessera_pacer *p, int64_t now);
/* Waits for the turn (without the pacer's lock). */
void pace_turn_wait(struct tessera_pacer *p);
/* Another container waits for the turn this process holds. */
int pace_turn_wanted(struct tessera_pacer *p, int64_t now);
/* The burst is over: the turn goes to whoever waits once the GPU has run it. */
void pace_turn_finish(struct tessera_pacer *p);
/* Lets the turn go if this process holds it (the process ends). */
void pace_turn_release(struct tessera_pacer *p);
#ifdef TESSERA_SHARED_LOSS
/* Says what the container got in the window and whether it was short; returns the
 * part of its cap (per mille) it keeps. */
int pace_turn_share(struct tessera_pacer *p, int64_t now, int cap_pm, int got_pm, int short_pm);
#endif
/* This container's slot bursts forfeit often: says so in the GPU's turn file and
 * returns whether another container there said so too (pacing.c, forfeit_frequent);
 * -1 where the GPU has no turn file. */
int pace_turn_forfeits(struct tessera_pacer *p, int64_t now);
/* The turns' counts, in the debug log's pacing summary. */
void pace_turns_summary(void);

#endif

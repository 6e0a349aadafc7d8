/* SPDX-License-Identifier: Apache-2.0 */
/* Compute pacing (pacing.c): each container's share of a GPU's time. */
#ifndef TESSERA_PACING_H
#define TESSERA_PACING_H

#include <stdatomic.h>
#include <stdint.h>

#include "region.h"
#include "tessera_cuda.h"
#include "turns.h"

#define TESSERA_PACING_PERIOD_NS 20000000LL /* api.PacingPeriodMicros */

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
	/* The ended burst, until F is read: host time, this process's charges and the
	 * container's. */
	int64_t f_host_ns, f_charged, f_all, f_at_ns;
	int f_other;
	int f_class; /* a launch of the ended burst was charged its class's estimate */
	/* The open (ended) burst began at the container's refill, after a wait for it: it
	 * is a slot burst, which its slot's length holds. */
	int burst_at_refill, f_at_refill;
	/* The open (ended) burst held the GPU's turn from its S (to its F). */
	int burst_turn, f_turn;
	int burst_probed; /* the context's turns are probed while the open burst runs */
	/* How far the GPU was behind the host (ns) at the open burst's S and at the
	 * ended burst's S; -1 when not known. */
	int64_t lag_s_ns, f_lag_s_ns;
	/* Read by every launch: the open burst's stream + 1, or 0; the one other stream a
	 * launch of the burst went to + 1 (0: none, TESSERA_OTHER_MANY: more than one); and
	 * whether one was charged its class's estimate (its kernel has no entry of its
	 * own) or an entry still on its first samples. */
	_Atomic uintptr_t burst_stream_tag;
	_Atomic uintptr_t other_stream;
	_Atomic int class_charged;
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
};

/* What the launch hook needs after the driver's launch: whether it is a sample. */
#define TESSERA_OTHER_MANY UINTPTR_MAX

struct tessera_pace_ticket {
	int sampled;
	int cls;
	struct tessera_pacer *p;
	void *ev; /* the sample's events */
	int64_t t_start_ns;
	int waited; /* the launch waited for a refill: its stream had drained */
};

void tessera_pacing_setup(void);
/* cls: 0 kernel launches, 1 graph launches (their GPU time is estimated apart); key:
 * the launch's function or executable graph, whose own estimate it is charged once
 * sampled (0: its class's). */
void tessera_pace(CUstream stream, int cls, uintptr_t key, struct tessera_pace_ticket *t);
void tessera_pace_done(CUstream stream, struct tessera_pace_ticket *t, CUresult launched);
/* A context is gone: its events with it. */
void tessera_pacing_forget_ctx(CUcontext ctx);
void tessera_pacing_after_fork(void);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* Compute pacing (pacing.c; what launches cost, pace_measure.c): each container's share
 * of a GPU's time. */
#ifndef TESSERA_PACING_H
#define TESSERA_PACING_H

#include <stdatomic.h>
#include <stdint.h>

#include "tessera_cuda.h"

#define TESSERA_PACING_PERIOD_NS 20000000LL /* api.PacingPeriodMicros */

/* What the launch hook needs after the driver's launch: whether it is a sample. */
struct tessera_pacer;
struct tessera_pace_ticket {
	int sampled;
	int cls;
	struct tessera_pacer *p;
	void *ev;  /* the sample's context's events */
	int slot;  /* its sample slot (pace_measure.c) */
	int64_t t_start_ns;
	int waited; /* the launch waited for a refill: its stream had drained */
	/* The launch opened its burst (S was recorded right before it), or the hook waited
	 * for a launch sample before it: its stream's being idle says nothing of the
	 * program's host. */
	int opened;
};

void tessera_pacing_setup(void);
/* cls: 0 kernel launches, 1 graph launches (their GPU time is estimated apart); key:
 * the launch's function or executable graph, whose own estimate it is charged once
 * sampled (0: its class's). */
void tessera_pace(CUstream stream, int cls, uintptr_t key, struct tessera_pace_ticket *t);
/* After the driver's launch (launched: what it returned); only a sample has more to
 * do (pace_measure.c), so the others pay one load. */
void tessera_pace_done_slow(CUstream stream, struct tessera_pace_ticket *t, CUresult launched);
static inline void tessera_pace_done(CUstream stream, struct tessera_pace_ticket *t, CUresult launched)
{
	if (t->sampled)
		tessera_pace_done_slow(stream, t, launched);
}
/* The program is about to wait for its work on the current GPU (a context, stream or
 * event synchronize, a synchronous copy): the burst being measured ends here with the
 * charge line, or goes on and counts the wait (pacing.c). Returns the GPU whose burst
 * ended, or -1; tessera_pacing_synced(gpu) after the wait reads it (and ends the
 * counted wait, whatever it is given). */
int tessera_pacing_sync(void);
void tessera_pacing_synced(int gpu);
/* A query (cuStreamQuery, cuEventQuery) found work done: the program's wait by
 * polling ends there, as tessera_pacing_sync and tessera_pacing_synced end and read a
 * burst at a synchronize, without waiting for anything. */
void tessera_pacing_polled(void);
/* A context is gone: its events with it (pace_measure.c). */
void tessera_pacing_forget_ctx(CUcontext ctx);
/* A stream is being destroyed: pacing records nothing on it from now on (a burst that
 * launched on it is no longer measured), and it is no stream's start mark. */
void tessera_pacing_forget_stream(CUstream stream);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* When this process's context was off the GPU: another context's time slices on a
 * time-sliced GPU, read from probe events on an idle stream (residency.c). */
#ifndef TESSERA_RESIDENCY_H
#define TESSERA_RESIDENCY_H

#include <stdint.h>

#include "tessera_cuda.h"

/* Probing of the context for one purpose (who: TESSERA_RESIDENCY_SAMPLE, _BURST): with
 * open set, from now until the next call for it; with an event, until that event has
 * completed; with neither, no longer. Probing runs (on a thread of the hook's) while
 * some purpose holds it, and stops within a second of the last call in any case. */
#define TESSERA_RESIDENCY_SAMPLE 0
#define TESSERA_RESIDENCY_BURST 1
#define TESSERA_RESIDENCY_HOLDS 2
void tessera_residency_hold(CUcontext ctx, int who, int open, CUevent until);
/* The time between two completed events of the context (a before b) during which the
 * context was off the GPU, in ns; -1 when the probes did not cover that time. turns
 * (may be NULL) gets how many spells off the GPU that time holds: each is read to
 * within TESSERA_RESIDENCY_TURN_ERR_NS either way. */
int64_t tessera_residency_off(CUcontext ctx, CUevent a, CUevent b, int *turns);
/* Half a probe step (residency.c). */
#define TESSERA_RESIDENCY_TURN_ERR_NS 125000LL
/* The event is about to be destroyed: no hold waits for it any longer. */
void tessera_residency_unhold(CUevent until);
/* Returns once the probing thread is in no driver call; it makes none while a capture
 * is counted (tessera.captures). */
void tessera_residency_quiesce(void);
/* The context is gone, or the process forked: forget it. */
void tessera_residency_forget(CUcontext ctx);
/* When a probe last waited for the context's turn (monotonic ns; 0: never). */
int64_t tessera_residency_late_seen_ns(void);
/* Probe counts for the pacing summary. */
void tessera_residency_stats(int64_t *probes, int64_t *late, int64_t *covered, int64_t *uncovered);

#endif

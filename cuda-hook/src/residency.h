/* When this process's context was off the GPU: another context's time slices on a
 * time-sliced GPU, read from probe events on an idle stream (residency.c). */
#ifndef TESSERA_RESIDENCY_H
#define TESSERA_RESIDENCY_H

#include <stdint.h>

#include "tessera_cuda.h"

/* Keeps probing the context for at least for_ns from now (probing starts, on a thread
 * of the hook's, if it had stopped). Cheap when already probing. */
void tessera_residency_arm(CUcontext ctx, int64_t for_ns);
/* The time between two completed events of the context (a before b) during which the
 * context was off the GPU, in ns; -1 when the probes did not cover that time. */
int64_t tessera_residency_off(CUcontext ctx, CUevent a, CUevent b);
/* The context is gone, or the process forked: forget it. */
void tessera_residency_forget(CUcontext ctx);
void tessera_residency_after_fork(void);
/* When a probe last waited for the context's turn (monotonic ns; 0: never). */
int64_t tessera_residency_late_seen_ns(void);
/* Probe counts for the pacing summary. */
void tessera_residency_stats(int64_t *probes, int64_t *late, int64_t *covered, int64_t *uncovered);

#endif

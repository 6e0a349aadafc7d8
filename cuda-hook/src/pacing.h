/* Compute pacing (pacing.c): each container's share of a GPU's time. */
#ifndef TESSERA_PACING_H
#define TESSERA_PACING_H

#include <stdint.h>

#include "region.h"
#include "tessera_cuda.h"

#define TESSERA_PACING_PERIOD_NS 20000000LL /* api.PacingPeriodMicros */

/* This process's view of one GPU's pacing. */
struct tessera_pacer {
	struct tessera_shared_pacer *s;
	int enabled;
	int64_t slot_off_ns, slot_len_ns; /* the container's window in each period */
};
void tessera_pacing_setup(void);
void tessera_pace(CUstream stream);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* Memory accounting (memory.c): every allocation path, and the memory info shown. */
#ifndef TESSERA_MEMORY_H
#define TESSERA_MEMORY_H

#include <stdint.h>

#include "tessera_cuda.h"

/* Reserves bytes on gpu against its limit, giving back what pools have trimmed
 * before refusing. */
CUresult tessera_reserve(int gpu, uint64_t bytes);
/* Everything cached memory the hook counts (stream-ordered and graph pools) settled on
 * what the driver holds; returns the bytes given back. */
uint64_t tessera_memory_settle(int gpu);
/* A context's teardown (context.c): the allocation map locked across the driver's
 * call, so that an allocation recorded before it took the lock was made before the
 * teardown and went with it, and one made after is recorded after. Between the two,
 * tessera_memory_forget_ctx_locked gives back what the map holds of ctx (allocations,
 * arrays; a pool's allocations leave its count to the pool's settling; managed memory
 * only with managed_too, for a teardown seen to free it) and returns the bytes. */
void tessera_memory_lock(void);
void tessera_memory_unlock(void);
uint64_t tessera_memory_forget_ctx_locked(CUcontext ctx, int managed_too);

#endif

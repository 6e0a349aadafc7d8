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

#endif

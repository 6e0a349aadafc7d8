/* SPDX-License-Identifier: Apache-2.0 */
/* What the fake driver lets a test see about itself (fake/fake_cuda.c). */
#ifndef TESSERA_FAKE_STATS_H
#define TESSERA_FAKE_STATS_H

#include <stdint.h>

struct fake_cuda_stats {
	uint64_t used[8];      /* device memory held, per device, by this process */
	uint64_t peak[8];      /* the most ever held at once */
	uint64_t all_used[8];  /* held by every process of the FAKE_CUDA_TALLY file (else this one) */
	uint64_t all_peak[8];  /* the most they ever held at once */
	uint64_t busy_ns;      /* simulated GPU time held so far: kernels, and FAKE_CUDA_GAP_NS gaps */
	uint64_t syncs;        /* cuCtxSynchronize calls */
	uint64_t bad_syncs;    /* cuCtxSynchronize calls made during a stream capture */
	uint64_t launches;     /* launches executed (not captured) */
	uint64_t event_calls;  /* cuEventRecord and cuEventQuery calls */
	uint64_t kernel_ns;    /* simulated kernel time executed so far */
	uint64_t memsets;      /* cuMemsetD32Async calls executed (not captured) */
	uint64_t legacy_events; /* cuEventRecord calls on stream 0 (the legacy default stream) */
};

/* Exported by the fake libcuda.so.1 under this name; not a driver function. */
typedef void (*fake_cuda_stats_fn)(struct fake_cuda_stats *out);
/* fake_cuda_free_all: frees every allocation of the process, as a context reset
 * (cudaDeviceReset) frees the program's memory and any the hook made in it. */
typedef void (*fake_cuda_free_all_fn)(void);

#endif

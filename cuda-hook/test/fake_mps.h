/* SPDX-License-Identifier: Apache-2.0 */
/* What the fake driver saw of MPS (fake/fake_cuda.c). */
#ifndef TESSERA_FAKE_MPS_H
#define TESSERA_FAKE_MPS_H

struct fake_cuda_mps {
	/* The MPS variables as the driver read them at cuInit ("(unset)" if absent). */
	char pipe[256], percent[256], pinned[256];
	int enabled;          /* the pipe directory held a "control" entry at cuInit */
	unsigned int ctx_sms; /* the last SM count a context was created with (0: none) */
};

/* Exported by the fake libcuda.so.1 under this name; not a driver function. */
typedef void (*fake_cuda_mps_fn)(struct fake_cuda_mps *out);

#endif

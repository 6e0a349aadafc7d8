/* SPDX-License-Identifier: Apache-2.0 */
/*
 * MPS clients (mps.c): a container whose limits file has an mps line is a client of
 * its GPU's MPS server. The server divides the SMs by each client's
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, which the driver reads from the process's
 * environment: the tenant's to change. The hook therefore sets the client's MPS
 * variables from the read-only limits file before the driver starts, refuses CUDA
 * when the driver did not connect to the MPS server, and holds execution-affinity
 * requests to the granted SMs.
 */
#ifndef TESSERA_MPS_H
#define TESSERA_MPS_H

#include "tessera_cuda.h"

/* Sets CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the tenant's own
 * value where it is lower than the grant) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from
 * the limits. Called before the driver is loaded, and again before each context is
 * created; writes the environment only where it differs. No-op without an mps line. */
void tessera_mps_env(void);

/* After the driver's cuInit: CUDA_SUCCESS, or CUDA_ERROR_MPS_CONNECTION_FAILED when
 * one of the container's GPUs is not shared through MPS (the process would have a
 * context of its own, which nothing divides). */
CUresult tessera_mps_check(void);

/* The most SMs a context on the driver's device dev may ask for through execution
 * affinity: the MPS client's own SM count; 0 means no bound (no mps line, or the
 * count cannot be read). */
unsigned int tessera_mps_sm_cap(CUdevice dev);

/* After an MPS client created a context with execution affinity on dev (and made it
 * current): 1 when it has more SMs than tessera_mps_sm_cap, or either count cannot be
 * read; the context is then destroyed and the caller makes a plain one. */
int tessera_mps_too_wide(CUdevice dev, CUcontext ctx);

/* The execution-affinity parameters a context on dev is created with: in itself, or
 * (for an MPS client) a copy in copy[0..max) whose SM counts are held to
 * tessera_mps_sm_cap. More than max parameters are refused. */
CUresult tessera_mps_affinity(CUdevice dev, CUexecAffinityParam *in, int n, CUexecAffinityParam *copy, int max,
			      CUexecAffinityParam **use);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-container limits file (format: api/limits.go, the reference). This reader
 * must accept and reject exactly what the Go reader does; test/limits_vectors.c runs
 * both against api/testdata/limits.
 */
#ifndef TESSERA_LIMITS_H
#define TESSERA_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define TESSERA_LIMITS_VERSION 1
#define TESSERA_MAX_GPUS 64             /* api.MaxGPUsPerContainer */
#define TESSERA_MAX_UUID 128
#define TESSERA_MAX_CGROUP 4096         /* api.MaxCgroupPathBytes */
#define TESSERA_MAX_LIMITS_BYTES 65536  /* api.MaxLimitsBytes */
#define TESSERA_MAX_MEMORY_MIB (16ULL << 20)  /* api.MaxMemoryMiB */
#define TESSERA_MAX_CONTEXT_MIB 65536   /* api.MaxContextMiB */
#define TESSERA_MAX_MPS_PIPE 80         /* api.MaxMPSPipeDirBytes */
#define TESSERA_MAX_REGION_DIR 128      /* api.MaxRegionDirBytes */

struct tessera_gpu_limit {
	char uuid[TESSERA_MAX_UUID + 1];
	uint64_t memory_mib;
	int cores;
	int phase;
};

struct tessera_limits {
	char cgroup[TESSERA_MAX_CGROUP + 1];
	uint64_t context_mib;
	/* The region line: the directory of the container's accounting region, "" for
	 * the default (TESSERA_SHM_DIR). */
	char region_dir[TESSERA_MAX_REGION_DIR + 1];
	/* The charge line: each launch is charged its own kernel's estimate times its
	 * class's gain (pacing.c); 0 for the class estimator. */
	int charge_kernel;
	int ngpus;
	struct tessera_gpu_limit gpus[TESSERA_MAX_GPUS];
	/* The mps line: 0 when there is none, else the client's share of the SMs in
	 * percent (1..100), and its MPS pipe directory as the container sees it. */
	int mps_percent;
	char mps_pipe[TESSERA_MAX_MPS_PIPE + 1];
	/* The work-conserving line: the container may use idle GPU time beyond its cores
	 * while no other context on the GPU has work (pacing.c). */
	int work_conserving;
};

/* Writes a diagnostic to err[0..errlen), cut short where it does not fit (a message
 * naming long paths may be truncated, never overflow), and returns -1. */
int tessera_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Parses buf[0..len). Returns 0, or -1 with a message naming the line in err. */
int tessera_limits_parse(const char *buf, size_t len, struct tessera_limits *out, char *err, size_t errlen);

/* Reads and parses the file at path (at most TESSERA_MAX_LIMITS_BYTES). */
int tessera_limits_load(const char *path, struct tessera_limits *out, char *err, size_t errlen);

/* Writes the canonical form (what api.EncodeLimits writes). Returns the length, or
 * -1 if buf is too small. */
int tessera_limits_format(const struct tessera_limits *l, char *buf, size_t len);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Diagnostic builds only (HOOK_CFLAGS=-DTESSERA_PACE_TRACE, in a build directory of
 * their own; gpu/pace-trace.sh): what pacing measured and charged, kernel by kernel.
 * Each launch adds its charge to its kernel's row, each launch sample its span as read
 * (raw), the host's time it set aside for an idle stream, and what was folded; the
 * rows are written, with the kernels' names, to the file TESSERA_PACE_TRACE names when
 * the process ends. Set beside the profiler's kernel times (the same program's kernels
 * by name) it says which launches are charged more or less than they take. The
 * production build has none of it.
 */
#ifndef TESSERA_PACE_TRACE_H
#define TESSERA_PACE_TRACE_H

#include <stdint.h>

/* The function of the launch being paced (a kernel's key mixes in its grid): set by
 * the launch hooks (launch.c), read when a kernel's row is made. */
#ifdef TESSERA_PACE_TRACE
extern __thread uintptr_t tessera_trace_fn_now __attribute__((tls_model("initial-exec")));
#define TRACE_FN(f) (tessera_trace_fn_now = (uintptr_t)(f))
/* The key of the launch being paced (tessera_pace, pacing.c), which its launch sample
 * keeps for its row (pace_measure.c). */
extern __thread uintptr_t tessera_trace_key_now __attribute__((tls_model("initial-exec")));
/* A sample read (pace_measure.c) into its kernel's row (below, in pacing.c). */
void tessera_trace_sample(uintptr_t key, int cls, int64_t raw, int64_t gap, int64_t off, int64_t folded);
#define trace_sample tessera_trace_sample
#else
#define TRACE_FN(f) ((void)0)
#define trace_sample(key, cls, raw, gap, off, folded) ((void)0)
#endif

/* The rows and what fills them (trace_launch, trace_sample), in the one file that
 * defines TESSERA_PACE_TRACE_ROWS before it includes this (pacing.c); the samples are
 * read in pace_measure.c, which calls trace_sample through its declaration above. */
#ifdef TESSERA_PACE_TRACE_ROWS
#ifdef TESSERA_PACE_TRACE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TRACE_ROWS 4096
static struct trace_row {
	uintptr_t key;
	int cls;
	char name[96];
	int64_t launches, charged_ns;
	int64_t samples, idle, raw_ns, gap_ns, folded_ns, min_ns, max_ns, first_ns, met, off_ns;
} trace_rows[TRACE_ROWS];
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;
__thread uintptr_t tessera_trace_fn_now __attribute__((tls_model("initial-exec")));
__thread uintptr_t tessera_trace_key_now __attribute__((tls_model("initial-exec")));

/* The row of key, made on first use (caller holds trace_mu); key 0 is the launches
 * without a handle, one row per class. */
static struct trace_row *trace_row_of(uintptr_t key, int cls)
{
	uintptr_t k = key != 0 ? key : (uintptr_t)(cls + 1);
	unsigned i = (unsigned)(((uint64_t)k * 0x9e3779b97f4a7c15ULL) >> 52) % TRACE_ROWS;
	for (int n = 0; n < TRACE_ROWS; n++, i = (i + 1) % TRACE_ROWS) {
		if (trace_rows[i].key == k)
			return &trace_rows[i];
		if (trace_rows[i].key == 0) {
			trace_rows[i].key = k;
			trace_rows[i].cls = cls;
			trace_rows[i].min_ns = INT64_MAX;
			if (key == 0)
				snprintf(trace_rows[i].name, sizeof trace_rows[i].name, "(no handle, class %d)", cls);
			else if (cls == 1)
				snprintf(trace_rows[i].name, sizeof trace_rows[i].name, "(graph %#lx)", (unsigned long)key);
			else {
				/* A runtime-launched kernel's handle may be a CUkernel (a library's,
				 * context-independent), which cuKernelGetName names. */
				typedef CUresult (*name_fn)(const char **, void *);
				static name_fn fn, kfn;
				if (fn == NULL) {
					fn = (name_fn)dlsym(tessera.libcuda, "cuFuncGetName");
					kfn = (name_fn)dlsym(tessera.libcuda, "cuKernelGetName");
				}
				const char *nm = NULL;
				void *h = (void *)tessera_trace_fn_now;
				if ((fn == NULL || fn(&nm, h) != CUDA_SUCCESS || nm == NULL) &&
				    (kfn == NULL || kfn(&nm, h) != CUDA_SUCCESS || nm == NULL))
					nm = "?";
				snprintf(trace_rows[i].name, sizeof trace_rows[i].name, "%s", nm);
			}
			return &trace_rows[i];
		}
	}
	return NULL;
}

static void trace_launch(uintptr_t key, int cls, int64_t cost)
{
	pthread_mutex_lock(&trace_mu);
	struct trace_row *r = trace_row_of(key, cls);
	if (r != NULL) {
		r->launches++;
		r->charged_ns += cost;
	}
	pthread_mutex_unlock(&trace_mu);
}

/* A sample read: raw is the events' span, gap the host time set aside (idle stream),
 * off another context's turns the probes saw, folded what the estimate took (-1: set
 * aside as another context's turn). */
void tessera_trace_sample(uintptr_t key, int cls, int64_t raw, int64_t gap, int64_t off, int64_t folded)
{
	pthread_mutex_lock(&trace_mu);
	struct trace_row *r = trace_row_of(key, cls);
	if (r != NULL) {
		r->samples++;
		r->raw_ns += raw;
		if (gap > 0) {
			r->idle++;
			r->gap_ns += gap;
		}
		if (off > 0)
			r->off_ns += off;
		if (folded < 0) {
			r->met++;
		} else {
			r->folded_ns += folded;
			if (r->samples - r->met == 1)
				r->first_ns = folded;
			r->min_ns = folded < r->min_ns ? folded : r->min_ns;
			r->max_ns = folded > r->max_ns ? folded : r->max_ns;
		}
	}
	pthread_mutex_unlock(&trace_mu);
}

__attribute__((destructor)) static void trace_write(void)
{
	const char *path = getenv("TESSERA_PACE_TRACE");
	if (path == NULL)
		return;
	FILE *f = fopen(path, "a");
	if (f == NULL)
		return;
	fprintf(f, "# pid %d: key cls launches charged_ns samples idle raw_ns gap_ns folded_ns min_ns max_ns first_ns met off_ns name\n",
		(int)getpid());
	for (int i = 0; i < TRACE_ROWS; i++) {
		struct trace_row *r = &trace_rows[i];
		if (r->key == 0)
			continue;
		fprintf(f, "%#lx %d %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %s\n", (unsigned long)r->key,
			r->cls, (long long)r->launches, (long long)r->charged_ns, (long long)r->samples, (long long)r->idle,
			(long long)r->raw_ns, (long long)r->gap_ns, (long long)r->folded_ns,
			(long long)(r->min_ns == INT64_MAX ? 0 : r->min_ns), (long long)r->max_ns, (long long)r->first_ns,
			(long long)r->met, (long long)r->off_ns, r->name);
	}
	fclose(f);
}
#else
#define trace_launch(key, cls, cost) ((void)0)
#endif
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the launch fast path's parts cost on this machine: the TSC read, the vDSO
 * clock, an atomic decrement on a shared-memory line and pthread_once's done check,
 * each in ns per call (median of 9 runs of 1,000,000). A paced launch reads no clock
 * on the fast path (a thread spends tokens it took in batches, src/pacing.c); the
 * slow path and the launch samples read the vDSO clock (src/clock.h). The TSC read is
 * measured beside it for machines where a hypervisor traps RDTSC, which makes it cost
 * microseconds and rules it out as a clock.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define N 1000000
static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}
static volatile uint64_t sink;
static _Atomic int64_t *shared;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void nothing(void) {}

#define MEASURE(label, body)                                                   \
	do {                                                                   \
		double r[9];                                                   \
		for (int k = 0; k < 9; k++) {                                  \
			int64_t t0 = now_ns();                                 \
			for (int i = 0; i < N; i++) {                          \
				body;                                          \
			}                                                      \
			r[k] = (double)(now_ns() - t0) / N;                    \
		}                                                              \
		qsort(r, 9, sizeof(r[0]), cmp);                                \
		printf("%s=%.2f ", label, r[4]);                               \
	} while (0)

int main(void)
{
	shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		return 1;
	printf("clockcost ns/call: ");
	MEASURE("empty", sink++);
#if defined(__x86_64__)
	MEASURE("rdtsc", sink += __rdtsc());
#endif
	MEASURE("clock_gettime", sink += (uint64_t)now_ns());
	MEASURE("atomic_fetch_sub_shared", sink += (uint64_t)atomic_fetch_sub_explicit(shared, 1, memory_order_relaxed));
	MEASURE("pthread_once_done", pthread_once(&once, nothing));
	printf("\n");
	return 0;
}

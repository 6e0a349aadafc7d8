/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Graph memory nodes (graph.c). A launch or upload of an executable graph that
 * allocates reserves its allocations first and settles on what the driver mapped
 * after; tessera_graph_execs counts such graphs so that the others pay one load.
 */
#ifndef TESSERA_GRAPH_H
#define TESSERA_GRAPH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "limits.h"
#include "tessera_cuda.h"

struct tessera_graph_ticket {
	int any;
	uint64_t exec;
	uint64_t held[TESSERA_MAX_GPUS];
};
extern _Atomic size_t tessera_graph_execs;
CUresult tessera_graph_admit_slow(CUgraphExec exec, struct tessera_graph_ticket *t);
void tessera_graph_admitted_slow(const struct tessera_graph_ticket *t, CUresult rc);
static inline CUresult tessera_graph_admit(CUgraphExec exec, struct tessera_graph_ticket *t)
{
	t->any = 0;
	if (atomic_load_explicit(&tessera_graph_execs, memory_order_relaxed) == 0)
		return CUDA_SUCCESS;
	return tessera_graph_admit_slow(exec, t);
}
static inline void tessera_graph_admitted(const struct tessera_graph_ticket *t, CUresult rc)
{
	if (t->any)
		tessera_graph_admitted_slow(t, rc);
}
/* Counts the graph pools at what the driver reserves; returns the bytes given back. */
uint64_t tessera_graph_settle(int gpu);

#endif

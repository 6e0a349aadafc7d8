/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a forked child does to the hook's state (fork.c). A child starts with no CUDA
 * state of its own: the parent's allocations, context charges, events and accounting
 * slot are the parent's. Each part of the hook that keeps such state registers its own
 * handler when the library loads (a constructor of its file), in its place in this
 * order; init.c has them run in the child, in this order, once the hook is set up.
 */
#ifndef TESSERA_FORK_H
#define TESSERA_FORK_H

enum tessera_fork_order {
	TESSERA_FORK_REGION,       /* region.c: this process's accounting slot */
	TESSERA_FORK_MEMORY,       /* memory.c: allocations and pools */
	TESSERA_FORK_CONTEXT,      /* context.c: contexts, limits, modules */
	TESSERA_FORK_GRAPH,        /* graph.c: graphs and their memory */
	TESSERA_FORK_RESIDENCY,    /* residency.c: the probing thread and its context */
	TESSERA_FORK_PACE_TALLY,   /* pace_tally.c: the threads' launch tallies */
	TESSERA_FORK_PACING,       /* pacing.c: bursts, charges, gain, counts */
	TESSERA_FORK_PACE_MEASURE, /* pace_measure.c: events, samples, estimates */
	TESSERA_FORK_PACE_TURNS,   /* pace_turns.c: the turns' counts */
	TESSERA_FORK_N
};

/* Registers child as the handler of its place (one each). */
void tessera_on_fork(enum tessera_fork_order at, void (*child)(void));
/* Runs the registered handlers in order; in a forked child. */
void tessera_fork_child(void);

#endif

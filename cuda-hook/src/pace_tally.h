/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tally (pace_tally.c): what every thread of the process has launched while paced
 * and what those launches were charged, each thread counting its own with plain
 * stores (no locked instruction on the launch path), read whole at a burst's ends. A
 * burst's launches may come from several threads (PyTorch's autograd engine launches
 * a training step's backward pass from a thread of its own while the step's thread
 * waits, then synchronizes), and its charge is what all of them were charged.
 * Included by pacing.c alone.
 */
#ifndef TESSERA_PACE_TALLY_H
#define TESSERA_PACE_TALLY_H

#include <stdatomic.h>
#include <stdint.h>

#ifndef TLS_IE /* as pace_measure.h: a plain load from the thread pointer */
#define TLS_IE __attribute__((tls_model("initial-exec")))
#endif

struct pace_tally {
	_Atomic int64_t cost;      /* GPU ns charged, launch by launch */
	_Atomic uint64_t launches; /* paced launches */
	int state;                 /* 0: not yet in the registry, 1: in it, -1: no room */
};

extern __thread struct pace_tally pace_tally_local TLS_IE;

/* Puts the calling thread's tally in the registry (its first paced launch). */
void pace_tally_register(void);

/* The sums over every thread, those that have exited included; -1 where a thread's
 * launches are not in them (more launching threads than the registry holds). */
int pace_tally_sum(int64_t *cost, uint64_t *launches);

/* This thread's launch, charged cost. Only the thread itself writes its tally, so a
 * load and a store suffice; readers load each field whole. */
static inline void pace_tally_add(int64_t cost)
{
	struct pace_tally *t = &pace_tally_local;
	if (__builtin_expect(t->state == 0, 0))
		pace_tally_register();
	atomic_store_explicit(&t->cost, atomic_load_explicit(&t->cost, memory_order_relaxed) + cost,
			      memory_order_relaxed);
	atomic_store_explicit(&t->launches, atomic_load_explicit(&t->launches, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

#endif

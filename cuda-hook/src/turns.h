/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPU turns (turns.c): the paced containers on one GPU take turns on it, one burst at
 * a time, instead of leaving the driver to time-slice their work. Used where a
 * container's kernels are longer than a time slice (docs/cuda-hook.md, "GPU turns").
 *
 * One 4096-byte file per GPU (api.TurnFileBytes), named by the GPU's UUID in the turns
 * directory that the node agent mounts read-write into every paced container on the
 * node (api.ContainerTurnsDir). Every tenant on the GPU can write it: nothing in it
 * raises a container's share (that is its own allowance, in its own region), and every
 * wait on it is bounded, so a tenant that damages it or holds the turn costs its
 * neighbours at most a bounded wait, after which they go back to plain time-slicing;
 * one that cuts the file short makes them stop taking turns (turns.c guards every
 * access to the mapping). All zeroes is a free turn.
 */
#ifndef TESSERA_TURNS_H
#define TESSERA_TURNS_H

#include <stdatomic.h>
#include <stdint.h>

#ifndef TESSERA_TURNS_DIR
#define TESSERA_TURNS_DIR "/run/tessera-turns" /* api.ContainerTurnsDir */
#endif
#define TESSERA_TURN_FILE_BYTES 4096 /* api.TurnFileBytes */

/* Containers whose slot bursts forfeit often (pacing.c, forfeit_frequent), each with
 * when it last said so: a container whose own slot bursts would forfeit often is let
 * off all of the other contexts' turns in them unless another container on the GPU
 * says so too (a saturating neighbour, held to its slot by the same rule, so the two
 * settle apart); a neighbour that is rarely held keeps to no slot, and forfeiting for
 * its work only costs the one that forfeits. Any tenant can write it: a word here
 * keeps a neighbour under the rule as it was before (half of the turns let off, up to
 * 1 ms a burst), and erasing the words lets a neighbour off all of the turns its
 * probes measured; neither changes what its own launches are charged or forfeit. */
#define TESSERA_TURN_FORFEITERS 8
/* A container's word in the file, and when it last said it (an entry no container
 * spoke in for 2 s is free). */
struct tessera_turn_word {
	_Atomic uint64_t id;
	_Atomic int64_t at_ns;
};

#ifdef TESSERA_SHARED_LOSS
/* The shared-loss trial (a diagnostic build, -DTESSERA_SHARED_LOSS; docs/cuda-hook.md,
 * "Known gaps"): each paced container's word, every SHARE_WINDOW_NS, on its cap, what
 * it was charged of the GPU's time (per mille) and whether it was short: under its
 * cap, never held by its allowance, and cut by other contexts' turns for at least its
 * shortfall. Any tenant can write it: what a container reads from it lowers its own
 * allowance by TESSERA_SHARE_FLOOR_PM at most. */
#define TESSERA_TURN_SHARES 16
#define TESSERA_SHARE_FLOOR_PM 900
#define TESSERA_SHARE_SATURATED_PM 850
struct tessera_turn_share {
	struct tessera_turn_word w;
	_Atomic int32_t cap_pm, got_pm, short_pm;
	int32_t pad;
};
#endif

struct tessera_turn {
	_Atomic uint64_t owner;    /* 0: free; else the holding container's id */
	_Atomic int64_t until_ns;  /* the holder says its turn ends by then (monotonic ns) */
	_Atomic uint32_t seq;      /* bumped at every release: the waiters' futex word */
	uint32_t pad;
	_Atomic uint64_t last_owner;  /* who took it last */
	_Atomic int64_t taken_ns;     /* and when */
	_Atomic int64_t released_ns;  /* the last release */
	_Atomic uint64_t waiter;      /* a container waiting for it */
	_Atomic int64_t waiting_ns;   /* when it last said so */
	_Atomic int64_t long_seen_ns; /* when a container of long kernels last took the turn */
	struct tessera_turn_word forfeiters[TESSERA_TURN_FORFEITERS];
#ifdef TESSERA_SHARED_LOSS
	struct tessera_turn_share shares[TESSERA_TURN_SHARES];
#endif
};

/* The turn of the GPU with this UUID, mapped; NULL (with the reason logged at debug
 * level) where the node provides none. */
struct tessera_turn *tessera_turn_open(const char *uuid);

/* The container's id in turns: never 0. */
uint64_t tessera_turn_id(const char *cgroup);

/* Takes the turn for container me, saying it ends within hold_ns; waits while another
 * holds it, until it is free, or its holder overruns its word by TESSERA_TURN_GRACE_NS
 * (it is taken over then: the holder may have died). Gives up when the turn has not
 * changed hands for stuck_ns (a holder that never lets go), or after
 * TESSERA_TURN_WAIT_MAX_NS in all (others that never let this one in). Returns 1 when
 * taken without waiting, 2 when taken after a wait, 0 when it gave up; *waited_ns:
 * how long it waited. */
#define TESSERA_TURN_GRACE_NS 2000000LL
#define TESSERA_TURN_WAIT_MAX_NS 1000000000LL
/* No holder says it keeps the turn longer than this: a word further ahead (a file
 * left from before a reboot, whose clock started again, or a tenant's) is void, and
 * so are the file's other times ahead of now. */
#define TESSERA_TURN_HOLD_MAX_NS 100000000LL
int tessera_turn_take(struct tessera_turn *t, uint64_t me, int64_t hold_ns, int64_t stuck_ns, int64_t *waited_ns);
/* Takes it only if free (or me already), and not just released by me while another
 * waits; 1 on success. */
int tessera_turn_try(struct tessera_turn *t, uint64_t me, int64_t hold_ns);
/* Releases it if me still holds it, and wakes the waiters. */
void tessera_turn_release(struct tessera_turn *t, uint64_t me);
/* Another container waited for the turn within the last 5 ms. */
int tessera_turn_wanted(const struct tessera_turn *t, uint64_t me, int64_t now);
/* Another container took or waited for the turn within window_ns. */
int tessera_turn_others(const struct tessera_turn *t, uint64_t me, int64_t now, int64_t window_ns);
/* A container of long kernels said, within window_ns, that it takes turns. */
int tessera_turn_long(const struct tessera_turn *t, int64_t now, int64_t window_ns);
/* This container of long kernels takes the turn now. */
void tessera_turn_say_long(struct tessera_turn *t, int64_t now);
/* Container me's slot bursts forfeit often (now). */
void tessera_turn_say_forfeits(struct tessera_turn *t, uint64_t me, int64_t now);
/* Another container said within window_ns that its slot bursts forfeit often. */
int tessera_turn_others_forfeit(const struct tessera_turn *t, uint64_t me, int64_t now, int64_t window_ns);
#ifdef TESSERA_SHARED_LOSS
/* Container me's word: its cap, what it got (per mille of the GPU's time) and how far
 * short of its cap it was kept by others' turns (0: not short). */
void tessera_turn_share_say(struct tessera_turn *t, uint64_t me, int64_t now, int cap_pm, int got_pm, int short_pm);
/* The part of its cap (per mille, TESSERA_SHARE_FLOOR_PM to 1000) container me keeps:
 * what the GPU's containers that spoke within the last second got together, where
 * another of them was short; else 1000. */
int tessera_turn_share_keep(const struct tessera_turn *t, uint64_t me, int64_t now);
#endif
/* A turn file mapped by this process was cut short (every call above then returns
 * what it would for no turns): the process takes no turns. */
int tessera_turn_broken(void);

#endif

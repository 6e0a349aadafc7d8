/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pacing's use of the GPU's turns (turns.h, docs/cuda-hook.md "GPU turns"): which
 * bursts take the turn, how long they hold it, the wait for it and its hand-off once
 * the GPU has run the burst. Called on pacing's slow path (pacing.c, through pace.h).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "clock.h"
#include "fork.h"
#include "log.h"
#include "pace.h"
#include "state.h"
#include "turns.h"

/* GPU turns (turns.h): the container's id in them. Launches estimated at TURN_MIN_NS
 * or more (longer than the driver's time slice, so that two busy contexts' kernels
 * are cut by each other's turns) take turns on the GPU while another context is on
 * it; any paced container's bursts do while such a container says it takes turns. A
 * wait for the turn is given up when the turn has not changed hands for
 * TURN_MAX_WAIT_NS (a holder that never lets go), or after TESSERA_TURN_WAIT_MAX_NS in
 * all, and the GPU's turns are then not taken for TURN_OFF_NS. */
static uint64_t turn_me;
#define TURN_MIN_NS 2000000LL
#define TURN_MAX_WAIT_NS TESSERA_TURN_HOLD_MAX_NS
#define TURN_OFF_NS (30 * 1000000000LL)
/* A container's word that its slot bursts forfeit often holds this long. */
#define FORFEITS_SAID_NS (2 * 1000000000LL)

/* What the turns did in this process, for the debug log at exit. */
static struct {
	_Atomic int64_t turns, turn_waits, turn_wait_ns, turn_handoffs, turn_gave_up;
} tstat;
#define TSTAT_ADD(f, v) atomic_fetch_add_explicit(&tstat.f, (v), memory_order_relaxed)

void pace_turns_setup(const char *cgroup)
{
	turn_me = tessera_turn_id(cgroup);
}

/* Whether the next burst takes the GPU's turn. */
int pace_turn_use(struct tessera_pacer *p, int64_t now)
{
	if (p->turn == NULL || now < p->turn_off_until_ns || tessera_turn_broken())
		return 0;
	if (pace_est_longest() >= TURN_MIN_NS)
		return pace_contended() || tessera_turn_others(p->turn, turn_me, now, CONTENDED_NS);
	return tessera_turn_long(p->turn, now, CONTENDED_NS);
}

/* How long a burst that takes the turn holds it at most: the most tokens the
 * container can hold (refill), one launch past them and one more, and a time slice. */
static int64_t turn_hold(struct tessera_pacer *p)
{
	int64_t d = p->slot_len_ns + pace_turn_bank() + 2 * pace_est_longest() + TIME_SLICE_NS;
	return d < TURN_MAX_WAIT_NS ? d : TURN_MAX_WAIT_NS;
}

void pace_turn_took(struct tessera_pacer *p, int64_t now)
{
	p->turn_held = 1;
	p->turn_used_ns = now;
	TSTAT_ADD(turns, 1);
	if (pace_est_longest() >= TURN_MIN_NS)
		tessera_turn_say_long(p->turn, now);
}

/* Waits for the turn (without the pacer's lock). */
void pace_turn_wait(struct tessera_pacer *p)
{
	int64_t waited;
	int rc = tessera_turn_take(p->turn, turn_me, turn_hold(p), TURN_MAX_WAIT_NS, &waited);
	TSTAT_ADD(turn_waits, 1);
	TSTAT_ADD(turn_wait_ns, waited);
	if (rc != 0) {
		pace_turn_took(p, tessera_now_ns());
		return;
	}
	TSTAT_ADD(turn_gave_up, 1);
	p->turn_off_until_ns = tessera_now_ns() + TURN_OFF_NS;
	static _Atomic int logged;
	if (atomic_exchange(&logged, 1) == 0)
		tessera_log(TESSERA_LOG_WARN, "the GPU's turn was not let go for %lld ms, or not to this container for %lld ms; "
					      "its work is time-sliced with the others' for %lld s",
			    (long long)(TURN_MAX_WAIT_NS / 1000000), (long long)(TESSERA_TURN_WAIT_MAX_NS / 1000000),
			    (long long)(TURN_OFF_NS / 1000000000LL));
}

/* The burst is over: once the GPU has run it (its F), the turn goes to whoever waits.
 * The thread sleeps through most of the burst's charge first, then waits for F as
 * settle_burst does. */
void pace_turn_finish(struct tessera_pacer *p)
{
	if (p->fence_pending) {
		CUevent f;
		int ok = pace_burst_fence(p, &f);
		/* The burst should end its charge after S; the charge may run over its GPU
		 * time (an estimate still settling), so the thread sleeps half of what is
		 * left at a time, then polls every 50 us, and waits for F outright (as
		 * settle_burst does) only past TURN_MAX_WAIT_NS. */
		int64_t end = p->f_at_ns - p->f_host_ns + p->f_charged, t0 = tessera_now_ns();
		for (int64_t now = t0; ok && REAL(cuEventQuery)(f) == CUDA_ERROR_NOT_READY; now = tessera_now_ns()) {
			if (now - t0 > TURN_MAX_WAIT_NS) {
				REAL(cuEventSynchronize)(f);
				break;
			}
			int64_t d = (end - now) / 2;
			pace_sleep_until(now + (d < 50000 ? 50000 : d > 2000000 ? 2000000 : d));
		}
	}
	if (tessera_turn_wanted(p->turn, turn_me, tessera_now_ns()))
		TSTAT_ADD(turn_handoffs, 1);
	tessera_turn_release(p->turn, turn_me);
	p->turn_held = 0;
}

int pace_turn_try(struct tessera_pacer *p)
{
	return tessera_turn_try(p->turn, turn_me, turn_hold(p));
}

int pace_turn_wanted(struct tessera_pacer *p, int64_t now)
{
	return tessera_turn_wanted(p->turn, turn_me, now);
}

void pace_turn_release(struct tessera_pacer *p)
{
	if (p->turn_held && p->turn != NULL)
		tessera_turn_release(p->turn, turn_me);
}

void pace_turns_summary(void)
{
	if (atomic_load(&tstat.turns) + atomic_load(&tstat.turn_gave_up) > 0)
		tessera_log(TESSERA_LOG_DEBUG, "pacing summary turns=%lld turn_waits=%lld turn_wait_ns=%lld turn_handoffs=%lld turn_gave_up=%lld",
			    (long long)atomic_load(&tstat.turns), (long long)atomic_load(&tstat.turn_waits),
			    (long long)atomic_load(&tstat.turn_wait_ns), (long long)atomic_load(&tstat.turn_handoffs),
			    (long long)atomic_load(&tstat.turn_gave_up));
}

/* The child's counts start afresh, as pacing's do (the handlers of pacing.c and
 * pace_measure.c, just before). */
static void after_fork(void)
{
	memset(&tstat, 0, sizeof(tstat));
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_PACE_TURNS, after_fork);
}

int pace_turn_forfeits(struct tessera_pacer *p, int64_t now)
{
	if (p->turn == NULL || tessera_turn_broken())
		return -1;
	tessera_turn_say_forfeits(p->turn, turn_me, now);
	return tessera_turn_others_forfeit(p->turn, turn_me, now, FORFEITS_SAID_NS);
}

#ifdef TESSERA_SHARED_LOSS
int pace_turn_share(struct tessera_pacer *p, int64_t now, int cap_pm, int got_pm, int short_pm)
{
	if (p->turn == NULL || tessera_turn_broken())
		return 1000;
	tessera_turn_share_say(p->turn, turn_me, now, cap_pm, got_pm, short_pm);
	int keep = tessera_turn_share_keep(p->turn, turn_me, now);
	tessera_log(TESSERA_LOG_DEBUG, "pacing shared loss cap_pm=%d got_pm=%d short_pm=%d keep_pm=%d", cap_pm, got_pm,
		    short_pm, keep);
	return keep;
}
#endif

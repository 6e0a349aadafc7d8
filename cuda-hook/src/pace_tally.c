/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tally's registry (pace_tally.h): a thread's tally is listed from its first paced
 * launch until it exits, when its sums move to the exited threads' and it leaves the
 * list (a key's destructor, run before the thread's TLS is freed). The list is read and
 * changed under one mutex, at a burst's ends and a thread's first launch and exit,
 * never on the launch path.
 */
#include <pthread.h>

#include "fork.h"
#include "pace_tally.h"

#define TALLY_MAX 64

__thread struct pace_tally pace_tally_local TLS_IE;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct pace_tally *listed[TALLY_MAX];
static int n;
static int64_t exited_cost;
static uint64_t exited_launches;
static int unlisted; /* a thread found no room: the sums miss its launches */
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void thread_exit(void *v)
{
	struct pace_tally *t = v;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) {
		if (listed[i] == t) {
			exited_cost += atomic_load(&t->cost);
			exited_launches += atomic_load(&t->launches);
			listed[i] = listed[--n];
			break;
		}
	}
	pthread_mutex_unlock(&mu);
}

static void make_key(void)
{
	if (pthread_key_create(&key, thread_exit) != 0)
		key = (pthread_key_t)-1;
}

/* (pace_tally.h) */
void pace_tally_register(void)
{
	struct pace_tally *t = &pace_tally_local;
	pthread_once(&key_once, make_key);
	pthread_mutex_lock(&mu);
	/* Without a key its exit could not be seen, and the list would keep a freed TLS
	 * block: such a thread is not listed, and the sums say so. */
	if (n < TALLY_MAX && key != (pthread_key_t)-1 && pthread_setspecific(key, t) == 0) {
		listed[n++] = t;
		t->state = 1;
	} else {
		unlisted = 1;
		t->state = -1;
	}
	pthread_mutex_unlock(&mu);
}

/* (pace_tally.h) */
int pace_tally_sum(int64_t *cost, uint64_t *launches)
{
	pthread_mutex_lock(&mu);
	int64_t c = exited_cost;
	uint64_t l = exited_launches;
	for (int i = 0; i < n; i++) {
		c += atomic_load_explicit(&listed[i]->cost, memory_order_relaxed);
		l += atomic_load_explicit(&listed[i]->launches, memory_order_relaxed);
	}
	int ok = !unlisted;
	pthread_mutex_unlock(&mu);
	*cost = c;
	*launches = l;
	return ok ? 0 : -1;
}

/* A forked child has the forking thread alone: the list holds it (if it was listed),
 * the mutex is made afresh (another thread may have held it at the fork). */
static void after_fork(void)
{
	pthread_mutex_init(&mu, NULL);
	struct pace_tally *t = &pace_tally_local;
	n = 0;
	exited_cost = 0;
	exited_launches = 0;
	unlisted = t->state == -1;
	if (t->state == 1)
		listed[n++] = t;
}

__attribute__((constructor)) static void register_fork(void)
{
	tessera_on_fork(TESSERA_FORK_PACE_TALLY, after_fork);
}

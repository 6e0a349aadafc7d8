/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GPU turns (src/turns.c) on their own, without CUDA: opening the file, taking and
 * releasing the turn, waiting for it, taking it over from a holder that overran its
 * word or said too much, giving up on one that never lets go, and the hand-off to a
 * waiter; the words that a container's slot bursts forfeit often; the shared-loss
 * trial's words (built with TESSERA_SHARED_LOSS). Built with
 * the variant's TESSERA_TURNS_DIR; run.sh runs it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "turns.h"

static int fails;
#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			fails++;                                             \
		}                                                            \
	} while (0)

static void sleep_ns(int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
	nanosleep(&ts, NULL);
}

static void make_file(const char *name, off_t size)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", TESSERA_TURNS_DIR, name);
	unlink(p);
	int fd = open(p, O_CREAT | O_RDWR | O_TRUNC, 0666);
	if (fd < 0 || ftruncate(fd, size) != 0) {
		fprintf(stderr, "cannot make %s: %s\n", p, strerror(errno));
		exit(2);
	}
	close(fd);
}

enum { A = 0x0a01, B = 0x0b01 };

/* A holder that releases the turn after a while. */
struct later {
	struct tessera_turn *t;
	uint64_t who;
	int64_t after_ns;
	int64_t released_ns; /* the clock right before the release (read after the join) */
};
static void *release_later(void *arg)
{
	struct later *l = arg;
	sleep_ns(l->after_ns);
	l->released_ns = tessera_now_ns();
	tessera_turn_release(l->t, l->who);
	return NULL;
}
/* A holder that keeps saying it holds the turn, and never releases it. */
static volatile int hog_stop;
static void *hog(void *arg)
{
	struct tessera_turn *t = arg;
	while (!hog_stop) {
		atomic_store(&t->owner, (uint64_t)A);
		atomic_store(&t->until_ns, tessera_now_ns() + 20000000LL);
		sleep_ns(2000000);
	}
	return NULL;
}

/* The program's own SIGBUS handler, there before the hook's: a fault outside the
 * turn file must still reach it. */
static sigjmp_buf own_jump;
static volatile sig_atomic_t own_faults;
static void own_bus(int sig)
{
	(void)sig;
	own_faults++;
	siglongjmp(own_jump, 1);
}

int main(void)
{
	mkdir(TESSERA_TURNS_DIR, 0755);
	signal(SIGBUS, own_bus);

	/* Opening: only a regular file of the turn's size, named by a UUID. */
	make_file("GPU-small", 100);
	CHECK(tessera_turn_open("GPU-small") == NULL, "a 100-byte file was taken for a turn file");
	CHECK(tessera_turn_open("GPU-missing") == NULL, "a missing file was opened");
	CHECK(tessera_turn_open("../GPU-t") == NULL && tessera_turn_open("") == NULL, "a name with a path was opened");
	char d[512];
	snprintf(d, sizeof(d), "%s/GPU-dir", TESSERA_TURNS_DIR);
	mkdir(d, 0755);
	CHECK(tessera_turn_open("GPU-dir") == NULL, "a directory was opened");
	make_file("GPU-t", TESSERA_TURN_FILE_BYTES);
	struct tessera_turn *t = tessera_turn_open("GPU-t");
	CHECK(t != NULL, "the turn file was not opened");
	if (t == NULL)
		return 1;
	CHECK(tessera_turn_id("/a") != 0 && tessera_turn_id("/a") != tessera_turn_id("/b"), "ids");

	{
		/* Words that slot bursts forfeit often: another's counts, one's own does not,
		 * nor a stale one or one ahead of now; with every entry taken by others that
		 * spoke lately, a new container's word is not kept, and the others' count. */
		int64_t now = tessera_now_ns();
		CHECK(!tessera_turn_others_forfeit(t, A, now, 2000000000LL), "forfeits said with no words");
		tessera_turn_say_forfeits(t, A, now);
		CHECK(!tessera_turn_others_forfeit(t, A, now, 2000000000LL), "A's own word read as another's");
		CHECK(tessera_turn_others_forfeit(t, B, now, 2000000000LL), "A's word not seen by B");
		tessera_turn_say_forfeits(t, A, now);
		int entries = 0;
		for (int i = 0; i < TESSERA_TURN_FORFEITERS; i++)
			entries += atomic_load(&t->forfeiters[i].id) == A;
		CHECK(entries == 1, "A's words took %d entries", entries);
		CHECK(!tessera_turn_others_forfeit(t, B, now + 2500000000LL, 2000000000LL), "a stale word counts");
		tessera_turn_say_forfeits(t, B, now + 2500000000LL);
		CHECK(atomic_load(&t->forfeiters[0].id) == B, "B did not take A's stale entry");
		atomic_store(&t->forfeiters[0].at_ns, now + 3600 * 1000000000LL);
		CHECK(!tessera_turn_others_forfeit(t, A, now, 2000000000LL), "a word ahead of now counts");
		for (int i = 0; i < TESSERA_TURN_FORFEITERS; i++)
			tessera_turn_say_forfeits(t, 100 + i, now);
		tessera_turn_say_forfeits(t, A, now);
		CHECK(tessera_turn_others_forfeit(t, A, now, 2000000000LL), "the others' words lost");
		memset(t->forfeiters, 0, sizeof(t->forfeiters));
	}

#ifdef TESSERA_SHARED_LOSS
	{
		/* The shared-loss trial's words (the unit is built with it): a container keeps
		 * what the GPU's containers got together while another was short, only
		 * between 85 % and 100 % of the GPU, never under the floor, whatever is said. */
		int64_t now = tessera_now_ns();
		CHECK(tessera_turn_share_keep(t, A, now) == 1000, "kept less with no words");
		tessera_turn_share_say(t, A, now, 300, 301, 0);
		tessera_turn_share_say(t, B, now, 700, 587, 113);
		CHECK(tessera_turn_share_keep(t, A, now) == 900, "A beside a short B at 88.8 %% kept %d, want the floor",
		      tessera_turn_share_keep(t, A, now));
		CHECK(tessera_turn_share_keep(t, B, now) == 1000, "B kept less with no other short");
		tessera_turn_share_say(t, B, now, 700, 630, 70);
		CHECK(tessera_turn_share_keep(t, A, now) == 931, "A beside a short B at 93.1 %% kept %d",
		      tessera_turn_share_keep(t, A, now));
		tessera_turn_share_say(t, B, now, 700, 420, 280);
		CHECK(tessera_turn_share_keep(t, A, now) == 1000, "A gave up allowance where the GPU idled (72.1 %%)");
		/* Hostile words: out of range, many containers, or stale. */
		int lowest = 1000;
		for (int g = -5000; g <= 5000; g += 50) {
			tessera_turn_share_say(t, B, now, 700, g, 1);
			int k = tessera_turn_share_keep(t, A, now);
			lowest = k < lowest ? k : lowest;
		}
		CHECK(lowest >= TESSERA_SHARE_FLOOR_PM, "a neighbour's words cut A to %d per mille", lowest);
		for (uint64_t id = 100; id < 100 + 2 * TESSERA_TURN_SHARES; id += 2)
			tessera_turn_share_say(t, id, now, 100, 0, 1);
		CHECK(tessera_turn_share_keep(t, A, now) >= TESSERA_SHARE_FLOOR_PM, "many words cut A under the floor");
		int64_t later = now + 3000000000LL;
		CHECK(tessera_turn_share_keep(t, A, later) == 1000, "stale words still count");
		tessera_turn_share_say(t, A, later, 300, 300, 0);
		tessera_turn_share_say(t, 99, later, 700, 590, 110);
		CHECK(tessera_turn_share_keep(t, A, later) == 900, "a stale slot not taken by a new container");
		memset(t->shares, 0, sizeof(t->shares));
	}
#endif

	/* Free, taken, held by another, released by its holder only. */
	CHECK(tessera_turn_try(t, A, 50000000LL) == 1, "a free turn was not taken");
	CHECK(tessera_turn_try(t, A, 50000000LL) == 1, "the holder could not take its own turn again");
	CHECK(tessera_turn_try(t, B, 50000000LL) == 0, "a held turn was taken");
	uint32_t seq = atomic_load(&t->seq);
	tessera_turn_release(t, B);
	CHECK(atomic_load(&t->owner) == A && atomic_load(&t->seq) == seq, "another container released the turn");
	CHECK(tessera_turn_others(t, B, tessera_now_ns(), 2000000000LL), "B does not see that A took the turn");
	CHECK(!tessera_turn_others(t, A, tessera_now_ns(), 2000000000LL), "A sees itself as another");

	/* A waiter gets the turn when the holder releases it. */
	struct later l = {t, A, 20000000LL, 0};
	pthread_t th;
	pthread_create(&th, NULL, release_later, &l);
	int64_t waited, w0 = tessera_now_ns();
	int rc = tessera_turn_take(t, B, 50000000LL, 100000000LL, &waited);
	int64_t w1 = tessera_now_ns();
	pthread_join(th, NULL);
	CHECK(rc == 2 && atomic_load(&t->owner) == B, "the waiter did not get the released turn: %d", rc);
	/* Timed from the release itself: on a loaded machine either thread may start late. */
	CHECK(w1 >= l.released_ns && w1 - l.released_ns < 70000000LL, "took the turn %lld ns after its release",
	      (long long)(w1 - l.released_ns));
	CHECK(waited >= l.released_ns - w0 - 2000000LL && waited <= w1 - w0 + 1000000LL,
	      "said it waited %lld ns, %lld ns from the take's start to the release", (long long)waited,
	      (long long)(l.released_ns - w0));
	CHECK(atomic_load(&t->seq) == seq + 1, "the release did not bump the sequence word");
	CHECK(tessera_turn_wanted(t, A, tessera_now_ns()), "the wait was not seen by the holder");
	tessera_turn_release(t, B);
	/* B just let it go while A waited: B gives way for a while. */
	atomic_store(&t->waiter, (uint64_t)A);
	atomic_store(&t->waiting_ns, tessera_now_ns());
	CHECK(tessera_turn_try(t, B, 50000000LL) == 0, "the releaser took the turn back from a waiter");
	CHECK(tessera_turn_try(t, A, 50000000LL) == 1, "the waiter could not take the turn given way to it");
	tessera_turn_release(t, A);

	/* A holder that overruns its word by more than the grace is taken over. */
	CHECK(tessera_turn_try(t, A, 10000000LL) == 1, "take");
	int64_t t0 = tessera_now_ns();
	rc = tessera_turn_take(t, B, 50000000LL, 100000000LL, &waited);
	int64_t took = tessera_now_ns() - t0;
	CHECK(rc != 0 && atomic_load(&t->owner) == B, "an overrun holder was not taken over");
	CHECK(took >= 10000000LL && took < 60000000LL, "took over after %lld ns, want 12 ms", (long long)took);
	tessera_turn_release(t, B);

	/* A word further ahead than any holder may say is void: taken over at once. */
	atomic_store(&t->owner, (uint64_t)A);
	atomic_store(&t->until_ns, tessera_now_ns() + 3600 * 1000000000LL);
	t0 = tessera_now_ns();
	rc = tessera_turn_take(t, B, 50000000LL, 100000000LL, &waited);
	CHECK(rc != 0 && tessera_now_ns() - t0 < 5000000LL, "a word an hour ahead held the turn: %d after %lld ns", rc,
	      (long long)(tessera_now_ns() - t0));
	tessera_turn_release(t, B);
	/* So are the file's other times ahead of now. */
	atomic_store(&t->last_owner, (uint64_t)A);
	atomic_store(&t->taken_ns, tessera_now_ns() + 3600 * 1000000000LL);
	atomic_store(&t->waiting_ns, tessera_now_ns() + 3600 * 1000000000LL);
	atomic_store(&t->long_seen_ns, tessera_now_ns() + 3600 * 1000000000LL);
	CHECK(!tessera_turn_others(t, B, tessera_now_ns(), 2000000000LL), "a time ahead of now read as another container's");
	CHECK(!tessera_turn_wanted(t, B, tessera_now_ns()), "a wait ahead of now read as a wait");
	CHECK(!tessera_turn_long(t, tessera_now_ns(), 2000000000LL), "a long container's time ahead of now read as recent");
	atomic_store(&t->long_seen_ns, tessera_now_ns());
	CHECK(tessera_turn_long(t, tessera_now_ns(), 2000000000LL), "a long container's turn not seen");

	/* A holder that keeps renewing its word and never lets go: given up after the
	 * stuck time, and the turn is left to it. */
	hog_stop = 0;
	atomic_store(&t->owner, 0);
	pthread_create(&th, NULL, hog, t);
	/* Until the holder has said its word (on a loaded machine its thread may not
	 * run for milliseconds; a fixed wait of 3 ms let the turn be taken here). */
	for (int i = 0; i < 10000 && atomic_load(&t->owner) != (uint64_t)A; i++)
		sleep_ns(100000);
	t0 = tessera_now_ns();
	rc = tessera_turn_take(t, B, 50000000LL, 40000000LL, &waited);
	took = tessera_now_ns() - t0;
	hog_stop = 1;
	pthread_join(th, NULL);
	CHECK(rc == 0, "a turn never let go was taken: %d", rc);
	CHECK(took >= 35000000LL && took < 200000000LL, "gave up after %lld ns, want 40 ms", (long long)took);
	tessera_turn_release(t, A);

	/* Another tenant cuts the file short: every call returns what it would for no
	 * turns, the process stops taking them, and nothing crashes. */
	char p[512];
	snprintf(p, sizeof(p), "%s/GPU-t", TESSERA_TURNS_DIR);
	CHECK(!tessera_turn_broken(), "broken before the file was cut");
	CHECK(truncate(p, 0) == 0, "truncate");
	CHECK(tessera_turn_try(t, A, 50000000LL) == 0, "a turn taken in a file cut short");
	CHECK(tessera_turn_broken(), "a file cut short not noticed");
	CHECK(tessera_turn_take(t, A, 50000000LL, 40000000LL, &waited) == 0 && !tessera_turn_wanted(t, B, tessera_now_ns()) &&
		      !tessera_turn_others(t, B, tessera_now_ns(), 1000000000LL) && !tessera_turn_long(t, tessera_now_ns(), 1000000000LL),
	      "a broken turn answered");
	tessera_turn_release(t, A);
	tessera_turn_say_long(t, tessera_now_ns());
	/* A fault of the program's own, outside the turn file, goes to its handler. */
	make_file("own", 4096);
	snprintf(p, sizeof(p), "%s/own", TESSERA_TURNS_DIR);
	int fd = open(p, O_RDWR);
	volatile char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(m != MAP_FAILED && truncate(p, 0) == 0, "own mapping");
	if (sigsetjmp(own_jump, 1) == 0)
		m[0] = 1;
	CHECK(own_faults == 1, "the program's own SIGBUS reached its handler %d times, want once", (int)own_faults);

	if (fails == 0)
		printf("ok GPU turns: open, take, release, wait, take over, void words, give up, hand-off, a file cut short, "
		       "the words that slot bursts forfeit often, the shared-loss trial's words\n");
	return fails != 0;
}

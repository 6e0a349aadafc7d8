/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Damages a container's accounting region the way a process of the container could
 * (any of them can write it), for the fake-driver suite:
 *
 *   region_poke <region-file> magic            the magic number zeroed
 *   region_poke <region-file> slots-hw         slots_hw far past the slots, checksum left stale
 *   region_poke <region-file> slots-hw-sealed  the same with the checksum recomputed
 *   region_poke <region-file> used-sealed      a slot's usage set so that the sum wraps to 0
 *   region_poke <region-file> truncate         the file cut to one page
 *   region_poke <region-file> random           every byte random
 *   region_poke <region-file> pacer            every pacer field of GPU 0 out of range
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "region.h"

static int fail(const char *what)
{
	perror(what);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: region_poke <region-file> <mode>\n");
		return 2;
	}
	const char *mode = argv[2];
	int fd = open(argv[1], O_RDWR);
	if (fd < 0)
		return fail(argv[1]);
	if (strcmp(mode, "truncate") == 0)
		return ftruncate(fd, 4096) == 0 ? 0 : fail("ftruncate");
	struct tessera_region *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r == MAP_FAILED)
		return fail("mmap");
	if (strcmp(mode, "magic") == 0) {
		r->h.magic = 0;
	} else if (strcmp(mode, "slots-hw") == 0) {
		r->slots_hw = 0x7fffffff;
	} else if (strcmp(mode, "slots-hw-sealed") == 0) {
		r->slots_hw = 0x7fffffff;
		r->state_sum = tessera_region_state_sum(r);
	} else if (strcmp(mode, "used-sealed") == 0) {
		/* A second slot whose usage makes the container's total wrap around to 0. */
		uint64_t t = 0;
		int hw = r->slots_hw, spare = -1;
		for (int i = 0; i < hw && i < TESSERA_REGION_SLOTS; i++)
			if (r->slots[i].pid != 0)
				t += r->slots[i].used[0];
		for (int i = 0; i < TESSERA_REGION_SLOTS && spare < 0; i++)
			if (r->slots[i].pid == 0)
				spare = i;
		if (spare < 0)
			return fail("no spare slot");
		r->slots[spare].pid = getpid();
		r->slots[spare].used[0] = 0 - t;
		if (spare >= r->slots_hw)
			r->slots_hw = spare + 1;
		r->state_sum = tessera_region_state_sum(r);
	} else if (strcmp(mode, "random") == 0) {
		unsigned char *b = (unsigned char *)r;
		srand(42);
		for (size_t i = 0; i < sizeof(*r); i++)
			b[i] = (unsigned char)rand();
	} else if (strcmp(mode, "pacer") == 0) {
		struct tessera_shared_pacer *p = &r->pacers[0];
		atomic_store(&p->tokens, INT64_MIN);
		p->refill_k = INT64_MAX;
	} else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	return msync(r, sizeof(*r), MS_SYNC) == 0 ? 0 : fail("msync");
}

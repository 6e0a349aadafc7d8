/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device narrowing: which of the container's GPUs this process sees, from the tenant's
 * CUDA_VISIBLE_DEVICES, and that list handed to the driver before it loads.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "devices.h"
#include "log.h"
#include "state.h"

/* The index of the container GPU that the tenant's CUDA_VISIBLE_DEVICES entry tok
 * (len bytes) names, or -1: an ordinal of the container's view (the limits' order) or
 * a UUID, or a unique prefix of one, with or without its GPU-/MIG- prefix. */
static int visible_entry(const char *tok, size_t len)
{
	char t[TESSERA_MAX_UUID + 1];
	if (len == 0 || len > TESSERA_MAX_UUID)
		return -1;
	memcpy(t, tok, len);
	t[len] = '\0';
	char *end;
	long i = strtol(t, &end, 10);
	if (*end == '\0')
		return i >= 0 && i < tessera.limits.ngpus ? (int)i : -1;
	const char *p = tessera_uuid_body(t);
	size_t plen = strlen(p);
	int found = -1;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		const char *u = tessera_uuid_body(tessera.limits.gpus[g].uuid);
		if (plen > 0 && strncasecmp(u, p, plen) == 0) {
			if (found >= 0)
				return -1; /* ambiguous prefix */
			found = g;
		}
	}
	return found;
}

/*
 * Makes the driver itself show only the container's GPUs, in the limits' order, by
 * setting CUDA_VISIBLE_DEVICES to their UUIDs before the driver initialises. Hiding
 * them only in the hooked calls is not enough where the process can open more GPUs
 * than it was assigned (a node without NRI, standalone use): the CUDA 12/13 runtime
 * also counts devices through the driver's internal interfaces, finds a different
 * number and fails with "integrity checks failed" (cudaErrorIntegrityCheckFailed).
 * A value the tenant set narrows the container's view as CUDA would narrow a node's:
 * its entries are ordinals of the container's GPUs or their UUIDs, and the list ends
 * at the first entry that names none of them, or one named before.
 */
void tessera_narrow_visible_devices(void)
{
	static char out[TESSERA_MAX_GPUS * (TESSERA_MAX_UUID + 1) + 1];
	int *pick = tessera.view, n = 0;
	const char *want = getenv("CUDA_VISIBLE_DEVICES");
	if (want == NULL) {
		for (int g = 0; g < tessera.limits.ngpus; g++)
			pick[n++] = g;
	} else {
		for (const char *p = want; *p != '\0' && n < tessera.limits.ngpus;) {
			while (*p == ' ')
				p++;
			size_t len = strcspn(p, ",");
			size_t tl = len;
			while (tl > 0 && p[tl - 1] == ' ')
				tl--;
			int g = visible_entry(p, tl);
			int seen = 0;
			for (int i = 0; i < n; i++)
				seen |= pick[i] == g;
			if (g < 0 || seen)
				break;
			pick[n++] = g;
			p += len;
			if (*p == ',')
				p++;
		}
	}
	tessera.nview = n;
	size_t off = 0;
	out[0] = '\0';
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(out + off, sizeof(out) - off, "%s%s", i ? "," : "", tessera.limits.gpus[pick[i]].uuid);
	if (want == NULL || strcmp(want, out) != 0) {
		tessera_log(TESSERA_LOG_DEBUG, "CUDA_VISIBLE_DEVICES=%s (was %s)", out, want ? want : "unset");
		setenv("CUDA_VISIBLE_DEVICES", out, 1);
	}
}

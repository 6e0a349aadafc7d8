/* SPDX-License-Identifier: Apache-2.0 */
/* The fork handlers of the hook's parts, run in a forked child in a fixed order (fork.h). */
#include <stddef.h>

#include "fork.h"

/* Written by the constructors as the library loads, before any thread of the hook's
 * runs or any fork; read only in the child. */
static void (*handlers[TESSERA_FORK_N])(void);

void tessera_on_fork(enum tessera_fork_order at, void (*child)(void))
{
	if ((unsigned)at < TESSERA_FORK_N)
		handlers[at] = child;
}

void tessera_fork_child(void)
{
	for (int i = 0; i < TESSERA_FORK_N; i++)
		if (handlers[i] != NULL)
			handlers[i]();
}

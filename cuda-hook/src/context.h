/* SPDX-License-Identifier: Apache-2.0 */
/* Contexts, device limits and module loads charged against the limit (context.c). */
#ifndef TESSERA_CONTEXT_H
#define TESSERA_CONTEXT_H

void tessera_context_after_fork(void);

#endif

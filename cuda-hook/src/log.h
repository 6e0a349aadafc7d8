/* SPDX-License-Identifier: Apache-2.0 */
/* The hook's log (log.c): one line per message on stderr, key=value. */
#ifndef TESSERA_LOG_H
#define TESSERA_LOG_H

enum { TESSERA_LOG_ERROR, TESSERA_LOG_WARN, TESSERA_LOG_INFO, TESSERA_LOG_DEBUG };

/* Reads the verbosity from TESSERA_HOOK_LOG (info or debug; warn otherwise). */
void tessera_log_setup(void);
void tessera_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hook's log: one write per line on stderr, "tessera-cuda-hook: level=... pid=...
 * message". Warnings and errors by default; TESSERA_HOOK_LOG=info|debug shows more.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static int log_level = TESSERA_LOG_WARN;

void tessera_log(int level, const char *fmt, ...)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	char msg[1024];
	va_list ap;
	if (level > log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* One write per message so that lines from several threads do not interleave. */
	char line[1200];
	int n = snprintf(line, sizeof(line), "tessera-cuda-hook: level=%s pid=%d %s\n", names[level], (int)getpid(), msg);
	if (n > 0) {
		ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
		(void)w;
	}
}

void tessera_log_setup(void)
{
	const char *lv = getenv("TESSERA_HOOK_LOG"); /* verbosity only; it changes no limit */
	if (lv != NULL)
		log_level = strcmp(lv, "debug") == 0 ? TESSERA_LOG_DEBUG : strcmp(lv, "info") == 0 ? TESSERA_LOG_INFO : log_level;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node agent's reply on the fallback binding's socket, parsed apart from the socket
 * work so that it can be checked against the Go reader (bindserver.ParseReply) by the
 * differential fuzz in cuda-hook/difffuzz. Grammar: one packet holding exactly one
 * line, "ok <bytes>\n" (a decimal without sign or leading zero, 1 to
 * TESSERA_MAX_LIMITS_BYTES) or "error <reason>\n".
 */
#include "bind.h"

#include <string.h>

/* Copies src[0..n) into dst (at most len-1 bytes and a NUL), each byte outside
 * printable ASCII as '?': the agent's words end up in a log line. */
static void printable(char *dst, size_t len, const char *src, size_t n)
{
	if (len == 0)
		return;
	if (n > len - 1)
		n = len - 1;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)src[i];
		dst[i] = c < 0x20 || c > 0x7e ? '?' : (char)c;
	}
	dst[n] = '\0';
}

int tessera_bind_parse_reply(const char *buf, size_t n, size_t *size, char *msg, size_t msglen)
{
	if (n == 0 || buf[n - 1] != '\n' || memchr(buf, '\n', n - 1) != NULL) {
		tessera_fail(msg, msglen, "the node agent's answer is not one line");
		return TESSERA_REPLY_MALFORMED;
	}
	size_t len = n - 1;
	if (len >= 6 && memcmp(buf, "error ", 6) == 0) {
		printable(msg, msglen, buf + 6, len - 6);
		return TESSERA_REPLY_REFUSED;
	}
	if (len >= 4 && memcmp(buf, "ok ", 3) == 0 && buf[3] != '0' && len - 3 <= 10) {
		unsigned long long v = 0;
		size_t i = 3;
		for (; i < len && buf[i] >= '0' && buf[i] <= '9'; i++)
			v = v * 10 + (unsigned long long)(buf[i] - '0');
		if (i == len && v <= TESSERA_MAX_LIMITS_BYTES) {
			*size = (size_t)v;
			return TESSERA_REPLY_OK;
		}
	}
	char shown[101];
	printable(shown, sizeof(shown), buf, len);
	tessera_fail(msg, msglen, "the node agent's answer \"%s\" is not understood", shown);
	return TESSERA_REPLY_MALFORMED;
}

// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/api"
)

// RequiredSeals are the seals a limits memfd must carry.
const RequiredSeals = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// Fetch does what the CUDA hook does: it asks the agent at socket for the calling
// process's limits and returns the limits file's content, after checking that it came
// in a sealed memfd. A refusal is returned as an error holding the agent's reason.
// The agent's tests and tools use it; the hook has its own C client (cuda-hook/src/bind.c).
func Fetch(socket string, timeout time.Duration) ([]byte, error) {
	c, err := net.DialTimeout("unixpacket", socket, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(timeout))
	if _, err := uc.Write([]byte(Request)); err != nil {
		return nil, err
	}
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	kind, size, text := ParseReply(buf[:n])
	if kind != ReplyOK {
		return nil, errors.New(text)
	}
	if len(fds) != 1 {
		return nil, fmt.Errorf("agent reply came with %d descriptors, want 1", len(fds))
	}
	seals, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the seals: %w", err)
	}
	if seals&RequiredSeals != RequiredSeals {
		return nil, fmt.Errorf("the limits descriptor is not sealed (seals %#x)", seals)
	}
	data := make([]byte, size)
	if m, err := unix.Pread(fds[0], data, 0); err != nil || m != size {
		return nil, fmt.Errorf("reading the limits: %d of %d bytes, %v", m, size, err)
	}
	return data, nil
}

// ReplyKind is what a reply packet on the fallback socket says.
type ReplyKind int

const (
	// ReplyOK: the limits follow in the attached descriptor, this many bytes.
	ReplyOK ReplyKind = iota
	// ReplyRefused: the agent refused; the text is its reason.
	ReplyRefused
	// ReplyMalformed: not a reply the protocol allows; the text says so.
	ReplyMalformed
)

// ParseReply reads one reply packet: exactly one line, "ok <bytes>\n" (a decimal
// without sign or leading zero, 1 to api.MaxLimitsBytes) or "error <reason>\n". The
// reason and the text of a malformed reply have bytes outside printable ASCII shown as
// '?'. The hook's C reader (cuda-hook/src/bind_reply.c) must decide exactly the same;
// cuda-hook/difffuzz fuzzes the two against each other.
func ParseReply(b []byte) (kind ReplyKind, size int, text string) {
	n := len(b)
	if n == 0 || b[n-1] != '\n' || bytes.IndexByte(b[:n-1], '\n') >= 0 {
		return ReplyMalformed, 0, "the node agent's answer is not one line"
	}
	line := b[:n-1]
	if reason, ok := bytes.CutPrefix(line, []byte("error ")); ok {
		return ReplyRefused, 0, printable(reason)
	}
	if digits, ok := bytes.CutPrefix(line, []byte("ok ")); ok && len(digits) >= 1 && len(digits) <= 10 && digits[0] != '0' {
		v := 0
		for _, c := range digits {
			if c < '0' || c > '9' {
				v = -1
				break
			}
			v = v*10 + int(c-'0')
		}
		if v > 0 && v <= api.MaxLimitsBytes {
			return ReplyOK, v, ""
		}
	}
	shown := line
	if len(shown) > 100 {
		shown = shown[:100]
	}
	return ReplyMalformed, 0, "the node agent's answer \"" + printable(shown) + "\" is not understood"
}

// printable shows each byte outside printable ASCII as '?'.
func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}

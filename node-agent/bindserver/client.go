package bindserver

import (
	"errors"
	"fmt"
	"net"
	"strings"
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
	line := string(buf[:n])
	if !strings.HasSuffix(line, "\n") {
		return nil, fmt.Errorf("agent reply %q is not one line", line)
	}
	line = strings.TrimSuffix(line, "\n")
	if reason, ok := strings.CutPrefix(line, "error "); ok {
		return nil, errors.New(reason)
	}
	var size int
	if _, err := fmt.Sscanf(line, "ok %d", &size); err != nil || size <= 0 || size > api.MaxLimitsBytes {
		return nil, fmt.Errorf("agent reply %q is not understood", line)
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

// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package difffuzz

// The hook's own flags (cuda-hook/Makefile's CFLAGS_COMMON, less -fPIC and
// -fvisibility, which only matter for the shared library), so that the C compiled
// here is the C the hook runs.

/*
#cgo CFLAGS: -std=gnu11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -pthread
#cgo CFLAGS: -I${SRCDIR}/../src -I${SRCDIR}/../include -include ${SRCDIR}/../compat/glibc-2.28.h
#include "../src/limits.c"
#include "../src/bind_reply.c"
#include "../src/share.c"
#include "../src/region.h"

static size_t tessera_region_bytes(void) { return sizeof(struct tessera_region); }
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/tessera-dev/tessera/api"
)

// ParseLimits runs tessera_limits_parse over the n bytes at p and returns what it
// parsed, converted to the Go type, or the C reader's message. p must point to memory
// the C side may read n bytes of (and no more: see guardedCopy in the tests).
func ParseLimits(p unsafe.Pointer, n int) (*api.ContainerLimits, error) {
	out := (*C.struct_tessera_limits)(C.malloc(C.sizeof_struct_tessera_limits))
	defer C.free(unsafe.Pointer(out))
	var msg [300]C.char
	if C.tessera_limits_parse((*C.char)(p), C.size_t(n), out, &msg[0], C.size_t(len(msg))) != 0 {
		return nil, errors.New(C.GoString(&msg[0]))
	}
	l := &api.ContainerLimits{Cgroup: C.GoString(&out.cgroup[0]), ContextMiB: int64(out.context_mib),
		RegionDir: C.GoString(&out.region_dir[0]), ChargeKernel: out.charge_kernel != 0}
	for i := 0; i < int(out.ngpus); i++ {
		g := &out.gpus[i]
		l.GPUs = append(l.GPUs, api.GPULimit{
			UUID:      C.GoString(&g.uuid[0]),
			MemoryMiB: int64(g.memory_mib),
			Cores:     int(g.cores),
			Phase:     int(g.phase),
		})
	}
	if out.mps_percent > 0 {
		l.MPS = &api.MPSLimit{ThreadPercent: int(out.mps_percent), PipeDir: C.GoString(&out.mps_pipe[0])}
	}
	l.WorkConserving = out.work_conserving != 0
	return l, nil
}

// FormatLimits returns what tessera_limits_format writes for l (the canonical form),
// or an error when it does not fit the buffer.
func FormatLimits(l *api.ContainerLimits) ([]byte, error) {
	in := (*C.struct_tessera_limits)(C.calloc(1, C.sizeof_struct_tessera_limits))
	defer C.free(unsafe.Pointer(in))
	if len(l.Cgroup) > C.TESSERA_MAX_CGROUP || len(l.GPUs) > C.TESSERA_MAX_GPUS {
		return nil, errors.New("limits do not fit the C struct")
	}
	copyString(in.cgroup[:], l.Cgroup)
	if len(l.RegionDir) > C.TESSERA_MAX_REGION_DIR {
		return nil, errors.New("region directory does not fit the C struct")
	}
	copyString(in.region_dir[:], l.RegionDir)
	if l.ChargeKernel {
		in.charge_kernel = 1
	}
	in.context_mib = C.uint64_t(l.ContextMiB)
	in.ngpus = C.int(len(l.GPUs))
	for i, g := range l.GPUs {
		if len(g.UUID) > C.TESSERA_MAX_UUID {
			return nil, errors.New("uuid does not fit the C struct")
		}
		copyString(in.gpus[i].uuid[:], g.UUID)
		in.gpus[i].memory_mib = C.uint64_t(g.MemoryMiB)
		in.gpus[i].cores = C.int(g.Cores)
		in.gpus[i].phase = C.int(g.Phase)
	}
	if l.MPS != nil {
		if len(l.MPS.PipeDir) > C.TESSERA_MAX_MPS_PIPE {
			return nil, errors.New("mps pipe directory does not fit the C struct")
		}
		in.mps_percent = C.int(l.MPS.ThreadPercent)
		copyString(in.mps_pipe[:], l.MPS.PipeDir)
	}
	if l.WorkConserving {
		in.work_conserving = 1
	}
	const size = 1 << 17
	buf := (*C.char)(C.malloc(size))
	defer C.free(unsafe.Pointer(buf))
	n := C.tessera_limits_format(in, buf, size)
	if n < 0 {
		return nil, errors.New("tessera_limits_format: buffer too small")
	}
	return C.GoBytes(unsafe.Pointer(buf), n), nil
}

func copyString(dst []C.char, s string) {
	for i := 0; i < len(s); i++ {
		dst[i] = C.char(s[i])
	}
	dst[len(s)] = 0
}

// ParseReply runs tessera_bind_parse_reply over the n bytes at p: the reply's kind
// (C's TESSERA_REPLY_*), the limits' size for an ok reply, and the agent's reason or
// what is wrong otherwise.
func ParseReply(p unsafe.Pointer, n int) (kind, size int, text string) {
	var sz C.size_t
	var msg [400]C.char
	k := C.tessera_bind_parse_reply((*C.char)(p), C.size_t(n), &sz, &msg[0], C.size_t(len(msg)))
	if k == C.TESSERA_REPLY_OK {
		return int(k), int(sz), ""
	}
	return int(k), 0, C.GoString(&msg[0])
}

// ParseShare runs tessera_share_parse over the n bytes at p and returns the share and
// phase it read, or ok false where it rejects the input.
func ParseShare(p unsafe.Pointer, n int) (share, phase int, ok bool) {
	var out C.struct_tessera_share
	if C.tessera_share_parse((*C.char)(p), C.size_t(n), &out) != 0 {
		return 0, 0, false
	}
	return int(out.share), int(out.phase), true
}

// RegionBytes is the size of the hook's accounting region file.
func RegionBytes() int { return int(C.tessera_region_bytes()) }

// SPDX-License-Identifier: Apache-2.0

// Package difffuzz compiles the CUDA hook's C readers into a Go test binary through
// cgo, so that they can be fuzzed against the Go readers they must agree with: the
// hook's limits reader (cuda-hook/src/limits.c) against api.DecodeLimits, its reader
// of the node agent's reply on the fallback socket (cuda-hook/src/bind_reply.c)
// against bindserver.ParseReply, and its reader of a GPU's unreserved share file
// (cuda-hook/src/share.c) against api.DecodeShare. Without cgo the package is empty.
package difffuzz

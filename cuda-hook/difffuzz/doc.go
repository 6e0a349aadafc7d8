// Package difffuzz compiles the CUDA hook's C readers into a Go test binary through
// cgo, so that they can be fuzzed against the Go readers they must agree with: the
// hook's limits reader (cuda-hook/src/limits.c) against api.DecodeLimits. Without cgo
// the package is empty.
package difffuzz

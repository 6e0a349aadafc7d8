// SPDX-License-Identifier: Apache-2.0

// Package placement is the core of GPU placement: it decides where a pod's GPU
// containers go and keeps the GPU state that is decided against, and knows no policy.
// It holds every node's model (package nodemodel), every pod's grants and each
// node's usage across scheduling cycles (cache.go, nodetable.go), the allocation of a
// pod to a node's GPUs (allocate.go, sharing.go), the Placer interface and the
// Registry placers are built from (placer.go), and the scoring helpers the policies
// share (scoring.go).
//
// Each policy is a package under this one that implements Placer: binpack, spread
// and fragmentation. The core gives them opaque slots for what they keep: per pod
// for the cycle (PodInfo.State), per node across cycles (NodeEntry.LoadMemo), per
// placement (Allocation.Base, Measured and Scratch). Policies import the core, never
// the other way round, and no policy imports another.
//
// The TesseraGPUShare plugin (the parent package) is the framework adapter over it:
// it holds the extension points, the informers, the args and the metrics, and the
// Registry of the policies it offers. This package uses the scheduler framework's
// interface types (NodeInfo, status codes, ScoreExtensions) and none of its runtime.
package placement

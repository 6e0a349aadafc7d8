// Package placement decides where a pod's GPU containers go and keeps the GPU state
// that is decided against: every node's model (package nodemodel), every pod's grants
// and each node's usage across scheduling cycles (cache.go, nodetable.go), the
// allocation of a pod to a node's GPUs (allocate.go, sharing.go) and the placement
// policies, each a Placer (placer.go: binpack.go, spread.go, fragmentation.go with
// fitindex.go and pressure.go).
//
// The TesseraGPUShare plugin (the parent package) is the framework adapter over it:
// it holds the extension points, the informers, the args and the metrics. This
// package uses the scheduler framework's interface types (NodeInfo, status codes,
// ScoreExtensions) and none of its runtime.
package placement

// SPDX-License-Identifier: Apache-2.0

// Package fwk is the scheduler framework API as Tessera's plugins use it, for every
// Kubernetes minor Tessera builds a scheduler for (1.34 to 1.37). Every name here is an
// alias of the framework's own, so the plugin code is the same for each minor and its
// types are the framework's (tests and tools may mix this import and the upstream one).
//
// Where a name lives differs between minors: from 1.35 k8s.io/kube-scheduler/framework
// holds the whole plugin API; in 1.34 it holds the types in this file (Status,
// CycleState, NodeInfo, events, ...) while the plugin interfaces (Plugin, Handle,
// FilterPlugin, ...) are still in k8s.io/kubernetes/pkg/scheduler/framework. The build
// tag k8s1.34 picks plugins_k8s134.go over plugins.go; build/k8s-minors/README.md says
// how each minor is built. What differs in behaviour between minors, not only in where
// a name lives, is in files with the same tags beside the plugin code that uses it.
package fwk

import framework "k8s.io/kube-scheduler/framework"

// Names in k8s.io/kube-scheduler/framework in every supported minor.
type (
	Status               = framework.Status
	Code                 = framework.Code
	CycleState           = framework.CycleState
	StateKey             = framework.StateKey
	StateData            = framework.StateData
	NodeInfo             = framework.NodeInfo
	PodInfo              = framework.PodInfo
	ClusterEvent         = framework.ClusterEvent
	ClusterEventWithHint = framework.ClusterEventWithHint
	QueueingHint         = framework.QueueingHint
	EventResource        = framework.EventResource
	ActionType           = framework.ActionType
)

// Status codes.
const (
	Success                      = framework.Success
	Error                        = framework.Error
	Unschedulable                = framework.Unschedulable
	UnschedulableAndUnresolvable = framework.UnschedulableAndUnresolvable
	Skip                         = framework.Skip
)

// Queueing hints.
const (
	Queue     = framework.Queue
	QueueSkip = framework.QueueSkip
)

// Event resources and actions. AssignedPod, a resource of its own from 1.37, is
// bridged in the gpushare plugin's events files.
const (
	Node                 = framework.Node
	Pod                  = framework.Pod
	Add                  = framework.Add
	Delete               = framework.Delete
	UpdateNodeAnnotation = framework.UpdateNodeAnnotation
)

// NewStatus is framework.NewStatus.
func NewStatus(code Code, reasons ...string) *Status { return framework.NewStatus(code, reasons...) }

// AsStatus is framework.AsStatus.
func AsStatus(err error) *Status { return framework.AsStatus(err) }

// SPDX-License-Identifier: Apache-2.0

package noderesourcesfit

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// ignoreList is NodeResourcesFit's rule for the resources it does not check: extended
// resources named in ignoredResources or whose domain (the part before the slash) is in
// ignoredResourceGroups.
type ignoreList struct {
	resources sets.Set[string]
	groups    sets.Set[string]
	extended  *extendedNames
}

func newIgnoreList(args *config.NodeResourcesFitArgs) ignoreList {
	return ignoreList{resources: sets.New(args.IgnoredResources...), groups: sets.New(args.IgnoredResourceGroups...), extended: &extendedNames{}}
}

// extendedNames memoizes v1helper.IsExtendedResourceName, whose qualified-name check
// runs regular expressions (about 2 µs a name): PreFilter asks it of every listed
// resource in every request and limit of every pod, and a cluster uses a handful of
// names. Once about maxExtendedNames names are kept (concurrent callers may add a few
// more), new ones are checked every time.
type extendedNames struct {
	known sync.Map // v1.ResourceName -> bool
	n     atomic.Int32
}

const maxExtendedNames = 1024

func (e *extendedNames) is(name v1.ResourceName) bool {
	if v, ok := e.known.Load(name); ok {
		return v.(bool)
	}
	ok := v1helper.IsExtendedResourceName(name)
	if e.n.Load() < maxExtendedNames {
		if _, loaded := e.known.LoadOrStore(name, ok); !loaded {
			e.n.Add(1)
		}
	}
	return ok
}

func (l ignoreList) empty() bool { return l.resources.Len() == 0 && l.groups.Len() == 0 }

// has applies the same tests as NodeResourcesFit's fitsRequest: an extended resource
// that is listed or whose group is. The costly test, that the name is an extended
// resource, comes last and is memoized.
func (l ignoreList) has(name v1.ResourceName) bool {
	if l.empty() {
		return false
	}
	if !l.resources.Has(string(name)) {
		group, _, _ := strings.Cut(string(name), "/")
		if !l.groups.Has(group) {
			return false
		}
	}
	return l.extended.is(name)
}

// strip returns pod without the ignored resources in any container's, init
// container's or the pod's own requests and limits, or in its overhead. pod itself is
// returned when it has none; otherwise a copy that shares everything but the changed
// slices and resource lists, so the informer's object is never written.
func (l ignoreList) strip(pod *v1.Pod) *v1.Pod {
	if l.empty() || !l.anyIn(pod) {
		return pod
	}
	cp := *pod
	cp.Spec.Containers = l.stripContainers(pod.Spec.Containers)
	cp.Spec.InitContainers = l.stripContainers(pod.Spec.InitContainers)
	if pod.Spec.Resources != nil {
		r := l.stripRequirements(*pod.Spec.Resources)
		cp.Spec.Resources = &r
	}
	cp.Spec.Overhead = l.stripList(pod.Spec.Overhead)
	return &cp
}

func (l ignoreList) anyIn(pod *v1.Pod) bool {
	if pod.Spec.Resources != nil && l.inRequirements(*pod.Spec.Resources) {
		return true
	}
	if l.inList(pod.Spec.Overhead) {
		return true
	}
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if l.inRequirements(cs[i].Resources) {
				return true
			}
		}
	}
	return false
}

func (l ignoreList) inRequirements(r v1.ResourceRequirements) bool {
	return l.inList(r.Requests) || l.inList(r.Limits)
}

func (l ignoreList) inList(rl v1.ResourceList) bool {
	for name := range rl {
		if l.has(name) {
			return true
		}
	}
	return false
}

func (l ignoreList) stripContainers(cs []v1.Container) []v1.Container {
	if cs == nil {
		return nil
	}
	out := make([]v1.Container, len(cs))
	for i := range cs {
		out[i] = cs[i]
		out[i].Resources = l.stripRequirements(cs[i].Resources)
	}
	return out
}

func (l ignoreList) stripRequirements(r v1.ResourceRequirements) v1.ResourceRequirements {
	r.Requests = l.stripList(r.Requests)
	r.Limits = l.stripList(r.Limits)
	return r
}

// stripList returns rl without the ignored names; rl itself when it has none.
func (l ignoreList) stripList(rl v1.ResourceList) v1.ResourceList {
	var out v1.ResourceList
	for name := range rl {
		if l.has(name) {
			if out == nil {
				out = maps.Clone(rl)
			}
			delete(out, name)
		}
	}
	if out == nil {
		return rl
	}
	return out
}

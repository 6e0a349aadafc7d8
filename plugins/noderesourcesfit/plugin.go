// SPDX-License-Identifier: Apache-2.0

// Package noderesourcesfit is TesseraNodeResourcesFit: the in-tree NodeResourcesFit
// plugin, unchanged, given a copy of the pod without the resources its args tell it to
// ignore (ignoredResourceGroups, ignoredResources).
//
// NodeResourcesFit consults those ignore lists inside its per-node Filter, after an
// fmt.Sprintf and a qualified-name validation for every requested extended resource,
// so a pod asking for tessera.dev/* resources pays that on every node it is filtered
// against. This plugin removes the ignored resources once per scheduling cycle, in
// PreFilter, and hands the copy to NodeResourcesFit's PreFilter, Filter, PreScore and
// Score. Filter results, their reasons and scores are those of NodeResourcesFit with
// the same args; the queueing hints are NodeResourcesFit's, given the stripped pod too;
// everything else (SignPod, placement scoring) is NodeResourcesFit's own, promoted from
// the embedded plugin.
package noderesourcesfit

import (
	"bytes"
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Name is the plugin's name in scheduler profiles.
const Name = "TesseraNodeResourcesFit"

// stateKey is where PreFilter keeps the stripped pod for the rest of the cycle.
const stateKey fwk.StateKey = Name

// Plugin is NodeResourcesFit with the ignored resources removed from the pod once per
// cycle. Every method it does not define is NodeResourcesFit's.
type Plugin struct {
	*noderesources.Fit
	ignore ignoreList
	// scoreStripped is false when a scoring resource is also ignored: Score then sees
	// the pod as it is, as NodeResourcesFit would.
	scoreStripped bool
}

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// Name returns the plugin name.
func (pl *Plugin) Name() string { return Name }

// New builds the plugin from NodeResourcesFitArgs, with the feature gates the in-tree
// registry gives NodeResourcesFit.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return NewWithFeatures(ctx, obj, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
}

// NewWithFeatures is New with explicit feature gates, for tests.
func NewWithFeatures(ctx context.Context, obj runtime.Object, h fwk.Handle, fts feature.Features) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	p, err := noderesources.NewFit(ctx, args, h, fts)
	if err != nil {
		return nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
	}
	pl := &Plugin{Fit: p.(*noderesources.Fit), ignore: newIgnoreList(args), scoreStripped: true}
	for _, r := range args.ScoringStrategy.Resources {
		if pl.ignore.has(v1.ResourceName(r.Name)) {
			pl.scoreStripped = false
		}
	}
	return pl, nil
}

// DecodeArgs turns a profile's args into NodeResourcesFitArgs the way the scheduler's
// config loader does for NodeResourcesFit: strictly, through the scheduler's config
// scheme, with its defaults. Internal args are taken as they are, as the framework hands
// them to in-tree plugins. NodeResourcesFit validates them.
func DecodeArgs(obj runtime.Object) (*config.NodeResourcesFitArgs, error) {
	raw := []byte("{}")
	switch o := obj.(type) {
	case nil:
	case *config.NodeResourcesFitArgs:
		return o, nil
	case *configv1.NodeResourcesFitArgs:
		o = o.DeepCopy()
		scheme.Scheme.Default(o)
		args := &config.NodeResourcesFitArgs{}
		if err := scheme.Scheme.Convert(o, args, nil); err != nil {
			return nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
		}
		return args, nil
	case *runtime.Unknown:
		if len(bytes.TrimSpace(o.Raw)) > 0 {
			raw = o.Raw
		}
		if o.ContentType == runtime.ContentTypeYAML {
			var err error
			if raw, err = yaml.YAMLToJSON(raw); err != nil {
				return nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
			}
		}
	default:
		return nil, fmt.Errorf("pluginConfig[%s].args: want NodeResourcesFitArgs, got %T", Name, obj)
	}
	// The args carry no apiVersion and kind: the loader infers them from the plugin's
	// name, this decoder from gvk.
	gvk := configv1.SchemeGroupVersion.WithKind("NodeResourcesFitArgs")
	args := &config.NodeResourcesFitArgs{}
	if _, _, err := scheme.Codecs.UniversalDecoder().Decode(raw, &gvk, args); err != nil {
		return nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
	}
	return args, nil
}

// PreFilter strips the pod once for the cycle and runs NodeResourcesFit's PreFilter on
// the copy.
func (pl *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	stripped := pl.ignore.strip(pod)
	cs.Write(stateKey, &state{pod: stripped})
	return pl.Fit.PreFilter(ctx, cs, stripped, nodes)
}

// EventsToRegister is NodeResourcesFit's events, each queueing hint given the stripped
// pod. NodeResourcesFit's own node hint checks the pod against the new or changed node
// without its ignore lists, so a node that does not advertise the ignored resources
// (tessera.dev/*, which no node does) would never requeue a pod it rejected for CPU or
// memory; stripped, the hint asks what its Filter asks.
func (pl *Plugin) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	events, err := pl.Fit.EventsToRegister(ctx)
	if err != nil {
		return nil, err
	}
	for i := range events {
		if hint := events[i].QueueingHintFn; hint != nil {
			events[i].QueueingHintFn = func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
				return hint(logger, pl.ignore.strip(pod), oldObj, newObj)
			}
		}
	}
	return events, nil
}

// PreFilterExtensions hands NodeResourcesFit's extensions, if it has any, the stripped
// pod to schedule. NodeResourcesFit in Kubernetes 1.37 has none.
func (pl *Plugin) PreFilterExtensions() fwk.PreFilterExtensions {
	ext := pl.Fit.PreFilterExtensions()
	if ext == nil {
		return nil
	}
	return &extensions{ext: ext, pl: pl}
}

// Filter runs NodeResourcesFit's Filter on the stripped pod.
func (pl *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	return pl.Fit.Filter(ctx, cs, pl.stripped(cs, pod), nodeInfo)
}

// PreScore runs NodeResourcesFit's PreScore on the stripped pod.
func (pl *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	return pl.Fit.PreScore(ctx, cs, pl.scorePod(cs, pod), nodes)
}

// Score runs NodeResourcesFit's Score on the stripped pod.
func (pl *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	return pl.Fit.Score(ctx, cs, pl.scorePod(cs, pod), nodeInfo)
}

func (pl *Plugin) scorePod(cs fwk.CycleState, pod *v1.Pod) *v1.Pod {
	if !pl.scoreStripped {
		return pod
	}
	return pl.stripped(cs, pod)
}

// stripped is the copy PreFilter made, or a new one where PreFilter did not run for
// this pod (NodeResourcesFit then reports its own missing state).
func (pl *Plugin) stripped(cs fwk.CycleState, pod *v1.Pod) *v1.Pod {
	if s, err := cs.Read(stateKey); err == nil {
		if s, ok := s.(*state); ok && s.pod.UID == pod.UID {
			return s.pod
		}
	}
	return pl.ignore.strip(pod)
}

// state is the stripped pod, read-only once written.
type state struct {
	pod *v1.Pod
}

// Clone shares the pod: nothing writes to it after PreFilter.
func (s *state) Clone() fwk.StateData { return s }

// extensions passes the stripped pod to schedule to NodeResourcesFit's AddPod and
// RemovePod. The pods added or removed are passed as they are: they are the pods the
// node info holds, whose ignored resources the node's requested totals count too.
type extensions struct {
	ext fwk.PreFilterExtensions
	pl  *Plugin
}

func (e *extensions) AddPod(ctx context.Context, cs fwk.CycleState, podToSchedule *v1.Pod, podInfoToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	return e.ext.AddPod(ctx, cs, e.pl.stripped(cs, podToSchedule), podInfoToAdd, nodeInfo)
}

func (e *extensions) RemovePod(ctx context.Context, cs fwk.CycleState, podToSchedule *v1.Pod, podInfoToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	return e.ext.RemovePod(ctx, cs, e.pl.stripped(cs, podToSchedule), podInfoToRemove, nodeInfo)
}

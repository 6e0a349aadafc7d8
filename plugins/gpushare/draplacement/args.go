// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
)

// DriverName is the DRA driver of Tessera's node agent.
const DriverName = api.DRADriverName

// Args are TesseraDynamicResources' args.
type Args struct {
	// DevicePolicy orders a node's Tessera devices for a claim: Binpack (the default),
	// Spread or Fragmentation, as TesseraGPUShare's devicePolicy.
	DevicePolicy placement.Policy `json:"devicePolicy,omitempty"`
	// NodePolicy scores nodes for a pod with a Tessera claim by the same measure as
	// TesseraGPUShare's nodePolicy, over what claims consume; default DevicePolicy.
	NodePolicy placement.Policy `json:"nodePolicy,omitempty"`
	// MemoryWeight and CoresWeight weigh GPU memory against compute in the device
	// scores (default 1 and 1), as TesseraGPUShare's.
	MemoryWeight *int64 `json:"memoryWeight,omitempty"`
	CoresWeight  *int64 `json:"coresWeight,omitempty"`
	// PolicyWeight, TopologyWeight and IslandWeight weigh the node policy's term, GPU
	// locality for a request of several devices, and the points Binpack takes off for
	// every fully free NVLink island a share breaks up (defaults 1, 2 and 1), as
	// TesseraGPUShare's: a claim is placed by the same node score as a pod of
	// tessera.dev/* resources.
	PolicyWeight   *int64 `json:"policyWeight,omitempty"`
	TopologyWeight *int64 `json:"topologyWeight,omitempty"`
	IslandWeight   *int64 `json:"islandWeight,omitempty"`
	// AllowPodPolicyOverride lets a pod choose the device policy its claims are placed
	// by, with the annotation tessera.dev/gpu-policy, as TesseraGPUShare's (default
	// true).
	AllowPodPolicyOverride *bool `json:"allowPodPolicyOverride,omitempty"`
	// FragmentationWindow is how many recent claim pods the Fragmentation policy
	// learns the workload from.
	FragmentationWindow int `json:"fragmentationWindow,omitempty"`
	// DeviceClassNames are the DeviceClasses whose requests are Tessera shares, beside
	// any class whose selectors name the driver (device.driver == "gpu.tessera.dev").
	DeviceClassNames []string `json:"deviceClassNames,omitempty"`
	// DynamicResources are the in-tree DynamicResources plugin's args
	// (filterTimeout, bindingTimeout, ...), passed to it unchanged.
	DynamicResources json.RawMessage `json:"dynamicResources,omitempty"`
}

// DecodeArgs reads, defaults and validates the plugin's args from a profile's
// pluginConfig, as the scheduler does when it builds the plugin.
func DecodeArgs(obj runtime.Object) (*Args, error) {
	args, _, err := decodeArgs(obj)
	return args, err
}

// decodeArgs reads the plugin's args strictly, applies defaults and validates them,
// and decodes the in-tree plugin's args with the scheduler's own scheme.
func decodeArgs(obj runtime.Object) (*Args, *config.DynamicResourcesArgs, error) {
	raw := []byte("{}")
	switch o := obj.(type) {
	case nil:
	case *runtime.Unknown:
		if len(bytes.TrimSpace(o.Raw)) > 0 {
			raw = o.Raw
		}
	default:
		return nil, nil, fmt.Errorf("pluginConfig[%s].args: want %s args, got %T", Name, Name, obj)
	}
	raw, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
	}
	args := &Args{}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(args); err != nil {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
	}
	if args.DevicePolicy == "" {
		args.DevicePolicy = "Binpack"
	}
	if !policies.Has(args.DevicePolicy) {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args.devicePolicy: %q is not one of %s", Name, args.DevicePolicy, policyList())
	}
	if args.NodePolicy == "" {
		args.NodePolicy = args.DevicePolicy
	}
	if !policies.Has(args.NodePolicy) {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args.nodePolicy: %q is not one of %s", Name, args.NodePolicy, policyList())
	}
	for _, w := range []struct {
		name string
		v    **int64
		def  int64
	}{
		{"memoryWeight", &args.MemoryWeight, placement.DefaultMemoryWeight}, {"coresWeight", &args.CoresWeight, placement.DefaultCoresWeight},
		{"policyWeight", &args.PolicyWeight, placement.DefaultPolicyWeight}, {"topologyWeight", &args.TopologyWeight, placement.DefaultTopologyWeight},
		{"islandWeight", &args.IslandWeight, placement.DefaultIslandWeight},
	} {
		if *w.v == nil {
			def := w.def
			*w.v = &def
		}
		if **w.v < 0 || **w.v > placement.MaxWeight {
			return nil, nil, fmt.Errorf("pluginConfig[%s].args.%s: %d is out of range 0..%d", Name, w.name, **w.v, placement.MaxWeight)
		}
	}
	if *args.MemoryWeight+*args.CoresWeight == 0 {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args: memoryWeight and coresWeight cannot both be 0", Name)
	}
	if args.AllowPodPolicyOverride == nil {
		t := true
		args.AllowPodPolicyOverride = &t
	}
	if args.FragmentationWindow == 0 {
		args.FragmentationWindow = fragmentation.DefaultWindow
	}
	if args.FragmentationWindow < 1 || args.FragmentationWindow > 100000 {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args.fragmentationWindow: %d is out of range 1..100000", Name, args.FragmentationWindow)
	}
	if len(args.DeviceClassNames) == 0 {
		args.DeviceClassNames = []string{DriverName}
	}
	dra := []byte("{}")
	if len(bytes.TrimSpace(args.DynamicResources)) > 0 && !bytes.Equal(bytes.TrimSpace(args.DynamicResources), []byte("null")) {
		dra = args.DynamicResources
	}
	gvk := configv1.SchemeGroupVersion.WithKind("DynamicResourcesArgs")
	draArgs := &config.DynamicResourcesArgs{}
	if _, _, err := scheme.Codecs.UniversalDecoder().Decode(dra, &gvk, draArgs); err != nil {
		return nil, nil, fmt.Errorf("pluginConfig[%s].args.dynamicResources: %w", Name, err)
	}
	return args, draArgs, nil
}

func policyList() string {
	var names []string
	for _, p := range policies.Names() {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

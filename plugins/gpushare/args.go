// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/binpack"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/spread"
)

// Policy is a placement strategy, used independently at the node level (which node)
// and at the GPU level (which GPUs of the chosen node); the core of placement is
// internal/placement, each policy's placer a package under it.
type Policy = placement.Policy

// The placement policies (internal/placement/binpack, spread and fragmentation).
const (
	Binpack       = binpack.Name
	Spread        = spread.Name
	Fragmentation = fragmentation.Name
)

// policies are the placement policies, in the order messages name them.
var policies = placement.Registry{binpack.Registration, spread.Registration, fragmentation.Registration}

// ParsePolicy accepts a policy name in any letter case.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range policies.Names() {
		if strings.EqualFold(s, string(p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q is not a policy; %s", s, usePolicies)
}

// usePolicies is the hint of every message about a policy name that is not one.
const usePolicies = "use Binpack, Spread or Fragmentation"

// TesseraGPUShareArgs configures the plugin; it is the pluginConfig args of a
// scheduler profile. A weight left out gets its default; an explicit 0 is kept.
type TesseraGPUShareArgs struct {
	// NodePolicy chooses between nodes: Binpack (default), Spread or Fragmentation.
	NodePolicy Policy `json:"nodePolicy,omitempty"`
	// DevicePolicy chooses GPUs on the chosen node: Binpack (default), Spread or
	// Fragmentation.
	DevicePolicy Policy `json:"devicePolicy,omitempty"`
	// FragmentationWindow is how many recent GPU pods make up the workload the
	// Fragmentation policy keeps room for (default 2000).
	FragmentationWindow int `json:"fragmentationWindow,omitempty"`
	// AllowPodPolicyOverride lets a pod pick its GPU-level policy with the
	// tessera.dev/gpu-policy annotation (default true).
	AllowPodPolicyOverride *bool `json:"allowPodPolicyOverride,omitempty"`

	// MemoryWeight and CoresWeight weigh GPU memory against GPU compute when
	// measuring how used a GPU or node is (defaults 1 and 1; not both 0).
	MemoryWeight *int64 `json:"memoryWeight,omitempty"`
	CoresWeight  *int64 `json:"coresWeight,omitempty"`
	// PolicyWeight is the weight of the node-level policy term in the score (default 1).
	PolicyWeight *int64 `json:"policyWeight,omitempty"`
	// TopologyWeight is the weight of GPU locality for multi-GPU containers (default 2).
	TopologyWeight *int64 `json:"topologyWeight,omitempty"`
	// IslandWeight is how many score points (of 100) Binpack takes off a placement
	// for every fully free NVLink island it breaks up, keeping islands whole for the
	// pods that will need them (default 1: a tie breaker next to best fit).
	IslandWeight *int64 `json:"islandWeight,omitempty"`

	// MaxTenantsPerGPU bounds how many containers may share one GPU (default 10).
	MaxTenantsPerGPU int `json:"maxTenantsPerGPU,omitempty"`

	// ResourceNames are the extended resources containers ask with. Default: the
	// tessera.dev names. Set ResourceDomain to move all four to another domain.
	ResourceNames *api.ResourceNames `json:"resourceNames,omitempty"`
	// ResourceDomain, when set and ResourceNames is not, gives <domain>/gpu and friends.
	ResourceDomain string `json:"resourceDomain,omitempty"`

	// InventoryStaleness is how old a node's inventory heartbeat may be before the node
	// takes no new GPU pods (default 5m; 0s disables the check).
	InventoryStaleness *metav1.Duration `json:"inventoryStaleness,omitempty"`

	// AssignmentWrite is how the assignment annotation reaches the pod: Binding
	// (default) carries it in the pod's binding, one atomic write, and needs the plugin
	// first in the profile's bind list; PreBind merge-patches the pod before another
	// Bind plugin binds it (two writes).
	AssignmentWrite AssignmentWrite `json:"assignmentWrite,omitempty"`
}

// AssignmentWrite names how the plugin writes the assignment annotation.
type AssignmentWrite string

const (
	// WriteBinding sends the annotation in the binding that sets the pod's node.
	WriteBinding AssignmentWrite = "Binding"
	// WritePreBind patches the annotation onto the pod in PreBind.
	WritePreBind AssignmentWrite = "PreBind"
)

// Defaults are process-wide defaults for fields a profile leaves empty; the scheduler
// binary sets them from its --gpu-node-policy and --gpu-device-policy flags.
type Defaults struct {
	NodePolicy   Policy
	DevicePolicy Policy
}

const (
	defaultMaxTenants = 10
	defaultStaleness  = 5 * time.Minute
)

// SetDefaults fills every field left out; d gives the policies' defaults.
func (a *TesseraGPUShareArgs) SetDefaults(d Defaults) {
	if a.NodePolicy == "" {
		a.NodePolicy = d.NodePolicy
	}
	if a.NodePolicy == "" {
		a.NodePolicy = Binpack
	}
	if a.DevicePolicy == "" {
		a.DevicePolicy = d.DevicePolicy
	}
	if a.DevicePolicy == "" {
		a.DevicePolicy = Binpack
	}
	if a.AllowPodPolicyOverride == nil {
		t := true
		a.AllowPodPolicyOverride = &t
	}
	for _, f := range []struct {
		w   **int64
		def int64
	}{
		{&a.MemoryWeight, placement.DefaultMemoryWeight}, {&a.CoresWeight, placement.DefaultCoresWeight}, {&a.PolicyWeight, placement.DefaultPolicyWeight},
		{&a.TopologyWeight, placement.DefaultTopologyWeight}, {&a.IslandWeight, placement.DefaultIslandWeight},
	} {
		if *f.w == nil {
			v := f.def
			*f.w = &v
		}
	}
	if a.MaxTenantsPerGPU == 0 {
		a.MaxTenantsPerGPU = defaultMaxTenants
	}
	if a.FragmentationWindow == 0 {
		a.FragmentationWindow = fragmentation.DefaultWindow
	}
	if a.ResourceNames == nil {
		domain := a.ResourceDomain
		if domain == "" {
			domain = api.DefaultDomain
		}
		n := api.ResourceNamesForDomain(domain)
		a.ResourceNames = &n
	}
	if a.InventoryStaleness == nil {
		a.InventoryStaleness = &metav1.Duration{Duration: defaultStaleness}
	}
	if a.AssignmentWrite == "" {
		a.AssignmentWrite = WriteBinding
	}
}

// argsPath is where a profile's args of this plugin are, the root of the field paths
// in validation errors.
var argsPath = field.NewPath("pluginConfig").Key(Name).Child("args")

// Validate returns every invalid field of defaulted args, each named by its path
// under path (argsPath in a profile).
func (a *TesseraGPUShareArgs) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		field string
		v     Policy
	}{{"nodePolicy", a.NodePolicy}, {"devicePolicy", a.DevicePolicy}} {
		if !policies.Has(f.v) {
			errs = append(errs, field.NotSupported(path.Child(f.field), f.v, policies.Names()))
		}
	}
	weightsSet := true
	for _, f := range []struct {
		field string
		v     *int64
	}{{"memoryWeight", a.MemoryWeight}, {"coresWeight", a.CoresWeight}, {"policyWeight", a.PolicyWeight}, {"topologyWeight", a.TopologyWeight}, {"islandWeight", a.IslandWeight}} {
		switch {
		case f.v == nil:
			errs = append(errs, field.Required(path.Child(f.field), "must be set (SetDefaults sets it)"))
			weightsSet = false
		case *f.v < 0 || *f.v > placement.MaxWeight:
			errs = append(errs, field.Invalid(path.Child(f.field), *f.v, fmt.Sprintf("out of range 0..%d", placement.MaxWeight)))
		}
	}
	if weightsSet && *a.MemoryWeight+*a.CoresWeight == 0 {
		errs = append(errs, field.Invalid(path.Child("memoryWeight"), *a.MemoryWeight, "memoryWeight and coresWeight cannot both be 0"))
	}
	if a.MaxTenantsPerGPU < 1 || a.MaxTenantsPerGPU > 1000 {
		errs = append(errs, field.Invalid(path.Child("maxTenantsPerGPU"), a.MaxTenantsPerGPU, "out of range 1..1000"))
	}
	if a.FragmentationWindow < 1 || a.FragmentationWindow > 100000 {
		errs = append(errs, field.Invalid(path.Child("fragmentationWindow"), a.FragmentationWindow, "out of range 1..100000"))
	}
	if a.ResourceNames != nil && a.ResourceDomain != "" && a.ResourceNames.GPU != api.ResourceNamesForDomain(a.ResourceDomain).GPU {
		errs = append(errs, field.Invalid(path.Child("resourceDomain"), a.ResourceDomain, "set either resourceDomain or resourceNames, not both"))
	}
	if a.ResourceNames == nil {
		errs = append(errs, field.Required(path.Child("resourceNames"), "must be set (SetDefaults sets it)"))
	} else {
		errs = append(errs, a.ResourceNames.Validate(path.Child("resourceNames"))...)
	}
	if a.AssignmentWrite != WriteBinding && a.AssignmentWrite != WritePreBind {
		errs = append(errs, field.NotSupported(path.Child("assignmentWrite"), a.AssignmentWrite, []AssignmentWrite{WriteBinding, WritePreBind}))
	}
	switch {
	case a.InventoryStaleness == nil:
		errs = append(errs, field.Required(path.Child("inventoryStaleness"), "must be set (SetDefaults sets it)"))
	case a.InventoryStaleness.Duration < 0:
		errs = append(errs, field.Invalid(path.Child("inventoryStaleness"), a.InventoryStaleness.Duration.String(), "must not be negative"))
	}
	if a.AllowPodPolicyOverride == nil {
		errs = append(errs, field.Required(path.Child("allowPodPolicyOverride"), "must be set (SetDefaults sets it)"))
	}
	return errs
}

// DecodeArgs decodes a profile's args strictly (unknown fields are errors), applies
// defaults and validates; the error lists every invalid field.
func DecodeArgs(obj runtime.Object, d Defaults) (*TesseraGPUShareArgs, error) {
	args := &TesseraGPUShareArgs{}
	if obj != nil {
		raw, err := rawArgs(obj)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(raw)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(args); err != nil {
				return nil, fmt.Errorf("%s: %w", argsPath, err)
			}
		}
	}
	// A resourceDomain alone must not be overridden by the default names.
	if args.ResourceNames == nil && args.ResourceDomain != "" {
		n := api.ResourceNamesForDomain(args.ResourceDomain)
		args.ResourceNames = &n
	}
	args.SetDefaults(d)
	if errs := args.Validate(argsPath); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return args, nil
}

func rawArgs(obj runtime.Object) ([]byte, error) {
	switch o := obj.(type) {
	case *runtime.Unknown:
		if o.ContentType == runtime.ContentTypeYAML {
			return yaml.YAMLToJSON(o.Raw)
		}
		return o.Raw, nil
	case *TesseraGPUShareArgs:
		return json.Marshal(o)
	default:
		return nil, fmt.Errorf("%s: unexpected type %T", argsPath, obj)
	}
}

// DeepCopyObject and GetObjectKind let *TesseraGPUShareArgs be passed directly as
// plugin args in tests and in the replay tools.
func (a *TesseraGPUShareArgs) DeepCopyObject() runtime.Object {
	c := *a
	for _, w := range []**int64{&c.MemoryWeight, &c.CoresWeight, &c.PolicyWeight, &c.TopologyWeight, &c.IslandWeight} {
		if *w != nil {
			v := **w
			*w = &v
		}
	}
	if a.ResourceNames != nil {
		n := *a.ResourceNames
		c.ResourceNames = &n
	}
	if a.AllowPodPolicyOverride != nil {
		b := *a.AllowPodPolicyOverride
		c.AllowPodPolicyOverride = &b
	}
	if a.InventoryStaleness != nil {
		s := *a.InventoryStaleness
		c.InventoryStaleness = &s
	}
	return &c
}

// GetObjectKind implements runtime.Object.
func (a *TesseraGPUShareArgs) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/api"
)

func TestDecodeArgs(t *testing.T) {
	raw := func(s string) runtime.Object {
		return &runtime.Unknown{Raw: []byte(s), ContentType: runtime.ContentTypeJSON}
	}
	args, err := DecodeArgs(nil, Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if args.NodePolicy != Binpack || args.DevicePolicy != Binpack || args.MaxTenantsPerGPU != 10 || *args.ResourceNames != api.DefaultResourceNames() ||
		args.InventoryStaleness.Duration.String() != "5m0s" || !*args.AllowPodPolicyOverride || *args.TopologyWeight != 2 ||
		*args.MemoryWeight != 1 || *args.CoresWeight != 1 || *args.PolicyWeight != 1 || *args.IslandWeight != 1 ||
		args.AssignmentWrite != WriteBinding {
		t.Errorf("defaults: %+v", args)
	}
	// Flag defaults fill what a profile leaves empty, and only that.
	args, _ = DecodeArgs(raw(`{"nodePolicy":"Binpack"}`), Defaults{NodePolicy: Spread, DevicePolicy: Spread})
	if args.NodePolicy != Binpack || args.DevicePolicy != Spread {
		t.Errorf("flag defaults: node %s device %s", args.NodePolicy, args.DevicePolicy)
	}
	args, err = DecodeArgs(raw(`{"resourceDomain":"nvidia.com"}`), Defaults{})
	if err != nil || args.ResourceNames.GPUMemory != "nvidia.com/gpu-memory" {
		t.Errorf("resourceDomain: %+v %v", args.ResourceNames, err)
	}
	if args, err = DecodeArgs(raw(`{"assignmentWrite":"PreBind"}`), Defaults{}); err != nil || args.AssignmentWrite != WritePreBind {
		t.Errorf("assignmentWrite: %+v %v", args, err)
	}
	args, err = DecodeArgs(&runtime.Unknown{Raw: []byte("devicePolicy: Spread\nmaxTenantsPerGPU: 4\n"), ContentType: runtime.ContentTypeYAML}, Defaults{})
	if err != nil || args.DevicePolicy != Spread || args.MaxTenantsPerGPU != 4 {
		t.Errorf("yaml args: %+v %v", args, err)
	}

	// An explicit 0 is kept; a weight left out gets its default.
	args, err = DecodeArgs(raw(`{"policyWeight":0,"topologyWeight":0,"islandWeight":0,"coresWeight":0}`), Defaults{})
	if err != nil || *args.PolicyWeight != 0 || *args.TopologyWeight != 0 || *args.IslandWeight != 0 || *args.CoresWeight != 0 || *args.MemoryWeight != 1 {
		t.Errorf("explicit 0 weights: %+v %v", args, err)
	}

	for _, tc := range []struct{ in, want string }{
		{`{"nodePolicy":"Pack"}`, `pluginConfig[TesseraGPUShare].args.nodePolicy: Unsupported value: "Pack": supported values: "Binpack", "Spread", "Fragmentation"`},
		{`{"devicePolicy":"spread"}`, `args.devicePolicy: Unsupported value: "spread"`},
		{`{"maxTenantsPerGPU":-1}`, `args.maxTenantsPerGPU: Invalid value: -1: out of range 1..1000`},
		{`{"topologyWeight":1000}`, `args.topologyWeight: Invalid value: 1000: out of range 0..100`},
		{`{"memoryWeight":-1}`, `args.memoryWeight: Invalid value: -1: out of range 0..100`},
		{`{"memoryWeight":0,"coresWeight":0}`, `args.memoryWeight: Invalid value: 0: memoryWeight and coresWeight cannot both be 0`},
		{`{"inventoryStaleness":"-1s"}`, `args.inventoryStaleness: Invalid value: "-1s": must not be negative`},
		{`{"resourceNames":{"gpu":"gpu"}}`, `args.resourceNames.gpu: Invalid value: "gpu": must be domain-qualified`},
		{`{"resourceNames":{"gpu":"gpu"}}`, `args.resourceNames.gpuCores: Required value`},
		{`{"resourceDomain":"a.io","resourceNames":{"gpu":"b.io/gpu","gpuMemory":"b.io/m","gpuMemoryPercent":"b.io/p","gpuCores":"b.io/c"}}`, `args.resourceDomain: Invalid value: "a.io": set either resourceDomain or resourceNames`},
		{`{"nodePolicy":"Binpack","bogus":1}`, `unknown field "bogus"`},
		{`{"maxTenantsPerGPU":"ten"}`, `cannot unmarshal`},
		{`{"assignmentWrite":"Patch"}`, `args.assignmentWrite: Unsupported value: "Patch": supported values: "Binding", "PreBind"`},
	} {
		if _, err := DecodeArgs(raw(tc.in), Defaults{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeArgs(%s) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"binpack": Binpack, "Spread": Spread, "SPREAD": Spread} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("unknown policy accepted")
	}
}

// Validation reports every invalid field at once, each by its path.
func TestDecodeArgsListsEveryError(t *testing.T) {
	in := `{"nodePolicy":"Pack","devicePolicy":"Random","memoryWeight":-1,"topologyWeight":101,"maxTenantsPerGPU":0,` +
		`"fragmentationWindow":-5,"assignmentWrite":"Patch","inventoryStaleness":"-1s"}`
	_, err := DecodeArgs(&runtime.Unknown{Raw: []byte(in), ContentType: runtime.ContentTypeJSON}, Defaults{})
	if err == nil {
		t.Fatal("invalid args accepted")
	}
	for _, f := range []string{"nodePolicy", "devicePolicy", "memoryWeight", "topologyWeight", "fragmentationWindow", "assignmentWrite", "inventoryStaleness"} {
		if want := "pluginConfig[TesseraGPUShare].args." + f + ":"; !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	// maxTenantsPerGPU: 0 is "left out", and defaults to 10.
	var args TesseraGPUShareArgs
	args.SetDefaults(Defaults{})
	args.NodePolicy, args.MaxTenantsPerGPU = "Pack", 0
	if errs := args.Validate(argsPath); len(errs) != 2 {
		t.Errorf("Validate = %v, want the two errors (nodePolicy, maxTenantsPerGPU)", errs)
	}
}

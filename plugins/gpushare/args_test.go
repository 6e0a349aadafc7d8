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
		args.InventoryStaleness.Duration.String() != "5m0s" || !*args.AllowPodPolicyOverride || args.TopologyWeight != 2 ||
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

	for _, tc := range []struct{ in, want string }{
		{`{"nodePolicy":"Pack"}`, `pluginConfig[TesseraGPUShare].args.nodePolicy: "Pack" is not a policy`},
		{`{"devicePolicy":"spread"}`, `devicePolicy: "spread" is not a policy`},
		{`{"maxTenantsPerGPU":-1}`, `maxTenantsPerGPU: -1 is out of range`},
		{`{"topologyWeight":1000}`, `topologyWeight: 1000 is out of range`},
		{`{"memoryWeight":-1}`, `memoryWeight: -1 is out of range`},
		{`{"inventoryStaleness":"-1s"}`, `inventoryStaleness: -1s is negative`},
		{`{"resourceNames":{"gpu":"gpu"}}`, `resourceNames.gpu: "gpu" must be domain-qualified`},
		{`{"resourceDomain":"a.io","resourceNames":{"gpu":"b.io/gpu","gpuMemory":"b.io/m","gpuMemoryPercent":"b.io/p","gpuCores":"b.io/c"}}`, `set either resourceDomain or resourceNames`},
		{`{"nodePolicy":"Binpack","bogus":1}`, `unknown field "bogus"`},
		{`{"maxTenantsPerGPU":"ten"}`, `cannot unmarshal`},
		{`{"assignmentWrite":"Patch"}`, `assignmentWrite: "Patch" is not a write mode`},
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

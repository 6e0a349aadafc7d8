// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

// FuzzDecodeArgs decodes arbitrary profile args, as YAML and as JSON, the way New
// does. It must never panic, and args it accepts must be complete (every field New
// reads is set), valid, and decode to themselves when passed back (defaulting and
// validating are idempotent).
func FuzzDecodeArgs(f *testing.F) {
	for _, seed := range []string{
		"", "{}", "nodePolicy: Spread\ndevicePolicy: binpack\n",
		`{"nodePolicy":"Fragmentation","fragmentationWindow":100,"memoryWeight":0,"coresWeight":3}`,
		"resourceDomain: example.com\ninventoryStaleness: 0s\nassignmentWrite: PreBind\n",
		"resourceNames: {gpu: a.io/gpu, gpuMemory: a.io/m, gpuMemoryPercent: a.io/p, gpuCores: a.io/c}\n",
		"maxTenantsPerGPU: 1000\nallowPodPolicyOverride: false\nislandWeight: 100\n",
		"policyWeight: 0\ntopologyWeight: 0\nislandWeight: 0\n", "memoryWeight: null\n",
		"inventoryStaleness: -1s\n", "unknown: 1\n", "[1, 2]", "nodePolicy: [x]\n",
	} {
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, yaml bool) {
		ct := runtime.ContentTypeJSON
		if yaml {
			ct = runtime.ContentTypeYAML
		}
		args, err := DecodeArgs(&runtime.Unknown{Raw: raw, ContentType: ct}, Defaults{})
		if err != nil {
			return
		}
		if args.ResourceNames == nil || args.InventoryStaleness == nil || args.AllowPodPolicyOverride == nil ||
			args.MemoryWeight == nil || args.CoresWeight == nil || args.PolicyWeight == nil || args.TopologyWeight == nil || args.IslandWeight == nil {
			t.Fatalf("accepted args New cannot use: %+v", args)
		}
		if err := args.Validate(argsPath).ToAggregate(); err != nil {
			t.Fatalf("accepted args that do not validate: %v", err)
		}
		again, err := DecodeArgs(args, Defaults{})
		if err != nil {
			t.Fatalf("accepted args that do not decode again: %v\n%+v", err, args)
		}
		if !reflect.DeepEqual(args, again) {
			t.Fatalf("decoding accepted args changes them:\n%+v\n%+v", args, again)
		}
	})
}

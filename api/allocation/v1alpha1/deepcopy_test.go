// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"encoding/json"
	"reflect"
	"testing"

	"sigs.k8s.io/randfill"
)

// TestDeepCopy fills every field, copies, then refills the original: the copy must
// equal the original before the refill, which it cannot if any slice or pointer is
// shared.
func TestDeepCopy(t *testing.T) {
	f := randfill.NewWithSeed(1).NilChance(0).NumElements(1, 3)
	for i := 0; i < 20; i++ {
		in := &AllocationList{}
		f.Fill(in)
		before, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		out := in.DeepCopyObject().(*AllocationList)
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("copy differs:\n%+v\n%+v", in, out)
		}
		refill(f, in)
		after, _ := json.Marshal(out)
		if string(after) != string(before) {
			t.Fatalf("the copy changed with its original:\n%s\n%s", before, after)
		}
	}
}

// refill overwrites the contents of in's slices and pointers in place.
func refill(f *randfill.Filler, in *AllocationList) {
	f.Fill(&in.TypeMeta)
	for i := range in.Items {
		n := &in.Items[i]
		f.Fill(n.Inventory.UpdatedAt)
		f.Fill(&n.NVLinkIslands[0])
		f.Fill(&n.Warnings[0])
		for j := range n.GPUs {
			g := &n.GPUs[j]
			f.Fill(&g.Grants[0].GPUs[0])
			for k := range g.Grants {
				f.Fill(&g.Grants[k])
			}
		}
	}
	f.Fill(&in.NodesWithoutInventory[0])
	f.Fill(&in.PendingPods[0])
	f.Fill(&in.Problems[0])
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// The agent publishes its --context-mib in the inventory when it is not the default,
// for the scheduler to judge requests against; the default leaves the field out.
func TestInventoryPublishesContextCharge(t *testing.T) {
	for _, tc := range []struct {
		flag      string
		published int64
		charge    int64
	}{
		{"", 0, api.DefaultContextMiB},
		{"--context-mib=576", 0, api.DefaultContextMiB},
		{"--context-mib=0", 0, api.DefaultContextMiB}, // 0: the default, as in the limits files
		{"--context-mib=1024", 1024, 1024},
		{"--context-mib=300", 300, 300},
	} {
		args := []string{"--simulate", sample("t4-4x-pcie.yaml"), "--node-name", "n"}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		a := newTestAgent(t, parse(t, args...), fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}), record.NewFakeRecorder(10))
		inv, err := a.source.Inventory()
		if err != nil {
			t.Fatal(err)
		}
		if inv.ContextMiB != tc.published || inv.ContextCharge() != tc.charge {
			t.Errorf("%q: published contextMiB %d (charge %d), want %d (%d)", tc.flag, inv.ContextMiB, inv.ContextCharge(), tc.published, tc.charge)
		}
		if _, err := api.EncodeInventory(inv); err != nil {
			t.Errorf("%q: %v", tc.flag, err)
		}
	}
}

// A node in DRA mode says so in its inventory, and only then.
func TestInventoryMarksDRAMode(t *testing.T) {
	for _, dra := range []bool{false, true} {
		s := &contextSource{Source: &fixedSource{inv: &api.NodeInventory{Version: api.InventoryVersion}}, dra: dra}
		inv, err := s.Inventory()
		if err != nil {
			t.Fatal(err)
		}
		if inv.DRA != dra {
			t.Errorf("--dra=%v published dra: %v", dra, inv.DRA)
		}
	}
}

// fixedSource is a source whose inventory is inv; only Inventory is called.
type fixedSource struct {
	gpu.Source
	inv *api.NodeInventory
}

func (s *fixedSource) Inventory() (*api.NodeInventory, error) {
	c := *s.inv
	return &c, nil
}

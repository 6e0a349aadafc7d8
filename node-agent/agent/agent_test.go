// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"flag"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
)

func sample(name string) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "config", "simulated", name)
}

func parse(t *testing.T, args ...string) Config {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var c Config
	BindFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	ApplySimulateDefaults(fs, &c)
	return c
}

// The local cluster starts simulated agents with only these three flags; they must
// publish the inventory with nothing else on the machine.
func TestSimulatedAgentPublishes(t *testing.T) {
	c := parse(t, "--simulate", sample("h100-8x-two-nvlink-islands.yaml"), "--node-name", "sim-0", "--kubeconfig", "unused", "--poll", "100ms", "--heartbeat", "1s")
	if c.DevicePlugin || c.NRI || c.Watchdog || c.MetricsAddr != "" || c.HealthAddr != "" {
		t.Fatalf("simulate defaults not applied: %+v", c)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-0"}})
	a := newTestAgent(t, c, client, record.NewFakeRecorder(10))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	var first time.Time
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := client.CoreV1().Nodes().Get(ctx, "sim-0", metav1.GetOptions{})
		if v, ok := n.Annotations[api.AnnotationInventory]; ok {
			inv, err := api.DecodeInventory(v)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.GPUs) != 8 || n.Labels[api.LabelCount] != "8" || n.Labels[api.LabelModel] != "NVIDIA-H100-80GB-HBM3" {
				t.Fatalf("published %d GPUs, labels %v", len(inv.GPUs), n.Labels)
			}
			if first.IsZero() {
				first = inv.UpdatedAt
			} else if inv.UpdatedAt.After(first) {
				break // the heartbeat moved UpdatedAt on
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no inventory heartbeat")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestValidate(t *testing.T) {
	good := parse(t, "--node-name", "n")
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if !good.DevicePlugin || !good.NRI || !good.Watchdog || good.MetricsAddr == "" {
		t.Errorf("real-node defaults: %+v", good)
	}
	// Explicit flags win over the simulate defaults.
	c := parse(t, "--simulate", "x", "--node-name", "n", "--device-plugin=true")
	if !c.DevicePlugin || c.NRI {
		t.Errorf("explicit flag lost: %+v", c)
	}
	for args, want := range map[string]string{
		"--node-name=":                     "--node-name is required",
		"--heartbeat=10ms":                 "--heartbeat",
		"--poll=1h":                        "--poll",
		"--resource-domain=kubernetes.io":  "reserved domain",
		"--device-plugin-replicas=0":       "--device-plugin-replicas",
		"--watchdog-action=nuke":           "--watchdog-action",
		"--hook-library=relative.so":       "--hook-library",
		"--limits-root=relative":           "--limits-root",
		"--turns-dir=relative":             "--turns-dir",
		"--context-mib=-1":                 "--context-mib",
		"--pacing-charge=graph":            "--pacing-charge \"graph\": want class",
		"--pacing-charge=":                 "--pacing-charge",
		"--watchdog-interval=1ms":          "--watchdog-interval",
		"--watchdog-window=10s":            "--watchdog-window",
		"--watchdog-compute-action=pause":  "--watchdog-compute-action",
		"--watchdog-compute-window=6s":     "--watchdog-compute-window",
		"--watchdog-compute-tolerance=-1":  "--watchdog-compute-tolerance",
		"--watchdog-escalation-window=30s": "--watchdog-escalation-window",
		"--watchdog-evict-after=-1":        "--watchdog-evict-after",
		"--stall-timeout=5s":               "--stall-timeout",
	} {
		c := parse(t, append([]string{"--node-name", "n"}, strings.Fields(args)...)...)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
}

func TestLoggingFlags(t *testing.T) {
	for args, want := range map[string]string{
		"":                                    "",
		"--logging-format=text -v=3":          "",
		"--logging-format=text --vmodule=x=2": "",
		"--logging-format=json --vmodule=x=2": "only supported for text",
		"--logging-format=xml":                "xml",
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		c := AddLoggingFlags(fs)
		if err := fs.Parse(strings.Fields(args)); err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		err := ValidateLogging(c)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want))) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
		if args == "" && c.Format != "json" {
			t.Errorf("default format %q, want json", c.Format)
		}
	}
}

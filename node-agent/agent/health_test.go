// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitProbe polls url until its status is code and its body contains want.
func waitProbe(t *testing.T, url string, code int, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, body := probe(t, url)
		if c == code && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d %q, want %d with %q", url, c, body, code, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startAgent(t *testing.T, c Config) (*Agent, func()) {
	t.Helper()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.NodeName}})
	a := newTestAgent(t, c, client, record.NewFakeRecorder(100))
	return a, func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// The inventory loop: not live before it starts, ready once it published; a source
// that stops reading makes the agent unready but keeps it live (the loop still runs);
// a loop with no pass for --stall-timeout makes it not live.
func TestHealthInventory(t *testing.T) {
	dir := t.TempDir()
	topo := filepath.Join(dir, "topo.yaml")
	good, err := os.ReadFile(sample("t4-4x-pcie.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(topo, good, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	// One address for metrics and health: one server serves both (plain HTTP on
	// loopback, as in local development).
	c := parse(t, "--simulate", topo, "--node-name", "sim-0", "--poll", "100ms", "--heartbeat", "1s",
		"--health-addr", addr, "--metrics-addr", addr, "--metrics-secure=false", "--stall-timeout", "1s")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a, run := startAgent(t, c)
	if r := a.Health.Live(); r.OK || !strings.Contains(strings.Join(r.Lines, "\n"), "inventory poll loop: not started") {
		t.Fatalf("live before Run: %+v", r)
	}
	if r := a.Health.Ready(); r.OK || !strings.Contains(strings.Join(r.Lines, "\n"), "GPU inventory not published yet") {
		t.Fatalf("ready before Run: %+v", r)
	}
	run()
	base := "http://" + addr
	waitProbe(t, base+"/healthz", 200, "ok")
	waitProbe(t, base+"/readyz", 200, "ok")
	if code, body := probe(t, base+"/metrics"); code != 200 || !strings.Contains(body, "tessera_gpu_memory_total_bytes") {
		t.Fatalf("metrics on the shared address: %d", code)
	}

	// The source fails: after the freshness limit (2 heartbeats + a poll) the agent
	// is unready with the source's error, and still live.
	if err := os.WriteFile(topo, []byte("version: [broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	body := waitProbe(t, base+"/readyz", 503, "GPU inventory last published")
	if !strings.Contains(body, "reading GPUs") {
		t.Errorf("readyz does not say why: %q", body)
	}
	if code, body := probe(t, base+"/healthz"); code != 200 {
		t.Errorf("healthz with a failing source: %d %q", code, body)
	}
	// The source recovers: ready again.
	if err := os.WriteFile(topo, good, 0o644); err != nil {
		t.Fatal(err)
	}
	waitProbe(t, base+"/readyz", 200, "ok")

	// A wedged loop: seen from a clock 5s ahead, the last pass is older than the 1s
	// stall limit.
	a.Health.SetClock(func() time.Time { return time.Now().Add(5 * time.Second) })
	waitProbe(t, base+"/healthz", 503, "[-]inventory failed: inventory poll loop: last pass")
}

// NRI and the device plugin: with no runtime and no kubelet the agent is unready
// (both named) but live, until NRI has been disconnected for --stall-timeout.
func TestHealthNRIAndDevicePlugin(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	c := parse(t, "--simulate", sample("t4-4x-pcie.yaml"), "--node-name", "sim-0", "--poll", "100ms", "--heartbeat", "1s",
		"--health-addr", addr, "--stall-timeout", "1m",
		"--nri", "--nri-socket", filepath.Join(dir, "nri.sock"),
		"--device-plugin", "--device-plugin-dir", dir+"/",
		"--watchdog", "--watchdog-interval", "100ms",
		"--state-dir", filepath.Join(dir, "state"), "--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns"))
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a, run := startAgent(t, c)
	run()
	base := "http://" + addr
	waitProbe(t, base+"/readyz", 503, "[+]inventory ok")
	// The NRI and device-plugin checks report "not started" until their components
	// have started (CI once read readyz in between): wait for each one's message.
	for _, want := range []string{"[-]nri failed: not connected to the runtime's NRI socket", "[-]device-plugin failed: not registered with kubelet"} {
		waitProbe(t, base+"/readyz", 503, want)
	}
	waitProbe(t, base+"/healthz?verbose", 200, "[+]watchdog ok")
	a.Health.SetClock(func() time.Time { return time.Now().Add(2 * time.Minute) })
	body := waitProbe(t, base+"/healthz", 503, "[-]nri failed: not connected to the runtime's NRI socket")
	if !strings.Contains(body, "for 2m") {
		t.Errorf("healthz does not say for how long: %q", body)
	}
}

// newTestAgent opens c's GPU source and builds an agent on client and rec, failing the
// test on any error.
func newTestAgent(t *testing.T, c Config, client kubernetes.Interface, rec record.EventRecorder) *Agent {
	t.Helper()
	src, err := OpenSource(&c, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(c, logr.Discard(), client, src, rec)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

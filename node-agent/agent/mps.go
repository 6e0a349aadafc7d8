// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/health"
	"github.com/tessera-dev/tessera/node-agent/mps"
)

// MPSConfig selects the GPUs the agent serves in mps sharing mode (see package mps
// and docs/node-agent.md).
type MPSConfig struct {
	// GPUs is "" (none), "all" (every GPU not in MIG mode), "node-label" (all when
	// the Node carries LabelSharing=mps, none otherwise) or a comma-separated list of
	// GPU indexes and UUIDs.
	GPUs    string
	Control string
	Root    string
	// Clients is the client limit published for each MPS GPU.
	Clients int
	// Interval is how often each daemon's health is read.
	Interval time.Duration
	// KeepDaemons leaves the daemons (and their clients' CUDA contexts) running when
	// the agent stops, for the next agent to adopt; Cgroup is the host cgroup they
	// run under, outside the agent container's (see mps.Config).
	KeepDaemons bool
	Cgroup      string
	// Helper is the MPS exec helper (see mps.RunExecHelper); empty: the agent's own
	// binary. NoHelper runs the daemons without it, sharing the agent's /dev/shm
	// (tests that cannot make mount namespaces). Neither is a flag.
	Helper   string
	NoHelper bool
}

func bindMPSFlags(fs *flag.FlagSet, c *MPSConfig) {
	fs.StringVar(&c.GPUs, "mps-gpus", "", `GPUs served in mps sharing mode, each by an MPS control daemon the agent runs: "all" (every GPU not in MIG mode), `+
		`"node-label" (all when the Node is labelled `+LabelSharing+`=mps, read at start), `+
		`a comma-separated list of GPU indexes or UUIDs, or empty (none: every GPU is time-sliced)`)
	fs.StringVar(&c.Control, "mps-control", mps.DefaultControl, "the nvidia-cuda-mps-control program (nvidia-cuda-mps-server must be beside it or on PATH)")
	fs.StringVar(&c.Root, "mps-root", mps.DefaultRoot, "host directory holding each MPS GPU's pipe, shm and log directories")
	fs.IntVar(&c.Clients, "mps-clients", api.DefaultMPSClientLimit, "MPS clients (containers) the scheduler may place on one MPS GPU, at most 48")
	fs.DurationVar(&c.Interval, "mps-health-interval", 5*time.Second, "how often each MPS control daemon's health is read")
	fs.BoolVar(&c.KeepDaemons, "mps-keep-daemons", false, "leave the MPS control daemons, and their clients' CUDA contexts, running when the agent stops "+
		"(an upgrade or restart); the next agent adopts them. In a container, needs --mps-cgroup")
	fs.StringVar(&c.Cgroup, "mps-cgroup", "", "host cgroup (cgroup v2, relative to the host's cgroup root) under which kept MPS daemons run, "+
		"outside the agent container's cgroup; needs --mps-keep-daemons, the host's PID namespace and CAP_SYS_ADMIN")
}

func (c *MPSConfig) validate(nri bool) error {
	if c.GPUs == "" {
		return nil
	}
	if !nri {
		return errors.New("--mps-gpus needs --nri: an MPS container gets its GPU's MPS directories at creation")
	}
	if !filepath.IsAbs(c.Control) || !filepath.IsAbs(c.Root) {
		return fmt.Errorf("--mps-control %q and --mps-root %q must be absolute paths", c.Control, c.Root)
	}
	if c.Clients < 1 || c.Clients > api.MaxMPSClientLimit {
		return fmt.Errorf("--mps-clients %d out of range 1..%d", c.Clients, api.MaxMPSClientLimit)
	}
	if c.Interval < 100*time.Millisecond {
		return fmt.Errorf("--mps-health-interval %s is below 100ms", c.Interval)
	}
	if c.Cgroup != "" && (!c.KeepDaemons || !filepath.IsAbs(c.Cgroup) || filepath.Clean(c.Cgroup) != c.Cgroup || c.Cgroup == "/") {
		return fmt.Errorf("--mps-cgroup %q must be a clean absolute path below the cgroup root, with --mps-keep-daemons", c.Cgroup)
	}
	if c.Cgroup != "" && c.NoHelper {
		return errors.New("--mps-cgroup needs the MPS exec helper")
	}
	return nil
}

// LabelSharing is the Node label that --mps-gpus=node-label reads: "mps" serves
// every GPU of the node in mps mode. An administrator sets it per node pool.
const LabelSharing = api.DefaultDomain + "/gpu-sharing"

// MPSFromNodeLabel is the --mps-gpus value that reads LabelSharing.
const MPSFromNodeLabel = "node-label"

// selectMPSGPUs resolves --mps-gpus against the node's inventory.
func selectMPSGPUs(spec string, inv *api.NodeInventory) ([]string, error) {
	if spec == "" {
		return nil, nil
	}
	if strings.TrimSpace(spec) == "all" {
		var out []string
		for _, g := range inv.GPUs {
			if g.MIG == nil {
				out = append(out, g.UUID)
			}
		}
		return out, nil
	}
	var out []string
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		var found *api.GPU
		for i := range inv.GPUs {
			g := &inv.GPUs[i]
			if g.UUID == item || strconv.Itoa(g.Index) == item {
				found = g
			}
		}
		switch {
		case found == nil:
			return nil, fmt.Errorf("--mps-gpus: %q is neither the index nor the UUID of a GPU of this node", item)
		case found.MIG != nil:
			return nil, fmt.Errorf("--mps-gpus: GPU %s is in MIG mode; MPS is served on whole GPUs only", found.UUID)
		case slices.Contains(out, found.UUID):
			return nil, fmt.Errorf("--mps-gpus: GPU %s is listed twice", found.UUID)
		}
		out = append(out, found.UUID)
	}
	return out, nil
}

// mpsSource publishes the served GPUs in mps mode.
type mpsSource struct {
	gpu.Source
	served  map[string]bool
	clients int
}

func (s *mpsSource) Inventory() (*api.NodeInventory, error) {
	inv, err := s.Source.Inventory()
	if err != nil {
		return nil, err
	}
	for i := range inv.GPUs {
		if g := &inv.GPUs[i]; s.served[g.UUID] && g.MIG == nil {
			g.Sharing, g.MPSClients = api.SharingMPS, s.clients
		}
	}
	return inv, nil
}

// setupMPS starts nothing: it resolves the MPS GPUs, builds their supervisor and
// returns the source that publishes their mode.
func (a *Agent) setupMPS(source gpu.Source) (gpu.Source, error) {
	c := a.cfg.MPS
	if c.GPUs == MPSFromNodeLabel {
		node, err := a.client.CoreV1().Nodes().Get(context.Background(), a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("--mps-gpus=%s: reading Node %s: %w", MPSFromNodeLabel, a.cfg.NodeName, err)
		}
		switch v := node.Labels[LabelSharing]; v {
		case "", string(api.SharingTimeSliced):
			c.GPUs = ""
		case string(api.SharingMPS):
			c.GPUs = "all"
		default:
			return nil, fmt.Errorf("Node %s: label %s=%q is not one of mps, time-sliced", a.cfg.NodeName, LabelSharing, v)
		}
		a.log.Info("GPU sharing mode from the Node's label", "label", LabelSharing, "value", node.Labels[LabelSharing])
	}
	if c.GPUs == "" {
		return source, nil
	}
	inv, err := source.Inventory()
	if err != nil {
		return nil, fmt.Errorf("reading the GPUs to select --mps-gpus: %w", err)
	}
	uuids, err := selectMPSGPUs(c.GPUs, inv)
	if err != nil {
		return nil, err
	}
	if len(uuids) == 0 {
		a.log.Info("--mps-gpus selects no GPU of this node; every GPU is time-sliced", "mpsGPUs", c.GPUs)
		return source, nil
	}
	helper := c.Helper
	if helper == "" && !c.NoHelper {
		if helper, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("the node agent's own binary (the MPS exec helper): %w", err)
		}
	}
	s, err := mps.New(mps.Config{Control: c.Control, Root: c.Root, GPUs: uuids, Helper: helper, Interval: c.Interval,
		Detach: c.KeepDaemons, Cgroup: c.Cgroup,
		Log: a.log.WithName("mps"), OnEvent: a.onMPSEvent})
	if err != nil {
		return nil, err
	}
	a.MPS = s
	served := map[string]bool{}
	for _, u := range uuids {
		served[u] = true
	}
	a.log.Info("serving GPUs in mps mode", "gpus", uuids, "clients", c.Clients)
	return &mpsSource{Source: source, served: served, clients: c.Clients}, nil
}

// servesMPS is the watchdog's view of the supervisor.
func (a *Agent) servesMPS(uuid string) bool { return a.MPS != nil && a.MPS.Serves(uuid) }

// mpsDirs is the binding's view of the supervisor.
func (a *Agent) mpsDirs(uuid string) (binding.MPSDirs, bool) {
	if a.MPS == nil || !a.MPS.Serves(uuid) {
		return binding.MPSDirs{}, false
	}
	return binding.MPSDirs{Pipe: a.MPS.PipeDir(uuid), Shm: a.MPS.ShmDir(uuid)}, true
}

// onMPSEvent tells the pods bound to the GPU: a daemon or server failure took their
// containers' CUDA contexts with it (a container restarts or its processes see CUDA
// errors), and the recovery says new CUDA processes work again.
func (a *Agent) onMPSEvent(e mps.Event) {
	typ, reason := corev1.EventTypeWarning, "GPUMPSServerFailed"
	switch e.Kind {
	case mps.DaemonFailed:
		reason = "GPUMPSDaemonFailed"
	case mps.Recovered:
		typ, reason = corev1.EventTypeNormal, "GPUMPSRecovered"
	}
	if a.recorder == nil || a.Binder == nil {
		return
	}
	for _, ref := range podsOnGPU(a.Binder.Records(), e.GPU) {
		a.recorder.Event(ref, typ, reason, e.Message)
	}
}

// podsOnGPU returns each pod with a container bound to the GPU, once.
func podsOnGPU(recs []checkpoint.Record, uuid string) []*corev1.ObjectReference {
	var out []*corev1.ObjectReference
	seen := map[string]bool{}
	for _, rec := range recs {
		for _, d := range rec.Devices {
			if d.UUID != uuid || seen[rec.PodUID] {
				continue
			}
			seen[rec.PodUID] = true
			out = append(out, &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: rec.Namespace, Name: rec.Pod, UID: types.UID(rec.PodUID)})
		}
	}
	return out
}

// mpsHealth fails readiness while a daemon does not answer; liveness does not
// depend on it, since the supervisor restarts daemons by itself.
func (a *Agent) mpsHealth() health.Check {
	return health.Check{Name: "mps", Ready: func(time.Time) error {
		var down []string
		for _, st := range a.MPS.Status() {
			if !st.Up {
				why := st.LastError
				if why == "" {
					why = "starting"
				}
				down = append(down, st.GPU+": "+why)
			}
		}
		if len(down) > 0 {
			return fmt.Errorf("MPS control daemon not serving: %s", strings.Join(down, "; "))
		}
		return nil
	}}
}

func (a *Agent) runMPS(ctx context.Context) error { return a.MPS.Run(ctx) }

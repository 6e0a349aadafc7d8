// SPDX-License-Identifier: Apache-2.0

// Package agent wires the node agent's subsystems together: the GPU source (NVML or a
// simulated topology), the inventory publisher, and, each switchable by its own flag,
// the kubelet device plugin, the NRI container binding, the usage watchdog and the
// metrics endpoint.
package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/dra"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/health"
	"github.com/tessera-dev/tessera/node-agent/inventory"
	"github.com/tessera-dev/tessera/node-agent/metrics"
	"github.com/tessera-dev/tessera/node-agent/mps"
	nriplugin "github.com/tessera-dev/tessera/node-agent/nri"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
	"github.com/tessera-dev/tessera/node-agent/serving"
	"github.com/tessera-dev/tessera/node-agent/simsource"
	"github.com/tessera-dev/tessera/node-agent/watchdog"
)

// Config is everything the agent is started with.
type Config struct {
	NodeName   string
	Kubeconfig string
	// Simulate is a simulated topology file; empty: read the GPUs through NVML.
	Simulate string

	Heartbeat time.Duration
	Poll      time.Duration

	// ResourceDomain is the domain of the resource names (tessera.dev by default).
	ResourceDomain string
	// SchedulerNames are the Tessera scheduler profiles whose pods' assignments the
	// agent enforces; a pod naming any other scheduler is never bound.
	SchedulerNames []string

	DevicePlugin         bool
	DevicePluginDir      string
	DevicePluginReplicas int

	// DRA serves the node's GPUs through the DRA kubelet plugin gpu.tessera.dev
	// instead of the device plugin (never both).
	DRA bool
	// DRAPluginDir is the plugin's directory (its socket) under kubelet's plugins
	// directory, DRARegistrarDir kubelet's plugin registration directory.
	DRAPluginDir, DRARegistrarDir string
	// DRACDISpecDir is where the prepared claims' CDI specs are written.
	DRACDISpecDir string
	// DRAClaimRegionTmpfs gives each prepared claim's region directory a tmpfs of its
	// own (binding.TmpfsRegions).
	DRAClaimRegionTmpfs bool

	NRI       bool
	NRISocket string
	// BindFallback binds containers at their first CUDA call through BindSocket
	// instead of at creation through NRI (nodes whose runtime has no NRI).
	BindFallback bool
	BindSocket   string
	StateDir     string
	LimitsRoot   string
	TurnsDir     string
	HookLibrary  string
	DevDir       string
	ContextMiB   int64
	// PacingCharge is the hook's charge model for every container of the node:
	// api.PacingChargeClass or api.PacingChargeKernel.
	PacingCharge string
	// MPS selects the GPUs served in mps sharing mode.
	MPS MPSConfig

	Watchdog             bool
	WatchdogInterval     time.Duration
	WatchdogGrace        time.Duration
	WatchdogAction       string
	WatchdogToleranceMiB int64
	ProcRoot             string

	// WatchdogWindow is how far back time over the memory limit counts toward
	// WatchdogGrace.
	WatchdogWindow time.Duration
	// WatchdogComputeAction, -Window and -Tolerance: sustained SM use above a
	// container's gpu-cores grant.
	WatchdogComputeAction    string
	WatchdogComputeWindow    time.Duration
	WatchdogComputeTolerance int
	// WatchdogEscalationWindow and WatchdogEvictAfter: the memory escalation from a
	// kill to stopping the container and evicting the pod.
	WatchdogEscalationWindow time.Duration
	WatchdogEvictAfter       int

	// MetricsAddr serves /metrics: over HTTPS to callers the API server authenticates
	// and allows to get the /metrics URL when MetricsSecure, in plain HTTP on a
	// loopback address otherwise.
	MetricsAddr   string
	MetricsSecure bool
	// TLSCertFile and TLSKeyFile are the HTTPS certificate and key; empty: self-signed,
	// generated at start.
	TLSCertFile string
	TLSKeyFile  string
	// HealthAddr serves /healthz and /readyz; equal to MetricsAddr, one server serves
	// all three. Empty: no health endpoints.
	HealthAddr string
	// CDISpecDir is where the node's CDI spec is written; empty: no CDI (the binding
	// adds device nodes itself and relies on the runtime for the driver's files).
	CDISpecDir string
	// CDIKind is the CDI devices' vendor/class.
	CDIKind string
	// CDIDriverRoot is where the agent sees the driver's root filesystem, and
	// CDIHostDriverRoot the same directory on the host.
	CDIDriverRoot, CDIHostDriverRoot string
	// CDILibrarySearchPaths are the only directories searched for the driver's
	// libraries (as the agent sees them); empty: the loader cache and the usual ones.
	CDILibrarySearchPaths []string
	// CDIHook is nvidia-cdi-hook's host path, "auto" or "none".
	CDIHook string
	// NRIUnavailable is what to do when NRI is asked for but the runtime has no NRI
	// socket at start-up: refuse GPU containers, or fall back to the binding at the
	// first CUDA call.
	NRIUnavailable string
	// CgroupRoot is where the host's cgroups are mounted.
	CgroupRoot string

	// StallTimeout is how long a loop (inventory poll, watchdog) may go without a
	// completed pass, and NRI without a connection to the runtime, before /healthz
	// fails and the kubelet restarts the agent.
	StallTimeout time.Duration
}

// Validate checks the configuration and names the flag at fault.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("--node-name is required (or set NODE_NAME, e.g. from the downward API)")
	}
	if c.Heartbeat < time.Second {
		return fmt.Errorf("--heartbeat %s is below 1s", c.Heartbeat)
	}
	if c.Poll < 100*time.Millisecond || c.Poll > c.Heartbeat {
		return fmt.Errorf("--poll %s must be between 100ms and --heartbeat (%s)", c.Poll, c.Heartbeat)
	}
	if err := api.ResourceNamesForDomain(c.ResourceDomain).Validate(field.NewPath("--resource-domain")).ToAggregate(); err != nil {
		return err
	}
	if err := c.validateDRA(); err != nil {
		return err
	}
	if c.DevicePlugin && (c.DevicePluginReplicas < 1 || c.DevicePluginReplicas > 1024) {
		return fmt.Errorf("--device-plugin-replicas %d out of range 1..1024", c.DevicePluginReplicas)
	}
	if (c.NRI || c.BindFallback) && len(c.SchedulerNames) == 0 {
		return errors.New("--scheduler-names must name at least one Tessera scheduler profile")
	}
	for _, n := range c.SchedulerNames {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return fmt.Errorf("--scheduler-names: %q: %s", n, strings.Join(errs, "; "))
		}
	}
	if err := c.validateFallback(); err != nil {
		return err
	}
	if err := c.MPS.validate(c.NRI); err != nil {
		return err
	}
	if (c.NRI || c.Watchdog || c.BindFallback) && c.StateDir == "" {
		return errors.New("--state-dir is required with --nri or --watchdog")
	}
	if (c.NRI || c.BindFallback) && !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("--state-dir %q must be an absolute path: the preload file in it is mounted into containers", c.StateDir)
	}
	if (c.NRI || c.BindFallback) && c.TurnsDir != "" && !filepath.IsAbs(c.TurnsDir) {
		return fmt.Errorf("--turns-dir %q must be an absolute path (or empty, for no GPU turns)", c.TurnsDir)
	}
	if (c.NRI || c.BindFallback) && !filepath.IsAbs(c.LimitsRoot) {
		return fmt.Errorf("--limits-root %q must be an absolute path", c.LimitsRoot)
	}
	if c.HookLibrary != "" && !filepath.IsAbs(c.HookLibrary) {
		return fmt.Errorf("--hook-library %q must be an absolute path", c.HookLibrary)
	}
	if err := c.validateServing(); err != nil {
		return err
	}
	if c.HealthAddr != "" {
		if c.StallTimeout < 2*c.Poll || (c.Watchdog && c.StallTimeout < 2*c.WatchdogInterval) {
			return fmt.Errorf("--stall-timeout %s must be at least twice --poll and --watchdog-interval", c.StallTimeout)
		}
	}
	if err := c.validateCDI(); err != nil {
		return err
	}
	if c.ContextMiB < 0 || c.ContextMiB > api.MaxContextMiB {
		return fmt.Errorf("--context-mib %d out of range 0..%d", c.ContextMiB, api.MaxContextMiB)
	}
	if _, err := api.ParsePacingCharge(c.PacingCharge); err != nil {
		return fmt.Errorf("--pacing-charge %w", err)
	}
	if c.Watchdog {
		if _, err := watchdog.ParseAction(c.WatchdogAction); err != nil {
			return fmt.Errorf("--watchdog-action: %w", err)
		}
		if c.WatchdogInterval < 100*time.Millisecond || c.WatchdogGrace < 0 || c.WatchdogToleranceMiB < 0 {
			return errors.New("--watchdog-interval must be at least 100ms, --watchdog-grace and --watchdog-tolerance-mib not negative")
		}
		if c.WatchdogWindow < c.WatchdogGrace || c.WatchdogWindow < c.WatchdogInterval {
			return fmt.Errorf("--watchdog-window %s must be at least --watchdog-grace and --watchdog-interval", c.WatchdogWindow)
		}
		if _, err := watchdog.ParseComputeAction(c.WatchdogComputeAction); err != nil {
			return fmt.Errorf("--watchdog-compute-action: %w", err)
		}
		if c.WatchdogComputeWindow < 2*c.WatchdogInterval || c.WatchdogComputeTolerance < 0 || c.WatchdogComputeTolerance > 100 {
			return errors.New("--watchdog-compute-window must be at least twice --watchdog-interval, --watchdog-compute-tolerance between 0 and 100")
		}
		if c.WatchdogEscalationWindow < c.WatchdogWindow || c.WatchdogEvictAfter < 0 {
			return fmt.Errorf("--watchdog-escalation-window %s must be at least --watchdog-window, --watchdog-evict-after not negative", c.WatchdogEscalationWindow)
		}
	}
	return nil
}

// OpenSource returns the simulated source when a file is given, NVML otherwise.
func OpenSource(c *Config, log logr.Logger) (gpu.Source, error) {
	if c.Simulate != "" {
		return simsource.New(c.Simulate, c.NodeName)
	}
	s, err := nvmlsource.New(nvml.New(), log.WithName("nvml"))
	if err != nil {
		return nil, fmt.Errorf("opening NVML (run with --simulate FILE on a machine without NVIDIA GPUs): %w", err)
	}
	return s, nil
}

// KubeClient builds a client from a kubeconfig file, or in-cluster when empty.
func KubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "tessera-node-agent"
	// Kubelet's own defaults (kubeAPIQPS 50, kubeAPIBurst 100). client-go's 5/10 let a
	// burst of pod deletions hold a container's binding, which re-reads pods from the
	// API server, past the runtime's NRI timeout (2 s in containerd): the container was
	// then created without its binding (test/node, RestartContainerd).
	cfg.QPS, cfg.Burst = 50, 100
	return kubernetes.NewForConfig(cfg)
}

// Agent is a running node agent.
type Agent struct {
	cfg      Config
	log      logr.Logger
	client   kubernetes.Interface
	source   gpu.Source
	recorder record.EventRecorder
	cancel   context.CancelFunc

	Publisher *inventory.Publisher
	Plugin    *deviceplugin.Plugin
	// DRA is the DRA kubelet plugin (--dra); nil when the node uses the device plugin.
	DRA      *dra.Driver
	Binder   *binding.Binder
	NRI      *nriplugin.Plugin
	Watchdog *watchdog.Watchdog
	// CDI writes the node's CDI spec (--cdi-spec-dir).
	CDI *cdi.Generator
	// req is what the node lacks of Tessera's requirements.
	req requirements
	// statfs reads a filesystem's type (unix.Statfs; tests replace it).
	statfs func(string, *unix.Statfs_t) error
	// Fallback is the binding at the first CUDA call (--bind-fallback).
	Fallback *fallback
	// pods is this node's pods, for the bindings.
	pods    *podCache
	Metrics *metrics.Metrics
	Health  *health.Checker
	// Auth guards the metrics endpoint (with --metrics-secure): New delegates it to the
	// API server; tests may replace it before Run.
	Auth *serving.Auth
	// MPS supervises the MPS control daemons (--mps-gpus); nil when none.
	MPS *mps.Supervisor
	// fenceDriver is the source's per-cgroup memory limit, nil when it has none;
	// fence is what detectFence found of it.
	fenceDriver gpu.MemoryFence
	fence       fenceState
}

// New builds an agent from its parts; Run starts it. A nil recorder sends events to
// the API server.
func New(cfg Config, log logr.Logger, client kubernetes.Interface, source gpu.Source, recorder record.EventRecorder) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, client: client, source: source, recorder: recorder, statfs: unix.Statfs}
	// Taken before the source is wrapped: the wrappers pass on only gpu.Source.
	a.fenceDriver, _ = source.(gpu.MemoryFence)
	a.Publisher = &inventory.Publisher{
		Client: client, NodeName: cfg.NodeName, Source: source, Log: log.WithName("inventory"),
		Heartbeat: cfg.Heartbeat, Poll: cfg.Poll,
	}
	a.Metrics = metrics.New(func() (time.Duration, bool) {
		_, at := a.Publisher.Last()
		return time.Since(at), !at.IsZero()
	})
	// The GPUs served in mps mode are published so: every reader of the inventory
	// goes through the wrapped source.
	source, err := a.setupMPS(source)
	if err != nil {
		return nil, err
	}
	source = &fenceSource{Source: source, fence: &a.fence}
	source = &contextSource{Source: source, contextMiB: cfg.ContextMiB, dra: cfg.DRA}
	a.source, a.Publisher.Source = source, source

	names := api.ResourceNamesForDomain(cfg.ResourceDomain)
	if cfg.DevicePlugin {
		p, err := deviceplugin.New(deviceplugin.Config{
			ResourceName: string(names.GPU), Dir: cfg.DevicePluginDir, Replicas: cfg.DevicePluginReplicas,
			Log: log.WithName("deviceplugin"), Allocate: a.allocate,
		})
		if err != nil {
			return nil, err
		}
		a.Plugin = p
	}
	var store *checkpoint.Store
	if cfg.NRI || cfg.Watchdog || cfg.BindFallback || cfg.DRA {
		var err error
		store, err = checkpoint.Open(filepath.Join(cfg.StateDir, "checkpoint.json"))
		if errors.Is(err, checkpoint.ErrCorrupt) {
			// Not fatal: the NRI synchronisation rebuilds every running container's
			// record from its pod's assignment.
			log.Error(err, "checkpoint discarded; records will be rebuilt from the runtime")
		} else if err != nil {
			return nil, err
		}
	}
	if cfg.CDISpecDir != "" {
		g, err := a.newCDI()
		if err != nil {
			return nil, err
		}
		a.CDI = g
	}
	var claims *checkpoint.Store
	if cfg.DRA {
		var err error
		claims, err = checkpoint.Open(filepath.Join(cfg.StateDir, DRACheckpoint))
		if errors.Is(err, checkpoint.ErrCorrupt) {
			// Not fatal: kubelet prepares every claim of a running pod again after the
			// agent restarts, which binds it again.
			log.Error(err, "DRA claim checkpoint discarded; claims are bound again as kubelet prepares them")
		} else if err != nil {
			return nil, err
		}
	}
	if cfg.NRI || cfg.BindFallback || cfg.DRA {
		pods, err := newPodCache(client, cfg.NodeName)
		if err != nil {
			return nil, err
		}
		a.pods = pods
		bc := binding.Config{
			NodeName: cfg.NodeName, Names: names, Devices: source.Devices, Store: store,
			LimitsRoot: cfg.LimitsRoot, HookLibrary: cfg.HookLibrary, PreloadFile: filepath.Join(cfg.StateDir, "ld.so.preload"),
			DevDir: cfg.DevDir, ProcRoot: cfg.ProcRoot, ContextMiB: cfg.ContextMiB, MPS: a.mpsDirs,
			ChargeKernel: cfg.PacingCharge == api.PacingChargeKernel,
			Pods:         pods.Get, CachedPod: pods.Cached, SchedulerNames: cfg.SchedulerNames, Inventory: a.inventory,
			Unmet: a.req.bindRefusal, ClaimStore: claims,
		}
		if cfg.DRA && cfg.DRAClaimRegionTmpfs {
			bc.ClaimRegions = binding.TmpfsRegions{}
		}
		if a.fenceDriver != nil {
			bc.Fence = &binding.Fence{Driver: a.fenceDriver, Supported: a.fence.has, CgroupRoot: a.cgroupRoot()}
		}
		if a.CDI != nil {
			bc.CDI = a.CDI
		}
		bc.TurnsDir = cfg.TurnsDir
		b, err := binding.New(bc)
		if err != nil {
			return nil, err
		}
		a.Binder = b
	}
	if cfg.DRA {
		d, err := dra.New(dra.Config{
			NodeName: cfg.NodeName, Client: client, Binder: a.Binder, Inventory: a.inventory,
			ClaimSpecDir: cfg.DRACDISpecDir, PluginDir: cfg.DRAPluginDir, RegistrarDir: cfg.DRARegistrarDir,
			Log: log.WithName("dra"),
		})
		if err != nil {
			return nil, err
		}
		a.DRA = d
	}
	if cfg.NRI {
		a.NRI = nriplugin.New(a.Binder, cfg.NRISocket, log.WithName("nri"))
		if a.CDI != nil {
			a.NRI.ResolveCDI = a.CDI.Resolve
			a.NRI.CDIKind = a.CDI.Kind()
		}
		a.NRI.OnRefused = func(ns, pod, c, reason string) {
			a.Metrics.ContainerRefused()
			a.podEvent(ns, pod, "", "GPUContainerRefused", reason)
		}
	}
	if cfg.BindFallback {
		f, err := a.newFallback()
		if err != nil {
			return nil, err
		}
		a.Fallback = f
	}
	if cfg.Watchdog {
		action, _ := watchdog.ParseAction(cfg.WatchdogAction)
		computeAction, _ := watchdog.ParseComputeAction(cfg.WatchdogComputeAction)
		// A DRA node's claims are watched too: their processes are found by the claim's
		// limits mount (watchdog/claims.go).
		records := store.List
		if claims != nil {
			records = func() []checkpoint.Record { return append(store.List(), claims.List()...) }
		}
		w, err := watchdog.New(watchdog.Config{
			Source: source, Records: records, ProcRoot: cfg.ProcRoot, Interval: cfg.WatchdogInterval,
			Grace: cfg.WatchdogGrace, ToleranceMiB: cfg.WatchdogToleranceMiB, Action: action, Metrics: a.Metrics,
			Window: cfg.WatchdogWindow, ComputeAction: computeAction, ComputeWindow: cfg.WatchdogComputeWindow, ComputeTolerance: cfg.WatchdogComputeTolerance, MPSGPU: a.servesMPS,
			EscalationWindow: cfg.WatchdogEscalationWindow, EvictAfter: cfg.WatchdogEvictAfter, Evict: a.evict,
			Log: log.WithName("watchdog"),
			Event: func(r checkpoint.Record, reason, msg string) {
				if r.Claim {
					a.claimEvent(r, reason, msg)
					return
				}
				a.podEvent(r.Namespace, r.Pod, r.PodUID, reason, msg)
			},
			NodeEvent: func(reason, msg string) { a.nodeEvent(corev1.EventTypeWarning, reason, msg) },
		})
		if err != nil {
			return nil, err
		}
		a.Watchdog = w
	}
	a.Publisher.OnPublish = a.onPublish
	if a.MPS != nil {
		a.Metrics.Registry.MustRegister(a.MPS)
	}
	a.Health = a.healthChecks()
	a.Metrics.SetReadiness(func() bool { return a.Health.Ready().OK })
	if cfg.MetricsAddr != "" && cfg.MetricsSecure {
		auth, err := serving.Delegated(client)
		if err != nil {
			return nil, err
		}
		a.Auth = auth
	}
	return a, nil
}

// healthChecks builds the probes from the subsystems that are on. Liveness fails only
// for a loop that stopped making progress (or NRI that stayed disconnected), which a
// restart can cure; readiness also fails while the node's inventory is not fresh, the
// runtime is not connected or kubelet has not registered the device plugin.
func (a *Agent) healthChecks() *health.Checker {
	c := &health.Checker{}
	stall := a.cfg.StallTimeout
	// The published inventory must be younger than two heartbeats and a poll: the
	// scheduler's staleness limit is well above that.
	fresh := 2*a.cfg.Heartbeat + a.cfg.Poll
	c.Add(health.Check{
		Name: "inventory",
		Live: func(now time.Time) error { return a.Publisher.Progress().Stalled(now, stall, "inventory poll loop") },
		Ready: func(now time.Time) error {
			_, at := a.Publisher.Last()
			_, lastErr := a.Publisher.Progress().Last()
			why := ""
			if lastErr != nil {
				why = ": " + lastErr.Error()
			}
			if at.IsZero() {
				return fmt.Errorf("GPU inventory not published yet%s", why)
			}
			if age := now.Sub(at); age > fresh {
				return fmt.Errorf("GPU inventory last published %s ago (limit %s)%s", age.Round(time.Second), fresh, why)
			}
			return nil
		},
	})
	if a.NRI != nil {
		state := func(now time.Time, bound time.Duration) error {
			up, since, err := a.NRI.Connected()
			if up {
				return nil
			}
			if since.IsZero() {
				return errors.New("NRI plugin not started")
			}
			if age := now.Sub(since); age > bound {
				why := ""
				if err != nil {
					why = ": " + err.Error()
				}
				return fmt.Errorf("not connected to the runtime's NRI socket %s for %s%s", a.cfg.NRISocket, age.Round(time.Second), why)
			}
			return nil
		}
		c.Add(health.Check{
			Name:  "nri",
			Live:  func(now time.Time) error { return state(now, stall) },
			Ready: func(now time.Time) error { return state(now, 0) },
		})
	}
	// Not ready while the node lacks what Tessera needs (GPU containers are refused
	// meanwhile); a restart cures none of it, so liveness is not affected.
	c.Add(health.Check{Name: "node-requirements", Ready: func(time.Time) error {
		if l := a.req.list(); len(l) > 0 {
			return errors.New(strings.Join(l, "; "))
		}
		return nil
	}})
	if a.Plugin != nil {
		c.Add(health.Check{Name: "device-plugin", Ready: func(time.Time) error {
			if ok, _, err := a.Plugin.Registered(); !ok {
				if err != nil {
					return fmt.Errorf("not registered with kubelet: %v", err)
				}
				return errors.New("not registered with kubelet yet")
			}
			return nil
		}})
	}
	if a.DRA != nil {
		c.Add(health.Check{Name: "dra-plugin", Ready: func(time.Time) error {
			if ok, why := a.DRA.Registered(); !ok {
				return fmt.Errorf("DRA plugin %s: %s", dra.DriverName, why)
			}
			return nil
		}})
	}
	if a.Fallback != nil {
		c.Add(health.Check{Name: "fallback-binding", Ready: func(time.Time) error {
			if !a.Fallback.server.Serving() {
				return fmt.Errorf("not serving %s yet (waiting for the pod cache)", a.cfg.BindSocket)
			}
			return nil
		}})
	}
	if a.MPS != nil {
		c.Add(a.mpsHealth())
	}
	if a.Watchdog != nil {
		c.Add(health.Check{Name: "watchdog", Live: func(now time.Time) error {
			return a.Watchdog.Progress().Stalled(now, stall, "watchdog loop")
		}})
	}
	return c
}

// inventory is the node's last published GPU inventory, or a fresh reading before the
// first publication.
func (a *Agent) inventory() (*api.NodeInventory, error) {
	if inv, _ := a.Publisher.Last(); inv != nil {
		return inv, nil
	}
	return a.source.Inventory()
}

func (a *Agent) podEvent(namespace, pod, uid, reason, msg string) {
	if a.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: pod, UID: types.UID(uid)}
	a.recorder.Event(ref, corev1.EventTypeWarning, reason, msg)
}

// evict asks the API server to evict the pod of r (policy/v1 Eviction, so that
// PodDisruptionBudgets are honoured), for that pod's UID only: a pod of the same name
// created since is not touched. A pod that is gone, or replaced, needs no eviction.
func (a *Agent) evict(r checkpoint.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.Claim {
		return a.evictClaimPods(ctx, r)
	}
	return a.evictPod(ctx, r.Namespace, r.Pod, r.PodUID)
}

func (a *Agent) evictPod(ctx context.Context, namespace, name, podUID string) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if podUID != "" {
		uid := types.UID(podUID)
		ev.DeleteOptions = &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	}
	err := a.client.CoreV1().Pods(namespace).EvictV1(ctx, ev)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) && podUID != "" {
		return nil
	}
	return err
}

// evictClaimPods evicts the pods a claim is reserved for (its status.reservedFor, by
// name and UID): a claim's record names the claim, not a pod. A claim that is gone,
// or was made again under its name, has no pod of this record left.
func (a *Agent) evictClaimPods(ctx context.Context, r checkpoint.Record) error {
	c, err := a.client.ResourceV1().ResourceClaims(r.Namespace).Get(ctx, r.Pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && string(c.UID) != r.ContainerID {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" {
			continue
		}
		if err := a.evictPod(ctx, r.Namespace, ref.Name, string(ref.UID)); err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s of claim %s: %w", r.Namespace, ref.Name, r.Pod, err))
		}
	}
	return errors.Join(errs...)
}

// claimEvent records a warning on a ResourceClaim (the watchdog's word on a claim's
// containers).
func (a *Agent) claimEvent(r checkpoint.Record, reason, msg string) {
	if a.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: "resource.k8s.io/v1", Namespace: r.Namespace, Name: r.Pod,
		UID: types.UID(r.ContainerID)}
	a.recorder.Event(ref, corev1.EventTypeWarning, reason, msg)
}

// onPublish fans a freshly published inventory out to the subsystems that follow it.
func (a *Agent) onPublish(inv *api.NodeInventory) {
	if a.Plugin != nil {
		a.Plugin.Update(inv)
	}
	if a.DRA != nil {
		if err := a.DRA.Publish(inv); err != nil {
			a.log.Error(err, "ResourceSlices not published")
		}
	}
	a.Metrics.SetInventory(inv)
}

// Run runs every enabled subsystem until ctx is done.
func (a *Agent) Run(ctx context.Context) error {
	ctx, a.cancel = context.WithCancel(ctx)
	defer a.cancel()
	if a.recorder == nil {
		bc := record.NewBroadcaster(record.WithContext(ctx))
		bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
		defer bc.Shutdown()
		a.recorder = bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-node-agent", Host: a.cfg.NodeName})
	}
	a.Publisher.Recorder = a.recorder
	// Checked before anything is served: a GPU container is refused while the node
	// lacks what Tessera needs.
	a.checkStatic()
	a.detectFence()
	// The first CDI spec is written before the NRI plugin and the device plugin serve:
	// a GPU container arriving in their first milliseconds would otherwise be refused
	// for want of a spec (in the fallback mode kubelet then fails its pod for good).
	if a.CDI != nil {
		a.syncCDI()
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	start("health", func(ctx context.Context) error {
		err := a.source.WatchHealth(ctx, func(e gpu.HealthEvent) {
			a.log.Info("GPU health changed", "uuid", e.UUID, "healthy", e.Healthy, "reason", e.Reason)
			a.Publisher.Trigger()
		})
		if err != nil {
			a.log.Error(err, "GPU health events stopped; health is read on each refresh only")
		}
		return nil
	})
	start("inventory", func(ctx context.Context) error { a.Publisher.Run(ctx); return nil })
	start("requirements", a.watchRequirements)
	if a.Plugin != nil {
		start("device plugin", a.Plugin.Run)
	}
	if a.DRA != nil {
		if err := a.DRA.Start(ctx); err != nil {
			a.cancel()
			wg.Wait()
			return err
		}
		defer a.DRA.Stop()
		start("DRA plugin", func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return nil
			case err := <-a.DRA.Fatal():
				return err
			}
		})
	}
	if a.pods != nil {
		a.pods.start(ctx)
		defer a.pods.shutdown()
	}
	if a.NRI != nil {
		start("NRI", a.NRI.Run)
	}
	if a.Fallback != nil {
		start("fallback binding", a.Fallback.run)
	}
	if a.Watchdog != nil {
		start("watchdog", a.Watchdog.Run)
	}
	if a.MPS != nil {
		start("MPS", a.runMPS)
	}
	if err := a.serve(ctx, start); err != nil {
		a.cancel()
		wg.Wait()
		return err
	}
	// A subsystem that fails for good stops the agent, so that its pod restarts and the
	// failure is visible, rather than running half-working.
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		a.cancel()
	}
	wg.Wait()
	return err
}

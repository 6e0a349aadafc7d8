// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/bindserver"
	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/inventory"
	nriplugin "github.com/tessera-dev/tessera/node-agent/nri"
	"github.com/tessera-dev/tessera/node-agent/watchdog"
)

// DefaultSchedulerNames are the profiles of the scheduler configuration Tessera ships.
var DefaultSchedulerNames = []string{"tessera-binpack", "tessera-spread", "tessera-fragmentation"}

// BindFlags registers the agent's flags on fs, with their defaults.
func BindFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node's Node object (default $NODE_NAME)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&c.Simulate, "simulate", "", "read the GPUs from this simulated topology file instead of NVML; "+
		"turns --device-plugin, --nri, --watchdog, --metrics-addr and --health-addr off unless they are given")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 30*time.Second, "re-confirm the inventory annotation at least this often")
	fs.DurationVar(&c.Poll, "poll", 5*time.Second, "read the GPUs this often to detect changes")
	fs.StringVar(&c.ResourceDomain, "resource-domain", api.DefaultDomain, "domain of the GPU resource names (<domain>/gpu, <domain>/gpu-memory, ...)")
	fs.Func("scheduler-names", "comma-separated Tessera scheduler profiles whose pods' GPU assignments are enforced (default "+
		strings.Join(DefaultSchedulerNames, ",")+"); a pod naming another scheduler is never bound", func(v string) error {
		c.SchedulerNames = nil
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.SchedulerNames = append(c.SchedulerNames, n)
			}
		}
		return nil
	})
	c.SchedulerNames = DefaultSchedulerNames

	fs.BoolVar(&c.DevicePlugin, "device-plugin", true, "register the GPU resource with kubelet as a device plugin")
	fs.StringVar(&c.DevicePluginDir, "device-plugin-dir", pluginapi.DevicePluginPath, "kubelet's device-plugin directory (holds kubelet.sock)")
	fs.IntVar(&c.DevicePluginReplicas, "device-plugin-replicas", 32, "containers that may share one GPU, as kubelet counts <domain>/gpu")

	bindDRAFlags(fs, c)

	fs.BoolVar(&c.NRI, "nri", true, "bind GPU containers at creation through the runtime's NRI socket")
	fs.StringVar(&c.NRISocket, "nri-socket", nriplugin.DefaultSocket, "the runtime's NRI socket")
	fs.BoolVar(&c.BindFallback, "bind-fallback", false, "without NRI: bind GPU containers at their first CUDA call through --bind-socket, "+
		"which the device plugin mounts into them with the hook (needs --nri=false, --device-plugin, --hook-library)")
	fs.StringVar(&c.BindSocket, "bind-socket", bindserver.DefaultSocket, "host path of the fallback binding's socket; its directory holds nothing else "+
		"and is mounted read-only at "+api.ContainerLimitsDir+" in GPU containers")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/tessera", "directory for the checkpoint of bound containers and the preload file")
	fs.StringVar(&c.TurnsDir, "turns-dir", api.DefaultHostTurnsDir, "host directory of the GPU turn files, mounted read-write into containers paced on a time-sliced GPU (on tmpfs: they must start empty at boot); empty: none")
	fs.StringVar(&c.LimitsRoot, "limits-root", api.DefaultHostLimitsRoot, "host directory holding one limits directory per bound container")
	fs.StringVar(&c.HookLibrary, "hook-library", "", "host path of the CUDA hook library to preload in GPU containers (empty: no hook)")
	fs.StringVar(&c.DevDir, "dev-dir", "/dev", "where the host's NVIDIA device nodes are visible to the agent")
	fs.Int64Var(&c.ContextMiB, "context-mib", api.DefaultContextMiB, "MiB charged per CUDA context against a container's memory limit")
	fs.StringVar(&c.PacingCharge, "pacing-charge", api.PacingChargeKernel, "how the CUDA hook charges a kernel launch against a container's cores: "+
		api.PacingChargeKernel+" (its own kernel's estimate; holds attention and other workloads that mix long kernels among short ones) or "+
		api.PacingChargeClass+" (its class's, the model before per-kernel charges); written into every container's limits file")

	fs.StringVar(&c.NRIUnavailable, "nri-unavailable", NRIUnavailableRefuse, "with --nri, when the runtime has no NRI socket at start-up: "+
		"refuse (GPU containers are refused, with the reason, until NRI is there) or fallback (bind at the first CUDA call, as --bind-fallback; needs --hook-library)")
	fs.StringVar(&c.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", "where the host's cgroups are mounted (cgroup v2, or hybrid with v2 at <root>/unified)")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", cdi.DefaultSpecDir, "write the node's CDI spec for its GPUs here and give containers their GPUs and the "+
		"driver's files as CDI devices (empty: no CDI; device nodes only, the driver's files must come from the runtime)")
	fs.StringVar(&c.CDIKind, "cdi-kind", cdi.DefaultKind, "vendor/class of Tessera's CDI devices (<kind>=<GPU or MIG UUID>)")
	fs.StringVar(&c.CDIDriverRoot, "cdi-driver-root", "/", "where the agent sees the root filesystem that holds the NVIDIA driver's libraries and binaries")
	fs.StringVar(&c.CDIHostDriverRoot, "cdi-host-driver-root", "/", "the same directory as the host (the runtime) sees it")
	fs.Func("cdi-library-search-paths", "comma-separated directories (as the agent sees them) that alone are searched for the driver's libraries, "+
		"for drivers outside the loader cache and the usual directories (e.g. /usr/local/nvidia/lib64)", func(v string) error {
		c.CDILibrarySearchPaths = nil
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.CDILibrarySearchPaths = append(c.CDILibrarySearchPaths, p)
			}
		}
		return nil
	})
	fs.StringVar(&c.CDIHook, "cdi-hook", cdi.HookAuto, "host path of the NVIDIA container toolkit's nvidia-cdi-hook for the spec to call "+
		"(it updates the container's loader cache), auto (use it where installed under --cdi-driver-root) or none "+
		"(never: libraries are mounted under their sonames in "+cdi.ContainerLibraryDir+", which is added to LD_LIBRARY_PATH)")

	fs.BoolVar(&c.Watchdog, "watchdog", true, "watch NVML's per-process usage and act on containers above their memory or compute grant")
	fs.DurationVar(&c.WatchdogInterval, "watchdog-interval", watchdog.DefaultInterval, "how often the watchdog samples usage")
	fs.DurationVar(&c.WatchdogGrace, "watchdog-grace", watchdog.DefaultGrace, "time above its memory limit, within --watchdog-window, "+
		"that a container may accumulate before the action (dips under the limit do not reset it)")
	fs.DurationVar(&c.WatchdogWindow, "watchdog-window", watchdog.DefaultWindow, "how far back time above the memory limit counts toward --watchdog-grace")
	fs.StringVar(&c.WatchdogAction, "watchdog-action", string(watchdog.DefaultAction), "what to do about a container above its memory limit: "+
		"kill (end its processes on that GPU, with a pod event and a metric) or event (pod event and metric only)")
	fs.Int64Var(&c.WatchdogToleranceMiB, "watchdog-tolerance-mib", 64, "MiB above the limit tolerated before a container counts as over")
	fs.StringVar(&c.WatchdogComputeAction, "watchdog-compute-action", string(watchdog.DefaultComputeAction), "what to do about a container "+
		"whose SM use averaged over --watchdog-compute-window stays above its gpu-cores grant: off, event or kill")
	fs.DurationVar(&c.WatchdogComputeWindow, "watchdog-compute-window", watchdog.DefaultComputeWindow, "the span SM use is averaged over")
	fs.IntVar(&c.WatchdogComputeTolerance, "watchdog-compute-tolerance", watchdog.DefaultComputeTolerance, "percentage points of the GPU tolerated above the gpu-cores grant")
	fs.DurationVar(&c.WatchdogEscalationWindow, "watchdog-escalation-window", watchdog.DefaultEscalationWindow, "with --watchdog-action=kill: how long a pod "+
		"is remembered after a memory kill or stop; a container of it over its memory limit again within it is stopped as a whole (every process), without a grace")
	fs.IntVar(&c.WatchdogEvictAfter, "watchdog-evict-after", watchdog.DefaultEvictAfter, "with --watchdog-action=kill: evict a pod (Eviction API) "+
		"once its containers were stopped this many times within --watchdog-escalation-window; 0 never evicts")
	bindMPSFlags(fs, &c.MPS)
	fs.StringVar(&c.ProcRoot, "proc-root", "/proc", "the host's /proc (the agent needs the host PID namespace)")

	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9464", "address of the Prometheus endpoint /metrics (empty: none)")
	fs.BoolVar(&c.MetricsSecure, "metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates (TokenReview) "+
		"and allows to get the /metrics URL (SubjectAccessReview); false: plain HTTP, only on a loopback --metrics-addr (local development)")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", "", "HTTPS certificate of the metrics endpoint, re-read when it changes (empty: self-signed, generated at start)")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", "", "the key of --tls-cert-file")
	fs.StringVar(&c.HealthAddr, "health-addr", ":9465", "address of the /healthz, /livez and /readyz endpoints, plain HTTP without authentication "+
		"(equal to --metrics-addr: served there, open to all; empty: none)")
	fs.DurationVar(&c.StallTimeout, "stall-timeout", 3*time.Minute, "/healthz fails when the inventory poll or watchdog loop completes no pass, "+
		"or NRI stays disconnected, for this long")
}

// ApplySimulateDefaults turns off, for a simulated node, the subsystems that need a
// real node (kubelet, a runtime, GPU processes, a free port per agent) unless the
// flag was given explicitly.
func ApplySimulateDefaults(fs *flag.FlagSet, c *Config) {
	if c.Simulate == "" {
		return
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["device-plugin"] {
		c.DevicePlugin = false
	}
	if !set["nri"] {
		c.NRI = false
	}
	if !set["watchdog"] {
		c.Watchdog = false
	}
	if !set["metrics-addr"] {
		c.MetricsAddr = ""
	}
	if !set["health-addr"] {
		c.HealthAddr = ""
	}
	if !set["cdi-spec-dir"] {
		c.CDISpecDir = ""
	}
}

// Main opens the GPU source and the API client and runs the agent until ctx is done.
func Main(ctx context.Context, cfg Config, log logr.Logger) error {
	// The API machinery (client-go, the metrics endpoint's authentication) logs through
	// klog: into the agent's log, in its format.
	klog.SetLogger(log.WithName("k8s"))
	if msg := NRIFallback(&cfg); msg != "" {
		log.Error(errors.New(msg), "NRI unavailable at start-up")
	}
	src, err := OpenSource(&cfg, log)
	if err != nil {
		return err
	}
	defer src.Close()
	client, err := KubeClient(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	a, err := New(cfg, log, client, src, nil)
	if err != nil {
		return err
	}
	log.Info("node agent starting", "node", cfg.NodeName, "simulate", cfg.Simulate, "devicePlugin", cfg.DevicePlugin, "dra", cfg.DRA,
		"nri", cfg.NRI, "bindFallback", cfg.BindFallback, "cdiSpecDir", cfg.CDISpecDir, "watchdog", cfg.Watchdog, "metrics", cfg.MetricsAddr, "metricsSecure", cfg.MetricsSecure)
	return a.Run(ctx)
}

// PrintInventory writes the inventory the agent would publish, and the labels, as JSON.
func PrintInventory(w io.Writer, cfg *Config, log logr.Logger) error {
	src, err := OpenSource(cfg, log)
	if err != nil {
		return err
	}
	defer src.Close()
	inv, err := src.Inventory()
	if err != nil {
		return err
	}
	inv.UpdatedAt = time.Now().UTC().Truncate(time.Second)
	if err := inv.Validate(); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"inventory": inv, "labels": inventory.Labels(inv)})
}

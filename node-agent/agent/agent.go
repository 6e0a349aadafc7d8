// Package agent wires the node agent's subsystems together: the GPU source (NVML or a
// simulated topology), the inventory publisher, and, each switchable by its own flag,
// the kubelet device plugin, the NRI container binding, the usage watchdog and the
// metrics endpoint.
package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/inventory"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
	"github.com/tessera-dev/tessera/node-agent/simsource"
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

	DevicePlugin         bool
	DevicePluginDir      string
	DevicePluginReplicas int
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
	if err := api.ResourceNamesForDomain(c.ResourceDomain).Validate("--resource-domain"); err != nil {
		return err
	}
	if c.DevicePlugin && (c.DevicePluginReplicas < 1 || c.DevicePluginReplicas > 1024) {
		return fmt.Errorf("--device-plugin-replicas %d out of range 1..1024", c.DevicePluginReplicas)
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
	return kubernetes.NewForConfig(cfg)
}

// Agent is a running node agent.
type Agent struct {
	cfg       Config
	log       logr.Logger
	client    kubernetes.Interface
	source    gpu.Source
	recorder  record.EventRecorder
	cancel    context.CancelFunc
	Publisher *inventory.Publisher
	Plugin    *deviceplugin.Plugin
}

// New builds an agent from its parts; Run starts it.
func New(cfg Config, log logr.Logger, client kubernetes.Interface, source gpu.Source) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, client: client, source: source}
	a.Publisher = &inventory.Publisher{
		Client: client, NodeName: cfg.NodeName, Source: source, Log: log.WithName("inventory"),
		Heartbeat: cfg.Heartbeat, Poll: cfg.Poll,
	}
	names := api.ResourceNamesForDomain(cfg.ResourceDomain)
	if cfg.DevicePlugin {
		p, err := deviceplugin.New(deviceplugin.Config{
			ResourceName: string(names.GPU), Dir: cfg.DevicePluginDir, Replicas: cfg.DevicePluginReplicas,
			Log: log.WithName("deviceplugin"),
		})
		if err != nil {
			return nil, err
		}
		a.Plugin = p
	}
	a.Publisher.OnPublish = a.onPublish
	return a, nil
}

// onPublish fans a freshly published inventory out to the subsystems that follow it.
func (a *Agent) onPublish(inv *api.NodeInventory) {
	if a.Plugin != nil {
		a.Plugin.Update(inv)
	}
}

// Run runs every enabled subsystem until ctx is done.
func (a *Agent) Run(ctx context.Context) error {
	ctx, a.cancel = context.WithCancel(ctx)
	defer a.cancel()
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer bc.Shutdown()
	a.recorder = bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-node-agent", Host: a.cfg.NodeName})
	a.Publisher.Recorder = a.recorder

	go func() {
		err := a.source.WatchHealth(ctx, func(e gpu.HealthEvent) {
			a.log.Info("GPU health changed", "uuid", e.UUID, "healthy", e.Healthy, "reason", e.Reason)
			a.Publisher.Trigger()
		})
		if err != nil {
			a.log.Error(err, "GPU health events stopped; health is read on each refresh only")
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	start("inventory", func(ctx context.Context) error { a.Publisher.Run(ctx); return nil })
	if a.Plugin != nil {
		start("device plugin", a.Plugin.Run)
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

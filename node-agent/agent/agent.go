// Package agent wires the node agent's subsystems together: the GPU source (NVML or a
// simulated topology), the inventory publisher, and, each switchable by its own flag,
// the kubelet device plugin, the NRI container binding, the usage watchdog and the
// metrics endpoint.
package agent

import (
	"context"
	"errors"
	"fmt"
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
	Publisher *inventory.Publisher
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
	return a, nil
}

// Run runs every enabled subsystem until ctx is done.
func (a *Agent) Run(ctx context.Context) error {
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
	a.Publisher.Run(ctx)
	return nil
}

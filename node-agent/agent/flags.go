package agent

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/go-logr/logr"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
)

// BindFlags registers the agent's flags on fs, with their defaults.
func BindFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node's Node object (default $NODE_NAME)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&c.Simulate, "simulate", "", "read the GPUs from this simulated topology file instead of NVML")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 30*time.Second, "re-confirm the inventory annotation at least this often")
	fs.DurationVar(&c.Poll, "poll", 5*time.Second, "read the GPUs this often to detect changes")
	fs.StringVar(&c.ResourceDomain, "resource-domain", api.DefaultDomain, "domain of the GPU resource names (<domain>/gpu, <domain>/gpu-memory, ...)")
	fs.BoolVar(&c.DevicePlugin, "device-plugin", true, "register the GPU resource with kubelet as a device plugin")
	fs.StringVar(&c.DevicePluginDir, "device-plugin-dir", pluginapi.DevicePluginPath, "kubelet's device-plugin directory (holds kubelet.sock)")
	fs.IntVar(&c.DevicePluginReplicas, "device-plugin-replicas", 32, "containers that may share one GPU, as kubelet counts <domain>/gpu")
}

// Main opens the GPU source and the API client and runs the agent until ctx is done.
func Main(ctx context.Context, cfg Config, log logr.Logger) error {
	src, err := OpenSource(&cfg, log)
	if err != nil {
		return err
	}
	defer src.Close()
	client, err := KubeClient(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	a, err := New(cfg, log, client, src)
	if err != nil {
		return err
	}
	log.Info("node agent starting", "node", cfg.NodeName, "simulate", cfg.Simulate)
	return a.Run(ctx)
}

// SPDX-License-Identifier: Apache-2.0

//go:build linux && nodebox

// With the nodebox build tag the suite's test binary is also every component of the
// node (kube-apiserver, etcd, kubelet, kubectl, tessera-scheduler, tessera-node-agent),
// chosen by the name it is run under, as hyperkube was: one binary shares the
// Kubernetes code the six would each carry, which is what lets the suite travel to a
// GPU machine without Go (test/node/gpu-bundle.sh). It is built only for that.
package node

import (
	"context"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	agentapp "github.com/tessera-dev/tessera/cmd/tessera-node-agent/app"
	scheduler "github.com/tessera-dev/tessera/cmd/tessera-scheduler/app"
	"github.com/tessera-dev/tessera/node-agent/mps"
)

func init() { boxMain = runBox }

// runBox runs the component named name and returns its exit code, or false when name
// is not one (the binary then runs the tests).
func runBox(name string, args []string) (int, bool) {
	// The agent starts each MPS control daemon through its own binary (the exec
	// helper), which here is this one under the name nodebox (os.Executable resolves
	// the agent's link): the helper mounts, execs the control program and never
	// returns. Without it that call would run the tests.
	mps.RunExecHelper()
	switch name {
	case "kube-apiserver":
		return cli.Run(apiserver.NewAPIServerCommand()), true
	case "kubelet":
		return cli.Run(kubelet.NewKubeletCommand(context.Background())), true
	case "tessera-scheduler":
		return cli.Run(scheduler.NewCommand()), true
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
		return 0, true
	case "kubectl":
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0, true
	case "tessera-node-agent":
		return agentapp.Run(args, "nodebox", "unknown"), true
	}
	return 0, false
}

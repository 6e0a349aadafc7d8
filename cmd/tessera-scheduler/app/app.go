// SPDX-License-Identifier: Apache-2.0

// Package app builds the Tessera scheduler command: kube-scheduler's command with the
// GPU-sharing plugin and TesseraNodeResourcesFit registered, and policy flags for users
// who do not write configs.
package app

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-dev/tessera/plugins/gpushare"
	"github.com/tessera-dev/tessera/plugins/gpushare/draplacement"
	"github.com/tessera-dev/tessera/plugins/noderesourcesfit"
)

// policyFlag is a pflag.Value for a gpushare.Policy.
type policyFlag struct{ p *gpushare.Policy }

func (f policyFlag) String() string { return string(*f.p) }
func (f policyFlag) Type() string   { return "policy" }
func (f policyFlag) Set(s string) error {
	p, err := gpushare.ParsePolicy(s)
	if err != nil {
		return err
	}
	*f.p = p
	return nil
}

// AddFlags registers the policy flags on fs; they fill d.
func AddFlags(fs *pflag.FlagSet, d *gpushare.Defaults) {
	fs.Var(policyFlag{&d.NodePolicy}, "gpu-node-policy",
		fmt.Sprintf("Node-level GPU placement policy (%s, %s or %s) for profiles whose %s args do not set nodePolicy.", gpushare.Binpack, gpushare.Spread, gpushare.Fragmentation, gpushare.Name))
	fs.Var(policyFlag{&d.DevicePolicy}, "gpu-device-policy",
		fmt.Sprintf("GPU-level placement policy (%s, %s or %s) for profiles whose %s args do not set devicePolicy.", gpushare.Binpack, gpushare.Spread, gpushare.Fragmentation, gpushare.Name))
}

// NewCommand returns the tessera-scheduler command.
func NewCommand(opts ...schedapp.Option) *cobra.Command {
	defaults := &gpushare.Defaults{}
	opts = append([]schedapp.Option{
		schedapp.WithPlugin(gpushare.Name, gpushare.NewWithDefaults(defaults)),
		schedapp.WithPlugin(noderesourcesfit.Name, noderesourcesfit.New),
		schedapp.WithPlugin(draplacement.Name, draplacement.New),
	}, opts...)
	cmd := schedapp.NewSchedulerCommand(opts...)
	cmd.Use = "tessera-scheduler"
	cmd.Short = "kube-scheduler with Tessera's GPU-sharing plugin"
	fs := pflag.NewFlagSet("tessera", pflag.ContinueOnError)
	AddFlags(fs, defaults)
	cmd.Flags().AddFlagSet(fs)
	// kube-scheduler prints its help from its own named flag sets; add ours after them.
	help, usage := cmd.HelpFunc(), cmd.UsageFunc()
	section := func(c *cobra.Command) {
		fmt.Fprintf(c.OutOrStdout(), "\nTessera flags:\n\n%s", fs.FlagUsages())
	}
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) { help(c, args); section(c) })
	cmd.SetUsageFunc(func(c *cobra.Command) error { err := usage(c); section(c); return err })
	return cmd
}

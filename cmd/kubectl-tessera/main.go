// SPDX-License-Identifier: Apache-2.0

// Command kubectl-tessera shows how Tessera has placed GPU shares in a cluster. On PATH
// it is a kubectl plugin:
//
//	kubectl tessera allocation   per node and per GPU: memory and cores granted, and to which pods;
//	                             then the GPU pods that are not scheduled, with the scheduler's reason
//	kubectl tessera wait         wait until nodes publish their GPU inventory and GPU pods are placed or refused
//	kubectl tessera completion   shell completion
//
// It reads only the API: the nodes' inventory annotations and the pods' assignment
// annotations, the same records the scheduler rebuilds its state from. Its connection
// flags are kubectl's own (k8s.io/cli-runtime's ConfigFlags); creating objects is left to
// kubectl.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/MakeNowJust/heredoc"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/api"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	os.Exit(run(ctx, newRootOptions(streams), os.Args[1:]))
}

// run executes one command line and returns the exit status: 1 for an error, as
// kubectl does.
func run(ctx context.Context, o *rootOptions, args []string) int {
	cmd := newRootCommand(o)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(o.streams.ErrOut, "error: %v\n", err)
		return 1
	}
	return 0
}

// rootOptions are the flags every command shares and the way to a client.
type rootOptions struct {
	streams genericiooptions.IOStreams
	config  *genericclioptions.ConfigFlags
	domain  string
	// newKube builds the clientset from the config flags; tests return a fake.
	newKube func(*genericclioptions.ConfigFlags) (kubernetes.Interface, error)
}

func newRootOptions(streams genericiooptions.IOStreams) *rootOptions {
	return &rootOptions{
		streams: streams,
		config:  genericclioptions.NewConfigFlags(true).WithWarningPrinter(streams),
		domain:  api.DefaultDomain,
		newKube: newKubeClient,
	}
}

func newKubeClient(f *genericclioptions.ConfigFlags) (kubernetes.Interface, error) {
	cfg, err := f.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kubectl-tessera"
	// Listing every pod of a large cluster is one request; the defaults of 5 QPS would
	// only slow the polling of wait.
	cfg.QPS, cfg.Burst = 50, 100
	return kubernetes.NewForConfig(cfg)
}

func newRootCommand(o *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubectl-tessera",
		Short: "Tessera's view of GPU allocation",
		Long: longDesc(`
			Tessera's view of GPU allocation: which GPUs each node has, what is granted on
			each and to which pods, and why GPU pods are pending. It reads only the API
			(the nodes' tessera.dev/gpu-inventory and the pods' tessera.dev/gpu-assignment
			annotations), with the connection flags of kubectl.

			To create objects, use kubectl create -f or kubectl apply -f.`),
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl tessera"},
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	cmd.SetIn(o.streams.In)
	cmd.SetOut(o.streams.Out)
	cmd.SetErr(o.streams.ErrOut)
	o.config.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVar(&o.domain, "resource-domain", o.domain, "Domain of the GPU resource names the scheduler is configured with")
	_ = cmd.RegisterFlagCompletionFunc("namespace", o.completeNamespaces)
	_ = cmd.RegisterFlagCompletionFunc("context", o.completeContexts)
	cmd.AddCommand(newAllocationCommand(o), newWaitCommand(o))
	return cmd
}

// clients is what a command needs to talk to the cluster.
type clients struct {
	kube  kubernetes.Interface
	names api.ResourceNames
}

func (o *rootOptions) clients() (*clients, error) {
	names := api.ResourceNamesForDomain(o.domain)
	if err := names.Validate(field.NewPath("--resource-domain")).ToAggregate(); err != nil {
		return nil, err
	}
	kc, err := o.newKube(o.config)
	if err != nil {
		return nil, err
	}
	return &clients{kube: kc, names: names}, nil
}

// namespace is the namespace whose pods a command reads: the one given with -n, or
// every namespace. Unlike kubectl get, the kubeconfig context's namespace is not the
// default: GPUs are a node resource, and a view of one namespace's pods is asked for.
func (o *rootOptions) namespace(allNamespaces bool) string {
	if allNamespaces || o.config.Namespace == nil {
		return ""
	}
	return *o.config.Namespace
}

// longDesc and examples format help text the way kubectl's own commands do.
func longDesc(s string) string { return strings.TrimSpace(heredoc.Doc(s)) }

func examples(s string) string {
	lines := strings.Split(strings.TrimSpace(heredoc.Doc(s)), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "  " + l
		}
	}
	return strings.Join(lines, "\n")
}

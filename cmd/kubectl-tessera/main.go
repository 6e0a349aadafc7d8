// Command kubectl-tessera shows how Tessera has placed GPU shares in a cluster. On PATH
// it is a kubectl plugin:
//
//	kubectl tessera allocation      per node and per GPU: memory and cores granted, and to which pods;
//	                                then the GPU pods that are not scheduled, with the scheduler's reason
//	kubectl tessera wait            wait until nodes publish their GPU inventory and GPU pods are placed or refused
//	kubectl tessera apply -f FILE   create the objects of a YAML file (for clusters reached without kubectl)
//
// It reads only the API: the nodes' inventory annotations and the pods' assignment
// annotations, the same records the scheduler rebuilds its state from.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/api"
)

const usage = `kubectl tessera: Tessera's view of GPU allocation.

Usage:
  kubectl tessera allocation [flags]     per node and per GPU: memory and cores granted, and to which pods;
                                         then the GPU pods that are not scheduled, with the reason
  kubectl tessera wait [flags]           wait until nodes publish a GPU inventory and every GPU pod
                                         is placed or refused by its scheduler
  kubectl tessera apply -f FILE [flags]  create the objects of a YAML file ("-" reads stdin);
                                         objects that exist are left as they are

Common flags:
  --kubeconfig FILE   kubeconfig (default: $KUBECONFIG, then ~/.kube/config)
  --context NAME      kubeconfig context
Run "kubectl tessera COMMAND -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// The common flags may come before the command too (kubectl tessera --context x
	// allocation), as they do for kubectl itself.
	conn := connFlags{domain: api.DefaultDomain}
	top := flag.NewFlagSet("kubectl tessera", flag.ContinueOnError)
	top.SetOutput(stderr)
	top.Usage = func() { fmt.Fprint(stderr, usage) }
	conn.bind(top)
	if err := top.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	args = top.Args()
	if len(args) == 0 || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("kubectl tessera "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	conn.bind(fs)
	var err error
	switch cmd {
	case "allocation", "alloc":
		var o allocationOptions
		o.bind(fs)
		if err = fs.Parse(args); err == nil {
			err = withClients(&conn, func(c *clients) error { return runAllocation(ctx, c, &o, stdout) })
		}
	case "wait":
		var o waitOptions
		o.bind(fs)
		if err = fs.Parse(args); err == nil {
			err = withClients(&conn, func(c *clients) error { return runWait(ctx, c, &o, stdout) })
		}
	case "apply":
		var o applyOptions
		o.bind(fs)
		if err = fs.Parse(args); err == nil {
			err = withClients(&conn, func(c *clients) error { return runApply(ctx, c, &o, os.Stdin, stdout) })
		}
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %v\n", fs.Args())
		return 2
	}
	return 0
}

// connFlags are the flags kubectl plugins conventionally accept.
type connFlags struct {
	kubeconfig string
	context    string
	domain     string
}

// bind registers the flags with the current values as defaults, so that a value given
// before the command survives the command's own flag set.
func (c *connFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", c.kubeconfig, "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&c.context, "context", c.context, "kubeconfig context")
	fs.StringVar(&c.domain, "resource-domain", c.domain, "domain of the GPU resource names the scheduler is configured with")
}

type clients struct {
	kube    kubernetes.Interface
	dynamic dynamic.Interface
	config  *rest.Config
	names   api.ResourceNames
}

func withClients(f *connFlags, do func(*clients) error) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-tessera"
	// Listing every pod of a large cluster is one request; the defaults of 5 QPS would
	// only slow the polling of wait.
	cfg.QPS, cfg.Burst = 50, 100
	names := api.ResourceNamesForDomain(f.domain)
	if err := names.Validate("--resource-domain"); err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return do(&clients{kube: kc, dynamic: dc, config: cfg, names: names})
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
)

type waitOptions struct {
	*rootOptions
	nodes         []string
	timeout       time.Duration
	allNamespaces bool
}

func newWaitCommand(root *rootOptions) *cobra.Command {
	o := &waitOptions{rootOptions: root, timeout: 2 * time.Minute}
	cmd := &cobra.Command{
		Use:   "wait [--nodes NODE,...]",
		Short: "Wait until nodes publish a GPU inventory and every GPU pod is placed or refused",
		Long: longDesc(`
			Wait until the API server is ready, every node named with --nodes is Ready with a
			valid GPU inventory, and every GPU pod is settled: bound with a Tessera
			assignment, or refused by its scheduler (PodScheduled False). What is still
			awaited is printed whenever it changes.

			kubectl wait waits for one condition of named objects; this waits for what
			Tessera's pods and nodes need, across all of them. Without --namespace the
			GPU pods of every namespace are waited for.`),
		Example: examples(`
			# After creating GPU nodes and pods
			kubectl tessera wait --nodes gpu-node-0,gpu-node-1 --timeout 60s

			# Only the GPU pods of one namespace
			kubectl tessera wait -n team-a`),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.clients()
			if err != nil {
				return err
			}
			return runWait(cmd.Context(), c, o, o.streams.Out)
		},
	}
	cmd.Flags().StringSliceVar(&o.nodes, "nodes", nil, "Nodes that must be Ready with a GPU inventory published, comma-separated (default: none; the API server and GPU pods are always waited for)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", o.timeout, "Give up after this long")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "Wait for the GPU pods of every namespace (the default; overrides --namespace)")
	_ = cmd.RegisterFlagCompletionFunc("nodes", root.completeNodes)
	return cmd
}

// runWait polls until the API server is ready, every named node is Ready with a valid
// inventory and every GPU pod is settled: bound with an assignment, or refused by its
// scheduler (PodScheduled False). It prints what it still waits for whenever that
// changes.
func runWait(ctx context.Context, c *clients, o *waitOptions, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	want := splitNames(o.nodes)
	last := ""
	ready := false
	for {
		var err error
		if !ready {
			// /readyz, not just a successful list: the API server serves lists before
			// its start-up hooks (bootstrap RBAC, system namespaces) have finished.
			_, err = c.kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			if err != nil {
				err = fmt.Errorf("API server not ready: %w", err)
			}
			ready = err == nil
		}
		var nodes *v1.NodeList
		var pods *v1.PodList
		if err == nil {
			nodes, err = c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		}
		if err == nil {
			pods, err = c.kube.CoreV1().Pods(o.namespace(o.allNamespaces)).List(ctx, metav1.ListOptions{})
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		} else {
			msg = unsettled(nodes.Items, pods.Items, want, c.names)
			if msg == "" {
				return nil
			}
		}
		if msg != last {
			fmt.Fprintf(out, "waiting: %s\n", msg)
			last = msg
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %s waiting for %s", o.timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// unsettled describes what is not yet settled; "" when everything is.
func unsettled(nodes []v1.Node, pods []v1.Pod, want map[string]bool, names api.ResourceNames) string {
	var notReady, noInv []string
	seen := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		if !want[n.Name] {
			continue
		}
		seen[n.Name] = true
		if !nodeReady(n) {
			notReady = append(notReady, n.Name)
		}
		if raw, ok := n.Annotations[api.AnnotationInventory]; !ok {
			noInv = append(noInv, n.Name)
		} else if _, err := api.DecodeInventory(raw); err != nil {
			noInv = append(noInv, n.Name)
		}
	}
	var missing []string
	for n := range want {
		if !seen[n] {
			missing = append(missing, n)
		}
	}
	var unplaced []string
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || !api.HasGPURequest(p, names) {
			continue
		}
		if p.Spec.NodeName != "" {
			if _, ok := p.Annotations[api.AnnotationAssignment]; !ok {
				unplaced = append(unplaced, podName(p))
			}
			continue
		}
		refused := false
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				refused = true
			}
		}
		if !refused {
			unplaced = append(unplaced, podName(p))
		}
	}
	var parts []string
	add := func(what string, xs []string) {
		if len(xs) > 0 {
			sort.Strings(xs)
			parts = append(parts, fmt.Sprintf("%s (%d): %s", what, len(xs), abbreviate(xs, 5)))
		}
	}
	add("nodes that do not exist", missing)
	add("nodes not Ready", notReady)
	add("nodes without a GPU inventory", noInv)
	add("GPU pods not yet placed or refused", unplaced)
	return strings.Join(parts, "; ")
}

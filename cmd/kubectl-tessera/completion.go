// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dynamic completion of names from the cluster. cobra parses the flags before calling
// these, so --kubeconfig, --context and the rest are honoured; a failure completes
// nothing rather than printing an error into the shell.

func (o *rootOptions) completeNamespaces(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	kc, err := o.newKube(o.config)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := kc.CoreV1().Namespaces().List(cmd.Context(), metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, n := range list.Items {
		if strings.HasPrefix(n.Name, toComplete) {
			out = append(out, n.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeNodes completes node names, for arguments and for --nodes, whose value is a
// comma-separated list: only its last element is completed, and names already given
// are not offered again.
func (o *rootOptions) completeNodes(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	kc, err := o.newKube(o.config)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := kc.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	given := splitNames(args)
	prefix, last := "", toComplete
	if i := strings.LastIndexByte(toComplete, ','); i >= 0 {
		prefix, last = toComplete[:i+1], toComplete[i+1:]
		for n := range splitNames([]string{prefix}) {
			if given == nil {
				given = map[string]bool{}
			}
			given[n] = true
		}
	}
	var out []string
	for _, n := range list.Items {
		if strings.HasPrefix(n.Name, last) && !given[n.Name] {
			out = append(out, prefix+n.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (o *rootOptions) completeContexts(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	cfg, err := o.config.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for name := range cfg.Contexts {
		if strings.HasPrefix(name, toComplete) {
			out = append(out, name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	allocationv1alpha1 "github.com/tessera-dev/tessera/api/allocation/v1alpha1"
)

// printFlags are -o and the template flags, as kubectl get has them: the table (the
// default, or wide) is this command's own; json, yaml, kyaml, jsonpath and go-template
// are cli-runtime's printers of the AllocationList.
type printFlags struct {
	output    string
	jsonYAML  *genericclioptions.JSONYamlPrintFlags
	templates *genericclioptions.KubeTemplatePrintFlags
}

func newPrintFlags() *printFlags {
	return &printFlags{jsonYAML: genericclioptions.NewJSONYamlPrintFlags(), templates: genericclioptions.NewKubeTemplatePrintFlags()}
}

func (f *printFlags) allowedFormats() []string {
	return slices.Concat([]string{"wide"}, f.jsonYAML.AllowedFormats(), f.templates.AllowedFormats())
}

func (f *printFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "Output format: the table when empty, or one of: "+strings.Join(f.allowedFormats(), "|"))
	f.templates.AddFlags(cmd)
	_ = cmd.RegisterFlagCompletionFunc("output", func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		var out []string
		for _, f := range f.allowedFormats() {
			if strings.HasPrefix(f, toComplete) {
				out = append(out, f)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	})
}

// allocationPrinter prints the view in the chosen format.
type allocationPrinter struct {
	wide     bool
	resource printers.ResourcePrinter // nil for the table
}

// toPrinter checks -o before anything is read from the API.
func (f *printFlags) toPrinter() (*allocationPrinter, error) {
	switch f.output {
	case "":
		// A template given without -o means -o go-template, as in kubectl get.
		if f.templates.TemplateArgument != nil && *f.templates.TemplateArgument != "" {
			p, err := f.templates.ToPrinter("go-template")
			return &allocationPrinter{resource: p}, err
		}
		return &allocationPrinter{}, nil
	case "wide":
		return &allocationPrinter{wide: true}, nil
	}
	p, err := f.jsonYAML.ToPrinter(f.output)
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		p, err = f.templates.ToPrinter(f.output)
	}
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return nil, fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: %s",
			f.output, strings.Join(f.allowedFormats(), ","))
	}
	if err != nil {
		return nil, err
	}
	return &allocationPrinter{resource: p}, nil
}

func (p *allocationPrinter) print(list *allocationv1alpha1.AllocationList, now time.Time, w io.Writer) error {
	if p.resource != nil {
		return p.resource.PrintObj(list, w)
	}
	renderTable(list, now, p.wide, w)
	return nil
}

// renderTable writes the view for people: per node a headline and a table of its GPUs,
// then the totals, the problems and the pending pods. -o wide adds each GPU's model and
// UUID and names the container of each grant.
func renderTable(list *allocationv1alpha1.AllocationList, now time.Time, wide bool, w io.Writer) {
	if list.Namespace != "" {
		fmt.Fprintf(w, "Pods of namespace %s only: other namespaces' grants on these GPUs are not shown or counted.\n\n", list.Namespace)
	}
	for i := range list.Items {
		na := &list.Items[i]
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "NODE %s  %s\n", na.Name, headline(na, now))
		if na.Inventory.UpdatedAt == nil {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if wide {
			fmt.Fprintln(tw, "  GPU\tMODEL\tUUID\tMEMORY MiB\tMEMORY GRANTED\tCORES GRANTED\tPODS")
		} else {
			fmt.Fprintln(tw, "  GPU\tMEMORY MiB\tMEMORY GRANTED\tCORES GRANTED\tPODS")
		}
		for _, u := range na.GPUs {
			pods := "-"
			if len(u.Grants) > 0 {
				ps := make([]string, len(u.Grants))
				for k, g := range u.Grants {
					ps[k] = grantString(g, wide)
				}
				pods = strings.Join(ps, ", ")
			}
			if !u.Healthy {
				pods = "UNHEALTHY (" + u.HealthReason + ") " + pods
			}
			pct := 0
			if u.MemoryMiB > 0 {
				pct = int(u.MemoryGrantedMiB * 100 / u.MemoryMiB)
			}
			if wide {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t", u.ID, u.Model, u.UUID)
			} else {
				fmt.Fprintf(tw, "  %s\t", u.ID)
			}
			fmt.Fprintf(tw, "%d/%d\t%s %3d%%\t%d%%\t%s\n", u.MemoryGrantedMiB, u.MemoryMiB, bar(pct), pct, u.CoresGranted, pods)
		}
		tw.Flush()
		for _, o := range na.Warnings {
			fmt.Fprintf(w, "  warning: %s\n", o)
		}
	}
	if len(list.NodesWithoutInventory) > 0 {
		fmt.Fprintf(w, "\nNodes without a GPU inventory (%d): %s\n", len(list.NodesWithoutInventory), abbreviate(list.NodesWithoutInventory, 10))
	}
	s := list.Summary
	what := "GPUs"
	if s.MIG {
		what = "GPUs and MIG instances"
	}
	switch {
	case list.Namespace != "" && s.GPUsHoldingPods == 0:
		fmt.Fprintf(w, "\nPods of namespace %s hold no GPUs\n", list.Namespace)
	case list.Namespace != "":
		fmt.Fprintf(w, "\n%s holding pods of namespace %s: %d; memory granted to them: %d MiB; cores granted to them: %d%%\n",
			what, list.Namespace, s.GPUsHoldingPods, s.MemoryGrantedMiB, s.CoresGranted)
	case s.GPUs > 0:
		pct := s.MemoryGrantedMiB * 100 / max(s.MemoryMiB, 1)
		fmt.Fprintf(w, "\n%s holding pods: %d of %d; memory granted: %d of %d MiB (%d%%); cores granted: %d%% of %d%%\n",
			what, s.GPUsHoldingPods, s.GPUs, s.MemoryGrantedMiB, s.MemoryMiB, pct, s.CoresGranted, 100*s.GPUs)
	}
	if len(list.Problems) > 0 {
		fmt.Fprintf(w, "\nProblems:\n")
		for _, p := range list.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	if len(list.PendingPods) == 0 {
		fmt.Fprintf(w, "\nPending GPU pods: none\n")
		return
	}
	fmt.Fprintf(w, "\nPending GPU pods (%d):\n", len(list.PendingPods))
	for _, p := range list.PendingPods {
		fmt.Fprintf(w, "  %s  [%s, scheduler %s]\n      %s\n", displayName(p.Namespace, p.Name), p.Request, p.SchedulerName, p.Reason)
	}
}

func headline(na *allocationv1alpha1.NodeAllocation, now time.Time) string {
	var parts []string
	if na.Inventory.UpdatedAt != nil {
		// Count GPUs, not units: the instances of a MIG GPU share its index.
		models := map[string]int{}
		seen := map[int]bool{}
		var order []string
		for _, u := range na.GPUs {
			if seen[u.Index] {
				continue
			}
			seen[u.Index] = true
			if models[u.Model] == 0 {
				order = append(order, u.Model)
			}
			models[u.Model]++
		}
		for _, m := range order {
			parts = append(parts, fmt.Sprintf("%d x %s", models[m], m))
		}
		if len(na.NVLinkIslands) > 0 {
			parts = append(parts, "NVLink islands "+strings.Join(na.NVLinkIslands, " | "))
		} else {
			parts = append(parts, "no NVLink")
		}
	}
	if na.Ready {
		parts = append(parts, "Ready")
	} else {
		parts = append(parts, "NotReady")
	}
	age := func() time.Duration { return now.Sub(na.Inventory.UpdatedAt.Time).Round(time.Second) }
	switch {
	case na.Inventory.Error != "":
		parts = append(parts, na.Inventory.Error)
	case na.Inventory.Stale:
		parts = append(parts, fmt.Sprintf("STALE inventory (%s old): the scheduler places no new GPU pods here", age()))
	default:
		parts = append(parts, fmt.Sprintf("inventory %s old", age()))
	}
	return strings.Join(parts, ", ")
}

func grantString(g allocationv1alpha1.Grant, wide bool) string {
	var b strings.Builder
	b.WriteString(displayName(g.Namespace, g.Pod))
	if wide {
		fmt.Fprintf(&b, "[%s]", g.Container)
	}
	fmt.Fprintf(&b, " (%d MiB", g.MemoryMiB)
	if g.Cores > 0 {
		fmt.Fprintf(&b, ", %d%%", g.Cores)
	}
	if len(g.GPUs) > 1 {
		fmt.Fprintf(&b, ", GPUs %s", strings.Join(g.GPUs, ","))
	}
	if g.Terminating {
		b.WriteString(", terminating")
	}
	b.WriteString(")")
	return b.String()
}

// bar is a ten-cell gauge.
func bar(pct int) string {
	n := min(max((pct+5)/10, 0), 10)
	if pct > 0 && n == 0 {
		n = 1
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", 10-n) + "]"
}

func abbreviate(xs []string, n int) string {
	if len(xs) <= n {
		return strings.Join(xs, ", ")
	}
	return strings.Join(xs[:n], ", ") + fmt.Sprintf(", and %d more", len(xs)-n)
}

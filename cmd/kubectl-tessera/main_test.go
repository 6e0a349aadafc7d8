// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	allocationv1alpha1 "github.com/tessera-dev/tessera/api/allocation/v1alpha1"
)

// fakeCluster is the fixture's cluster plus a namespace team-a with one pod bound to
// the T4 node and one pending, served by a fake clientset.
func fakeCluster(t *testing.T) *fake.Clientset {
	t.Helper()
	st := fixtureState(t)
	teamPod := boundPod(t, "infer-c", "t4", 4096, 0, 2)
	teamPod.Namespace = "team-a"
	teamPending := gpuRequest("queued", 1, 100, 0)
	teamPending.Namespace = "team-a"
	objs := []runtime.Object{
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}},
		&teamPod, &teamPending,
	}
	for i := range st.nodes {
		objs = append(objs, &st.nodes[i])
	}
	for i := range st.pods {
		objs = append(objs, &st.pods[i])
	}
	return fake.NewClientset(objs...)
}

// kubectlTessera runs a command line against the fake cluster and returns its output;
// the clientset records the API calls.
func kubectlTessera(t *testing.T, kc *fake.Clientset, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	o := newRootOptions(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	o.newKube = func(*genericclioptions.ConfigFlags) (kubernetes.Interface, error) { return kc, nil }
	code = run(t.Context(), o, args)
	return out.String(), errOut.String(), code
}

// podListNamespaces are the namespaces of the pod and event lists made, "" for all.
func podListNamespaces(kc *fake.Clientset) []string {
	var ns []string
	for _, a := range kc.Actions() {
		if l, ok := a.(k8stesting.ListAction); ok && (l.GetResource().Resource == "pods" || l.GetResource().Resource == "events") {
			ns = append(ns, l.GetNamespace())
		}
	}
	return ns
}

func TestAllocationNamespaces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		listNS string
		// pods are the grants and pending pods of the JSON output.
		pods  []string
		nodes []string
	}{
		{"default: every namespace", nil, "", []string{"default/infer-a", "default/infer-b", "default/train", "team-a/infer-c",
			"pending default/bad", "pending default/event-only", "pending default/too-big", "pending default/unseen", "pending team-a/queued"}, []string{"h100", "t4"}},
		{"-A", []string{"-A"}, "", nil, []string{"h100", "t4"}},
		{"-n", []string{"-n", "team-a"}, "team-a", []string{"team-a/infer-c", "pending team-a/queued"}, []string{"t4"}},
		{"--namespace= before the command", []string{"--namespace=team-a"}, "team-a", []string{"team-a/infer-c", "pending team-a/queued"}, []string{"t4"}},
		{"-A beats -n", []string{"-n", "team-a", "-A"}, "", nil, []string{"h100", "t4"}},
		{"a namespace without GPU pods", []string{"-n", "team-b"}, "team-b", []string{}, []string{}},
		{"-n with a node named", []string{"-n", "team-b", "h100"}, "team-b", []string{}, []string{"h100"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := fakeCluster(t)
			args := append([]string{"allocation", "-o", "json"}, tc.args...)
			if strings.HasPrefix(tc.name, "--namespace") {
				args = append(tc.args, "allocation", "-o", "json")
			}
			out, errOut, code := kubectlTessera(t, kc, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if got := podListNamespaces(kc); !slices.Equal(got, []string{tc.listNS, tc.listNS}) {
				t.Errorf("pods and events listed in namespaces %q, want %q", got, tc.listNS)
			}
			var list allocationv1alpha1.AllocationList
			if err := json.Unmarshal([]byte(out), &list); err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			if list.Namespace != tc.listNS {
				t.Errorf("namespace %q, want %q", list.Namespace, tc.listNS)
			}
			var nodes []string
			pods := []string{}
			for _, n := range list.Items {
				nodes = append(nodes, n.Name)
				for _, g := range n.GPUs {
					for _, gr := range g.Grants {
						if p := gr.Namespace + "/" + gr.Pod; !slices.Contains(pods, p) {
							pods = append(pods, p)
						}
					}
				}
			}
			for _, p := range list.PendingPods {
				pods = append(pods, "pending "+p.Namespace+"/"+p.Name)
			}
			if !slices.Equal(nodes, tc.nodes) && !(len(nodes) == 0 && len(tc.nodes) == 0) {
				t.Errorf("nodes %v, want %v", nodes, tc.nodes)
			}
			if tc.pods != nil && !slices.Equal(pods, tc.pods) {
				t.Errorf("pods %v, want %v", pods, tc.pods)
			}
		})
	}
}

func TestAllocationNamespaceTable(t *testing.T) {
	out, errOut, code := kubectlTessera(t, fakeCluster(t), "allocation", "-n", "team-a", "--stale-after=0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"Pods of namespace team-a only",
		"NODE t4  4 x Tesla T4",
		"team-a/infer-c (4096 MiB)",
		"GPUs holding pods of namespace team-a: 1; memory granted to them: 4096 MiB; cores granted to them: 0%",
		"Pending GPU pods (1):\n  team-a/queued",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "h100") || strings.Contains(out, "cpu-only") {
		t.Errorf("nodes without the namespace's pods are shown:\n%s", out)
	}
}

func TestAllocationOutputFormats(t *testing.T) {
	for _, tc := range []struct {
		format string
		check  func(t *testing.T, out string)
	}{
		{"", func(t *testing.T, out string) {
			if !strings.Contains(out, "  GPU  MEMORY MiB   MEMORY GRANTED     CORES GRANTED  PODS\n") {
				t.Errorf("no table:\n%s", out)
			}
		}},
		{"wide", func(t *testing.T, out string) {
			for _, want := range []string{"  GPU  MODEL                  UUID", "NVIDIA H100 80GB HBM3", "infer-a[main] (16384 MiB, 20%)"} {
				if !strings.Contains(out, want) {
					t.Errorf("wide output lacks %q:\n%s", want, out)
				}
			}
		}},
		{"json", func(t *testing.T, out string) {
			var list allocationv1alpha1.AllocationList
			if err := json.Unmarshal([]byte(out), &list); err != nil {
				t.Fatal(err)
			}
			checkList(t, &list)
		}},
		{"yaml", func(t *testing.T, out string) {
			if !strings.HasPrefix(out, "apiVersion: allocation.tessera.dev/v1alpha1\n") {
				t.Errorf("yaml does not start with the apiVersion:\n%s", out)
			}
			var list allocationv1alpha1.AllocationList
			if err := yaml.UnmarshalStrict([]byte(out), &list); err != nil {
				t.Fatal(err)
			}
			checkList(t, &list)
		}},
		{`jsonpath={range .items[*]}{.name}{" "}{range .gpus[*]}{.id}={.memoryGrantedMiB},{end}{"\n"}{end}{.summary.gpusHoldingPods}`, func(t *testing.T, out string) {
			want := "h100 0=32768,1=0,2=0,3=0,4=81559,5=81559,6=81559,7=81559,\nt4 0=0,1=0,2=4096,3=0,\n6"
			if out != want {
				t.Errorf("got %q, want %q", out, want)
			}
		}},
		{`go-template={{range .pendingPods}}{{.namespace}}/{{.name}} {{end}}`, func(t *testing.T, out string) {
			if out != "default/bad default/event-only default/too-big default/unseen team-a/queued " {
				t.Errorf("got %q", out)
			}
		}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			args := []string{"allocation"}
			if tc.format != "" {
				args = append(args, "-o", tc.format)
			}
			out, errOut, code := kubectlTessera(t, fakeCluster(t), args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			tc.check(t, out)
		})
	}
}

func checkList(t *testing.T, list *allocationv1alpha1.AllocationList) {
	t.Helper()
	if list.APIVersion != "allocation.tessera.dev/v1alpha1" || list.Kind != "AllocationList" {
		t.Errorf("type: %+v", list.TypeMeta)
	}
	if len(list.Items) != 2 || len(list.Items[0].GPUs) != 8 || list.Items[0].GPUs[4].Grants[0].Pod != "train" ||
		strings.Join(list.Items[0].GPUs[4].Grants[0].GPUs, ",") != "4,5,6,7" {
		t.Errorf("items: %+v", list.Items)
	}
	if list.Summary.GPUsHoldingPods != 6 || len(list.PendingPods) != 5 || list.NodesWithoutInventory[0] != "cpu-only" {
		t.Errorf("summary %+v, pending %d, without inventory %v", list.Summary, len(list.PendingPods), list.NodesWithoutInventory)
	}
}

func TestBadOutputFormatReadsNothing(t *testing.T) {
	kc := fakeCluster(t)
	_, errOut, code := kubectlTessera(t, kc, "allocation", "-o", "name")
	if code != 1 || !strings.Contains(errOut, `output format "name"`) || !strings.Contains(errOut, "wide,json,yaml") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if len(kc.Actions()) != 0 {
		t.Errorf("API calls before the format was checked: %v", kc.Actions())
	}
}

func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"allocation", "h"}, []string{"h100"}},
		{[]string{"allocation", "h100", ""}, []string{"cpu-only", "t4"}},
		{[]string{"allocation", "--nodes", "t4,"}, []string{"t4,cpu-only", "t4,h100"}},
		{[]string{"wait", "--nodes", "c"}, []string{"cpu-only"}},
		{[]string{"allocation", "-n", "team"}, []string{"team-a", "team-b"}},
		{[]string{"allocation", "-o", "j"}, []string{"json", "jsonpath", "jsonpath-as-json", "jsonpath-file"}},
		{[]string{"comp"}, []string{"completion"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := kubectlTessera(t, fakeCluster(t), append([]string{"__complete"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if !strings.HasPrefix(l, ":") {
					got = append(got, strings.SplitN(l, "\t", 2)[0])
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConfigFlags(t *testing.T) {
	// The connection flags are cli-runtime's, before or after the command; a missing
	// kubeconfig fails on that file, not on an unknown flag.
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	for _, args := range [][]string{
		{"--kubeconfig", missing, "allocation"},
		{"allocation", "--kubeconfig", missing, "--as", "jane", "--as-group", "team-a", "--context", "x", "-n", "team-a"},
	} {
		var out, errOut bytes.Buffer
		code := run(t.Context(), newRootOptions(genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}), args)
		if code != 1 || !strings.Contains(errOut.String(), "no-such-kubeconfig") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
	}
	// The impersonation flags reach the client's configuration.
	o := newRootOptions(genericiooptions.IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	cmd := newRootCommand(o)
	if err := cmd.ParseFlags([]string{"--as", "jane", "--as-group", "team-a", "--server", "https://127.0.0.1:1", "--token", "t"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Impersonate.UserName != "jane" || !slices.Equal(cfg.Impersonate.Groups, []string{"team-a"}) {
		t.Errorf("impersonation: %+v", cfg.Impersonate)
	}
}

func TestHelp(t *testing.T) {
	out, _, code := kubectlTessera(t, fakeCluster(t), "allocation", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"kubectl tessera allocation [NODE...] [flags]", "-A, --all-namespaces", "-n, --namespace", "--as-group", "kubectl tessera allocation -n team-a -o json"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}

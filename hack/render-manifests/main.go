// SPDX-License-Identifier: Apache-2.0

// Command render-manifests renders Tessera's Helm chart to plain manifests with the
// Helm library, for clusters installed without Helm. hack/render-manifests.sh runs it
// with the settings of the manifests kept in config/deploy/manifests.
//
//	go run ./hack/render-manifests [-f values.yaml] [--set a.b=c] [-o out.yaml]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tessera-dev/tessera/config/deploy"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var o deploy.Options
	var values, set, apis list
	var out string
	flag.StringVar(&o.ChartDir, "chart", "config/deploy/tessera", "chart directory")
	flag.StringVar(&o.Release, "release", deploy.DefaultRelease, "release name (prefix of object names)")
	flag.StringVar(&o.Namespace, "namespace", deploy.DefaultNamespace, "namespace of the namespaced objects")
	flag.StringVar(&o.KubeVersion, "kube-version", deploy.DefaultKubeVersion, "Kubernetes version to render for")
	flag.BoolVar(&o.NamespaceObject, "namespace-object", true, "include the Namespace object (with its Pod Security labels)")
	flag.Var(&values, "f", "values file (repeatable; later ones win)")
	flag.Var(&set, "set", "helm --set style values (repeatable)")
	flag.Var(&apis, "api-versions", "extra API versions the cluster serves, e.g. monitoring.coreos.com/v1 (repeatable)")
	flag.StringVar(&out, "o", "-", "output file; - for standard output")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "render-manifests: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	o.ValueFiles, o.Set, o.APIVersions = values, set, apis
	ms, err := deploy.Render(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "render-manifests: %v\n", err)
		os.Exit(1)
	}
	header := fmt.Sprintf("# Tessera: plain manifests rendered from the Helm chart config/deploy/tessera\n"+
		"# (release %q, namespace %q). Do not edit: change the chart and run make manifests.\n", o.Release, o.Namespace)
	data := append([]byte(header), deploy.Join(ms)...)
	if out == "-" {
		_, err = os.Stdout.Write(data)
	} else {
		err = os.WriteFile(out, data, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "render-manifests: %v\n", err)
		os.Exit(1)
	}
}

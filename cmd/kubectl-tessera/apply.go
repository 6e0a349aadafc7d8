package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

type applyOptions struct {
	files multiFlag
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func (o *applyOptions) bind(fs *flag.FlagSet) {
	fs.Var(&o.files, "f", "YAML or JSON file of objects to create (repeatable; - for stdin)")
}

// runApply creates every object of the files, in order. It is deliberately only
// "create": an object that exists is reported and left alone, so running it twice is
// harmless and it never overwrites what someone else changed.
func runApply(ctx context.Context, c *clients, o *applyOptions, stdin io.Reader, out io.Writer) error {
	if len(o.files) == 0 {
		return errors.New("apply: -f FILE is required")
	}
	var objs []*unstructured.Unstructured
	for _, f := range o.files {
		got, err := readObjects(f, stdin)
		if err != nil {
			return err
		}
		objs = append(objs, got...)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var failed int
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
		}
		ri := c.dynamic.Resource(m.Resource)
		name := strings.ToLower(gvk.Kind) + "/" + u.GetName()
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if u.GetNamespace() == "" {
				u.SetNamespace(metav1.NamespaceDefault)
			}
			name = strings.ToLower(gvk.Kind) + "/" + u.GetNamespace() + "/" + u.GetName()
			_, err = ri.Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{FieldManager: "kubectl-tessera"})
		} else {
			_, err = ri.Create(ctx, u, metav1.CreateOptions{FieldManager: "kubectl-tessera"})
		}
		switch {
		case apierrors.IsAlreadyExists(err):
			fmt.Fprintf(out, "%s exists, left as it is\n", name)
		case err != nil:
			failed++
			fmt.Fprintf(out, "%s: %v\n", name, err)
		default:
			fmt.Fprintf(out, "%s created\n", name)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d objects were not created", failed, len(objs))
	}
	return nil
}

// readObjects decodes a multi-document YAML or JSON file; List kinds are expanded.
func readObjects(path string, stdin io.Reader) ([]*unstructured.Unstructured, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var objs []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
			}
			for i := range list.Items {
				objs = append(objs, &list.Items[i])
			}
			continue
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("%s: document %d: apiVersion and kind are required", path, doc)
		}
		objs = append(objs, u)
	}
}

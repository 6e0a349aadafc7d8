// SPDX-License-Identifier: Apache-2.0

// Command imagebuilder builds Tessera's container images without a container engine,
// from the files the repository's make targets build, for several architectures, and
// pushes them and the Helm chart to a registry. The images are defined by
// build/<image>.yaml (see Spec); docs/install.md describes them. make images,
// make push-images, make push-chart and make test-images run it.
//
//	imagebuilder build -spec build/tessera-scheduler.yaml -spec ... -archs amd64,arm64 -out _output/images
//	imagebuilder check -layout _output/images/oci -archs amd64,arm64
//	imagebuilder run -layout _output/images/oci -image tessera-scheduler -- /usr/local/bin/tessera-scheduler --version
//	imagebuilder push -layout _output/images/oci -image tessera-scheduler -to REGISTRY/tessera-scheduler:TAG
//	imagebuilder push-chart -chart config/deploy/tessera -to REGISTRY
//
// build writes one OCI image layout (out/oci) holding an OCI image index per image,
// which lists one image per architecture, and each index's SPDX SBOM as an artifact
// that refers to it. Builds are reproducible: every timestamp is -source-date-epoch
// (SOURCE_DATE_EPOCH), entries are sorted and owned by root or the image's user, so
// the same inputs give the same digests.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:]))
}

const usage = `usage: imagebuilder build|check|run|push|push-chart [flags]
  build       assemble images from their specs into an OCI image layout, with SBOMs
  check       check a built layout's images for every architecture without running them
  run         run a command inside a built image's root filesystem (chroot)
  push        push an image index, its platforms' images and its SBOM to a registry
  push-chart  package a Helm chart and push it to a registry as an OCI artifact
imagebuilder <command> -h lists the command's flags.
`

func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = buildCmd(ctx, args[1:])
	case "check":
		err = checkCmd(args[1:])
	case "push":
		err = pushCmd(ctx, args[1:])
	case "push-chart":
		err = pushChartCmd(ctx, args[1:])
	case "run":
		err = runCmd(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "imagebuilder: unknown command %q\n%s", args[0], usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		if ue.err != flag.ErrHelp {
			fmt.Fprintln(os.Stderr, "imagebuilder:", ue.err)
		}
		return 2
	default:
		fmt.Fprintln(os.Stderr, "imagebuilder:", err)
		return 1
	}
}

type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }

// listFlag is a flag given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func archsFlag(fs *flag.FlagSet) *string {
	return fs.String("archs", runtime.GOARCH, "architectures, comma-separated, GOARCH naming (amd64,arm64)")
}

func splitArchs(s string) []string {
	var archs []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			archs = append(archs, a)
		}
	}
	return archs
}

func epochFlag(fs *flag.FlagSet) *string {
	return fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every timestamp written (default $SOURCE_DATE_EPOCH, else 0)")
}

func parseEpoch(s string) (time.Time, error) {
	var secs int64
	if s != "" {
		var err error
		if secs, err = strconv.ParseInt(s, 10, 64); err != nil || secs < 0 {
			return time.Time{}, usageError{fmt.Errorf("source date epoch %q: want Unix seconds", s)}
		}
	}
	return time.Unix(secs, 0).UTC(), nil
}

func buildCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuilder build", flag.ContinueOnError)
	var specs listFlag
	fs.Var(&specs, "spec", "an image's spec (build/<image>.yaml); repeat for each image of the layout")
	var o BuildOptions
	fs.StringVar(&o.Root, "root", ".", "repository root; the spec's file sources are relative to it")
	fs.StringVar(&o.Out, "out", "_output/images", "directory for the layout (oci/), <name>.digest and <name>.spdx.json")
	fs.StringVar(&o.Registry, "registry", "ghcr.io/tessera-dev", "registry prefix of the image's name")
	fs.StringVar(&o.Tag, "tag", "dev", "image tag")
	fs.StringVar(&o.Version, "version", "", "org.opencontainers.image.version (default: the tag)")
	fs.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision: the source commit")
	fs.StringVar(&o.Source, "source", "https://github.com/tessera-dev/tessera", "org.opencontainers.image.source")
	archs := archsFlag(fs)
	fs.StringVar(&o.DebsDir, "debs", "", "directory of .deb files fetched before (offline build); default: apt-get download")
	fs.StringVar(&o.AptDir, "apt-dir", "", "directory for apt's package index of each architecture (default: a temporary one)")
	epoch := epochFlag(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if len(specs) == 0 || fs.NArg() > 0 {
		return usageError{fmt.Errorf("build takes -spec FILE (one or more) and no arguments")}
	}
	if o.Version == "" {
		o.Version = o.Tag
	}
	o.Archs = splitArchs(*archs)
	var err error
	if o.Created, err = parseEpoch(*epoch); err != nil {
		return err
	}
	var results []*Result
	for _, file := range specs {
		spec, err := LoadSpec(file)
		if err != nil {
			return err
		}
		res, err := Build(ctx, spec, o)
		if err != nil {
			return fmt.Errorf("%s: %w", spec.Name, err)
		}
		results = append(results, res)
	}
	dir := filepath.Join(o.Out, "oci")
	if err := WriteLayout(dir, results); err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	for _, r := range results {
		fmt.Printf("%s %s (OCI image index)\n", r.Ref, r.Digest)
		for _, ai := range r.Archs {
			size, err := imageSize(ai.Image)
			if err != nil {
				return err
			}
			fmt.Printf("  linux/%-6s %s (%.1f MiB compressed)\n", ai.Arch, ai.Digest, float64(size)/(1<<20))
			if len(ai.Packages) > 0 {
				fmt.Printf("    Debian packages: %s\n", packageList(ai.Packages))
			}
		}
		sd, _ := r.SBOM.Digest()
		fmt.Printf("  SBOM %s (%s, %d bytes)\n", sd, spdxMediaType, len(r.SBOMJSON))
	}
	fmt.Printf("OCI image layout: %s\n", dir)
	return nil
}

// imageSize is what pushing the image transfers: its compressed layers and config.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}

func checkCmd(args []string) error {
	fs := flag.NewFlagSet("imagebuilder check", flag.ContinueOnError)
	dir := fs.String("layout", "_output/images/oci", "OCI image layout written by imagebuilder build")
	archs := archsFlag(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("check takes no arguments")}
	}
	report, err := CheckLayout(*dir, splitArchs(*archs))
	for _, l := range report {
		fmt.Println(l)
	}
	return err
}

func pushCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuilder push", flag.ContinueOnError)
	dir := fs.String("layout", "_output/images/oci", "OCI image layout written by imagebuilder build")
	image := fs.String("image", "", "the image's name in the layout, e.g. tessera-scheduler")
	to := fs.String("to", "", "destination, registry/repository:tag")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *image == "" || *to == "" || fs.NArg() > 0 {
		return usageError{fmt.Errorf("push takes -image NAME -to REGISTRY/REPOSITORY:TAG")}
	}
	d, err := Push(ctx, *dir, *image, *to, *insecure)
	if err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", *to, d)
	return nil
}

func pushChartCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuilder push-chart", flag.ContinueOnError)
	dir := fs.String("chart", "config/deploy/tessera", "the chart's directory")
	to := fs.String("to", "", "registry and path; the chart goes to <to>/<chart name>:<chart version>")
	out := fs.String("out", "", "also write the chart archive <name>-<version>.tgz here")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	epoch := epochFlag(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *to == "" || fs.NArg() > 0 {
		return usageError{fmt.Errorf("push-chart takes -to REGISTRY and no arguments")}
	}
	created, err := parseEpoch(*epoch)
	if err != nil {
		return err
	}
	ref, d, err := PushChart(ctx, *dir, *to, *out, *insecure, created)
	if err != nil {
		return err
	}
	fmt.Printf("pushed chart %s@%s (helm pull oci://%s --version %s)\n", ref, d, ref.Context(), ref.TagStr())
	return nil
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("imagebuilder run", flag.ContinueOnError)
	dir := fs.String("layout", "_output/images/oci", "OCI image layout written by imagebuilder build")
	image := fs.String("image", "", "the image's name in the layout, e.g. tessera-scheduler")
	arch := fs.String("arch", runtime.GOARCH, "which architecture's image (only this machine's can run)")
	rootfs := fs.String("rootfs", "", "unpack into this empty directory and keep it (default: a temporary one)")
	skip := fs.Bool("skip-without-chroot", false, "where neither root nor a user namespace allows chroot, say so and exit 0")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *image == "" || fs.NArg() == 0 {
		return usageError{fmt.Errorf("run takes -image NAME -- COMMAND [ARGS]")}
	}
	img, cf, err := loadImage(*dir, *image, *arch)
	if err != nil {
		return err
	}
	rdir := *rootfs
	if rdir == "" {
		if rdir, err = os.MkdirTemp("", "imagebuilder-rootfs-"); err != nil {
			return err
		}
		defer os.RemoveAll(rdir)
	} else if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(rdir, 0o755); err != nil {
		return err
	}
	if err := unpack(img, rdir); err != nil {
		return fmt.Errorf("unpacking %s: %w", *image, err)
	}
	out, err := runChrooted(rdir, cf, fs.Args())
	if *skip && errors.Is(err, errNoChroot) {
		fmt.Printf("SKIP %q in %s: %v\n", fs.Args(), *image, err)
		return nil
	}
	os.Stdout.Write(out)
	if err != nil {
		return fmt.Errorf("%q in %s: %w", fs.Args(), *image, err)
	}
	return nil
}

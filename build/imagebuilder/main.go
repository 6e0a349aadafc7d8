// Command imagebuilder builds Tessera's container images without a container engine,
// from the files the repository's make targets build, and pushes them to a registry.
// The images are defined by build/<image>.yaml (see Spec); docs/install.md describes
// them. make images, make push-images and make test-images run it.
//
//	imagebuilder build -spec build/tessera-scheduler.yaml -out _output/images [flags]
//	imagebuilder push -image _output/images/tessera-scheduler.tar -to REGISTRY/tessera-scheduler:TAG
//	imagebuilder run -image _output/images/tessera-scheduler.tar -- /usr/local/bin/tessera-scheduler --version
//
// Builds are reproducible: every timestamp is -source-date-epoch (SOURCE_DATE_EPOCH),
// entries are sorted and owned by root or the image's user, so the same inputs give
// the same image digest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:]))
}

const usage = `usage: imagebuilder build|push|run [flags]
  build  assemble an image from its spec into a docker save tarball
  push   push a built image to a registry
  run    run a command inside a built image's root filesystem (chroot)
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
	case "push":
		err = pushCmd(ctx, args[1:])
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

func buildCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuilder build", flag.ContinueOnError)
	specFile := fs.String("spec", "", "the image's spec (build/<image>.yaml)")
	var o BuildOptions
	fs.StringVar(&o.Root, "root", ".", "repository root; the spec's file sources are relative to it")
	fs.StringVar(&o.Out, "out", "_output/images", "directory for <name>.tar and <name>.digest")
	fs.StringVar(&o.Registry, "registry", "ghcr.io/tessera-dev", "registry prefix of the image's name")
	fs.StringVar(&o.Tag, "tag", "dev", "image tag")
	fs.StringVar(&o.Version, "version", "", "org.opencontainers.image.version (default: the tag)")
	fs.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision: the source commit")
	fs.StringVar(&o.Source, "source", "https://github.com/tessera-dev/tessera", "org.opencontainers.image.source")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "target architecture (GOARCH naming); must match the files' and packages'")
	fs.StringVar(&o.DebsDir, "debs", "", "directory of .deb files fetched before (offline build); default: apt-get download")
	epoch := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every timestamp in the image (default $SOURCE_DATE_EPOCH, else 0)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *specFile == "" || fs.NArg() > 0 {
		return usageError{fmt.Errorf("build takes -spec FILE and no arguments")}
	}
	if o.Version == "" {
		o.Version = o.Tag
	}
	var secs int64
	if *epoch != "" {
		var err error
		if secs, err = strconv.ParseInt(*epoch, 10, 64); err != nil || secs < 0 {
			return usageError{fmt.Errorf("source date epoch %q: want Unix seconds", *epoch)}
		}
	}
	o.Created = time.Unix(secs, 0).UTC()
	spec, err := LoadSpec(*specFile)
	if err != nil {
		return err
	}
	res, err := Build(ctx, spec, o)
	if err != nil {
		return fmt.Errorf("%s: %w", spec.Name, err)
	}
	st, err := os.Stat(res.Path)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s (%.1f MiB)\n", res.Ref, res.Digest, res.Path, float64(st.Size())/(1<<20))
	if len(res.Packages) > 0 {
		fmt.Printf("  Debian packages: %s\n", packageList(res.Packages))
	}
	return nil
}

func pushCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("imagebuilder push", flag.ContinueOnError)
	image := fs.String("image", "", "image tarball written by imagebuilder build")
	to := fs.String("to", "", "destination, registry/repository:tag")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *image == "" || *to == "" || fs.NArg() > 0 {
		return usageError{fmt.Errorf("push takes -image FILE -to REGISTRY/REPOSITORY:TAG")}
	}
	d, err := Push(ctx, *image, *to, *insecure)
	if err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", *to, d)
	return nil
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("imagebuilder run", flag.ContinueOnError)
	image := fs.String("image", "", "image tarball written by imagebuilder build")
	rootfs := fs.String("rootfs", "", "unpack into this empty directory and keep it (default: a temporary one)")
	skip := fs.Bool("skip-without-chroot", false, "where neither root nor a user namespace allows chroot, say so and exit 0")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *image == "" || fs.NArg() == 0 {
		return usageError{fmt.Errorf("run takes -image FILE -- COMMAND [ARGS]")}
	}
	img, cf, err := loadImage(*image)
	if err != nil {
		return err
	}
	dir := *rootfs
	if dir == "" {
		if dir, err = os.MkdirTemp("", "imagebuilder-rootfs-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if err := unpack(img, dir); err != nil {
		return fmt.Errorf("unpacking %s: %w", *image, err)
	}
	out, err := runChrooted(dir, cf, fs.Args())
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

package main

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Push uploads the image in the tarball to dest (registry/repository:tag) with the
// credentials of the Docker config (docker login, or DOCKER_CONFIG), and checks that
// the registry now serves the digest that was built.
func Push(ctx context.Context, image, dest string, insecure bool) (v1.Hash, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(dest, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("destination %q: %w", dest, err)
	}
	img, err := tarball.ImageFromPath(image, nil)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading %s: %w", image, err)
	}
	want, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading %s: %w", image, err)
	}
	ro := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if err := remote.Write(ref, img, ro...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	desc, err := remote.Head(ref, ro...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("checking %s after the push: %w", ref, err)
	}
	if desc.Digest != want {
		return v1.Hash{}, fmt.Errorf("%s serves %s after the push, not the built %s", ref, desc.Digest, want)
	}
	return want, nil
}

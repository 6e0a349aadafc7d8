// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func remoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
}

func destination(dest string, insecure bool) (name.Tag, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(dest, opts...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("destination %q: %w", dest, err)
	}
	return ref, nil
}

// Push uploads the image index named image (tessera-scheduler) of the OCI layout to
// dest (registry/repository:tag), with every platform's image, then its SBOM and any
// other artifact that refers to it (through the registry's referrers API, or the
// referrers tag where the registry lacks it), with the credentials of the Docker
// config (docker login, or DOCKER_CONFIG). It checks that the registry then serves the
// index digest that was built, and returns it.
func Push(ctx context.Context, layoutDir, image, dest string, insecure bool) (v1.Hash, error) {
	ref, err := destination(dest, insecure)
	if err != nil {
		return v1.Hash{}, err
	}
	images, err := readLayout(layoutDir)
	if err != nil {
		return v1.Hash{}, err
	}
	li := images[image]
	if li == nil {
		return v1.Hash{}, fmt.Errorf("reading %s: no image %s in it", layoutDir, image)
	}
	ro := remoteOptions(ctx)
	if err := remote.WriteIndex(ref, li.Index, ro...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	for _, a := range li.Referrers {
		d, err := a.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		if err := remote.Write(ref.Context().Digest(d.String()), a, ro...); err != nil {
			return v1.Hash{}, fmt.Errorf("pushing %s's SBOM %s: %w", ref, d, err)
		}
	}
	desc, err := remote.Head(ref, ro...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("checking %s after the push: %w", ref, err)
	}
	if desc.Digest != li.Digest {
		return v1.Hash{}, fmt.Errorf("%s serves %s after the push, not the built %s", ref, desc.Digest, li.Digest)
	}
	return li.Digest, nil
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// Helm's OCI media types (helm.sh/helm/v3/pkg/registry): what helm push writes and
// helm pull, helm install oci:// and Flux read.
const (
	helmConfigMediaType types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	helmChartMediaType  types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// PackageChart loads the chart directory with Helm's loader (so a chart Helm would
// refuse is refused here) and returns its archive, as helm package lays it out
// (<name>/<file>), with every timestamp at created: the same chart gives the same bytes.
func PackageChart(dir string, created time.Time) ([]byte, *chart.Metadata, error) {
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	if err := ch.Validate(); err != nil {
		return nil, nil, fmt.Errorf("chart %s: %w", dir, err)
	}
	files := append([]*chart.File(nil), ch.Raw...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, nil, err
	}
	tw := tar.NewWriter(zw)
	mtime := created.UTC().Truncate(time.Second)
	for _, f := range files {
		h := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     ch.Name() + "/" + filepath.ToSlash(f.Name),
			Mode:     0o644,
			Size:     int64(len(f.Data)),
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), ch.Metadata, nil
}

// chartArtifact is the chart as Helm stores it in an OCI registry: its metadata as the
// config, its archive as the one layer.
func chartArtifact(archive []byte, meta *chart.Metadata, created time.Time) (v1.Image, error) {
	config, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	ann := map[string]string{
		"org.opencontainers.image.title":       meta.Name,
		"org.opencontainers.image.version":     meta.Version,
		"org.opencontainers.image.description": meta.Description,
		"org.opencontainers.image.url":         meta.Home,
		"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
	}
	if len(meta.Sources) > 0 {
		ann["org.opencontainers.image.source"] = meta.Sources[0]
	}
	for k, v := range ann {
		if v == "" {
			delete(ann, k)
		}
	}
	return newArtifact("", helmConfigMediaType, config,
		[]artifactLayer{{Layer: static.NewLayer(archive, helmChartMediaType)}}, ann, nil)
}

// PushChart packages the chart directory, writes the archive to out (when not empty)
// as <name>-<version>.tgz, and pushes it to registry/<name>:<version>, where helm pull
// oci://registry/<name> --version <version> finds it (what helm push does).
func PushChart(ctx context.Context, dir, registry, out string, insecure bool, created time.Time) (name.Tag, v1.Hash, error) {
	archive, meta, err := PackageChart(dir, created)
	if err != nil {
		return name.Tag{}, v1.Hash{}, err
	}
	if out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return name.Tag{}, v1.Hash{}, err
		}
		if err := os.WriteFile(filepath.Join(out, meta.Name+"-"+meta.Version+".tgz"), archive, 0o644); err != nil {
			return name.Tag{}, v1.Hash{}, err
		}
	}
	// Helm's tags replace the + of a SemVer build suffix, which tags cannot hold.
	dest := registry + "/" + meta.Name + ":" + strings.ReplaceAll(meta.Version, "+", "_")
	ref, err := destination(dest, insecure)
	if err != nil {
		return name.Tag{}, v1.Hash{}, err
	}
	img, err := chartArtifact(archive, meta, created)
	if err != nil {
		return name.Tag{}, v1.Hash{}, err
	}
	if err := remote.Write(ref, img, remoteOptions(ctx)...); err != nil {
		return name.Tag{}, v1.Hash{}, fmt.Errorf("pushing chart %s: %w", ref, err)
	}
	d, err := img.Digest()
	return ref, d, err
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tessera-dev/tessera/node-agent/serving"
)

// validateServing checks the metrics endpoint's flags: plain HTTP only on a loopback
// address, where nothing but the node itself can reach it.
func (c *Config) validateServing() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--tls-cert-file and --tls-private-key-file go together")
	}
	if c.MetricsAddr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(c.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %q: %w", c.MetricsAddr, err)
	}
	if c.MetricsSecure {
		return nil
	}
	if c.TLSCertFile != "" {
		return errors.New("--tls-cert-file is for --metrics-secure; with --metrics-secure=false the endpoint is plain HTTP")
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--metrics-secure=false serves other tenants' pod names without authentication: "+
			"--metrics-addr %q must be a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT)", c.MetricsAddr)
	}
	return nil
}

// serve starts one server per address: metrics and health share one when the flags are
// equal. The metrics server is HTTPS with delegated authentication and authorization
// (--metrics-secure), where the health paths stay open; a health server of its own is
// plain HTTP for kubelet's probes.
func (a *Agent) serve(ctx context.Context, start func(string, func(context.Context) error)) error {
	muxes := map[string]*http.ServeMux{}
	mux := func(addr string) *http.ServeMux {
		if muxes[addr] == nil {
			muxes[addr] = http.NewServeMux()
		}
		return muxes[addr]
	}
	if a.cfg.MetricsAddr != "" {
		mux(a.cfg.MetricsAddr).Handle("/metrics", a.Metrics.Handler())
	}
	if a.cfg.HealthAddr != "" {
		a.Health.Register(mux(a.cfg.HealthAddr))
	}
	for addr, m := range muxes {
		secure := addr == a.cfg.MetricsAddr && a.cfg.MetricsSecure
		var handler http.Handler = m
		var tlsConfig *tls.Config
		if secure {
			if a.Auth == nil {
				return errors.New("--metrics-secure: no authenticator and authorizer")
			}
			handler = a.Auth.Handler(m)
			var err error
			tlsConfig, err = serving.TLSConfig(ctx, a.cfg.TLSCertFile, a.cfg.TLSKeyFile, a.certHosts(addr))
			if err != nil {
				return fmt.Errorf("--metrics-addr %s: %w", addr, err)
			}
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on %s (--metrics-addr, --health-addr): %w", addr, err)
		}
		srv := &http.Server{Handler: handler, TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second}
		start("http "+addr, func(ctx context.Context) error {
			go func() { <-ctx.Done(); _ = srv.Close() }()
			var err error
			if tlsConfig != nil {
				err = srv.ServeTLS(l, "", "")
			} else {
				err = srv.Serve(l)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		a.log.Info("serving", "addr", l.Addr().String(), "https", secure,
			"metrics", addr == a.cfg.MetricsAddr, "health", addr == a.cfg.HealthAddr)
	}
	return nil
}

// certHosts are the names a self-signed certificate is made for: the node, localhost
// and the address it listens on. Prometheus cannot verify it anyway (nothing signs it),
// so these matter only to a client that pins it.
func (a *Agent) certHosts(addr string) []string {
	hosts := []string{a.cfg.NodeName, "localhost", "127.0.0.1"}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, host)
		}
	}
	return hosts
}

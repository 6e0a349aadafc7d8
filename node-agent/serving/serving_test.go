// SPDX-License-Identifier: Apache-2.0

package serving

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	certutil "k8s.io/client-go/util/cert"
)

// A fake authenticator that knows one token and a fake authorizer that lets its user get
// /metrics: the handler chain answers 401, 403 or the wrapped handler accordingly, and
// lets anyone (anonymous included) reach the open paths.
func TestHandler(t *testing.T) {
	authn := authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		switch r.Header.Get("Authorization") {
		case "Bearer prometheus":
			return &authenticator.Response{User: &user.DefaultInfo{Name: "prometheus"}}, true, nil
		case "Bearer tenant":
			return &authenticator.Response{User: &user.DefaultInfo{Name: "tenant"}}, true, nil
		case "":
			if p := r.URL.Path; p == "/healthz" || p == "/readyz" || p == "/livez" {
				return &authenticator.Response{User: &user.DefaultInfo{Name: user.Anonymous}}, true, nil
			}
		}
		return nil, false, nil
	})
	var asked []authorizer.Attributes
	sar := authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		asked = append(asked, a)
		if a.GetUser().GetName() == "prometheus" && !a.IsResourceRequest() && a.GetPath() == "/metrics" && a.GetVerb() == "get" {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	})
	authz, err := withOpenPaths(sar)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "secret") })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	h := (&Auth{Authenticator: authn, Authorizer: authz}).Handler(mux)

	for _, tc := range []struct {
		path, token string
		code        int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "forged", http.StatusUnauthorized},
		{"/metrics", "tenant", http.StatusForbidden},
		{"/metrics", "prometheus", http.StatusOK},
		{"/healthz", "", http.StatusOK},
		{"/healthz", "tenant", http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.token != "" {
			r.Header.Set("Authorization", "Bearer "+tc.token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || (tc.code != http.StatusOK && w.Body.String() == "secret") {
			t.Errorf("%s with token %q: %d %q, want %d", tc.path, tc.token, w.Code, w.Body.String(), tc.code)
		}
	}
	// The open paths never reach the delegated authorizer.
	for _, a := range asked {
		if a.GetPath() != "/metrics" {
			t.Errorf("the API server was asked about %s", a.GetPath())
		}
	}
}

func handshake(t *testing.T, cfg *tls.Config) *x509.Certificate {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = cfg
	srv.StartTLS()
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.TLS.PeerCertificates[0]
}

// Self-signed for the given hosts, or the operator's certificate from files.
func TestTLSConfig(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := TLSConfig(ctx, "", "", []string{"gpu-node-1", "localhost", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if c := handshake(t, cfg); c.VerifyHostname("gpu-node-1") != nil || c.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("self-signed certificate for %v %v", c.DNSNames, c.IPAddresses)
	}

	dir := t.TempDir()
	crt, key, err := certutil.GenerateSelfSignedCertKey("metrics.example", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, crt, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = TLSConfig(ctx, certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := handshake(t, cfg); c.VerifyHostname("metrics.example") != nil {
		t.Errorf("served %v, not the certificate from %s", c.DNSNames, certFile)
	}
	if _, err := TLSConfig(ctx, certFile, "", nil); err == nil {
		t.Error("a certificate without its key accepted")
	}
	if _, err := TLSConfig(ctx, filepath.Join(dir, "missing.crt"), keyFile, nil); err == nil {
		t.Error("a missing certificate file accepted")
	}
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-dev/tessera/node-agent/serving"
)

// reviewServer is an API server that answers TokenReviews and SubjectAccessReviews only,
// as one would in a cluster where tokens maps bearer tokens to users and only allowed
// may get the /metrics URL. It counts the reviews. (client-go's fake clientset cannot
// stand in: the delegating authenticator posts through the REST client directly.)
func reviewServer(t *testing.T, tokens map[string]string, allowed string) (client kubernetes.Interface, tokenReviews, accessReviews *atomic.Int32) {
	t.Helper()
	tokenReviews, accessReviews = new(atomic.Int32), new(atomic.Int32)
	reply := func(w http.ResponseWriter, obj any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(obj)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		tokenReviews.Add(1)
		var tr authenticationv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if user, ok := tokens[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: user}}
		}
		reply(w, tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		accessReviews.Add(1)
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		nr := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == allowed && nr != nil && nr.Path == "/metrics" && nr.Verb == "get"
		reply(w, sar)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return client, tokenReviews, accessReviews
}

// /metrics over HTTPS: refused without a token (401, and the API server is not asked),
// with a token the API server does not know (401), and for a user not allowed to get
// /metrics (403); served to Prometheus' service account. The health paths on the same
// server answer without credentials, as kubelet's probes need.
func TestMetricsDelegatedAuth(t *testing.T) {
	addr := freeAddr(t)
	c := parse(t, "--simulate", sample("t4-4x-pcie.yaml"), "--node-name", "sim-0", "--poll", "100ms", "--heartbeat", "1s",
		"--metrics-addr", addr, "--health-addr", addr)
	if !c.MetricsSecure {
		t.Fatal("--metrics-secure is not the default")
	}
	a, start := startAgent(t, c)
	// The reviews go to an API server that knows two tokens.
	const prometheus = "system:serviceaccount:monitoring:prometheus"
	reviews, tokenReviews, accessReviews := reviewServer(t, map[string]string{
		"prometheus-token": prometheus,
		"tenant-token":     "system:serviceaccount:tenant-a:default",
	}, prometheus)
	var err error
	if a.Auth, err = serving.Delegated(reviews); err != nil {
		t.Fatal(err)
	}
	start()

	// The certificate is self-signed: nothing here can verify it, as for Prometheus.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitProbeTLS := func(path string) {
		t.Helper()
		for i := 0; ; i++ {
			if code, _ := get(path, ""); code == 200 {
				return
			}
			if i == 200 {
				t.Fatalf("%s never answered 200 without credentials", path)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitProbeTLS("/readyz")
	waitProbeTLS("/healthz")
	waitProbeTLS("/livez")

	for _, tc := range []struct {
		name, token string
		code        int
	}{
		{"no credentials", "", http.StatusUnauthorized},
		{"a token the API server does not know", "forged", http.StatusUnauthorized},
		{"a tenant's token", "tenant-token", http.StatusForbidden},
	} {
		if code, body := get("/metrics", tc.token); code != tc.code || strings.Contains(body, "tessera_") {
			t.Errorf("%s: %d %q, want %d without metrics", tc.name, code, body, tc.code)
		}
	}
	if tr, sar := tokenReviews.Load(), accessReviews.Load(); tr != 2 || sar != 1 {
		t.Errorf("%d token reviews and %d access reviews, want 2 and 1 (none for a request without a token)", tr, sar)
	}
	if code, body := get("/metrics", "prometheus-token"); code != 200 || !strings.Contains(body, "tessera_gpu_memory_total_bytes") {
		t.Errorf("Prometheus: %d %q", code, body)
	}
	// Plain HTTP on the HTTPS port gets nothing.
	if code, body := probe(t, "http://"+addr+"/metrics"); code == 200 {
		t.Errorf("plain HTTP served: %q", body)
	}
}

// Plain HTTP metrics (--metrics-secure=false) are for local development: only on a
// loopback address.
func TestMetricsInsecureOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--metrics-secure=false"}, "must be a loopback address"},
		{[]string{"--metrics-secure=false", "--metrics-addr", "0.0.0.0:9464"}, "must be a loopback address"},
		{[]string{"--metrics-secure=false", "--metrics-addr", "10.0.0.7:9464"}, "must be a loopback address"},
		{[]string{"--metrics-secure=false", "--metrics-addr", "127.0.0.1:9464"}, ""},
		{[]string{"--metrics-secure=false", "--metrics-addr", "[::1]:9464"}, ""},
		{[]string{"--metrics-secure=false", "--metrics-addr", "localhost:9464"}, ""},
		{[]string{"--metrics-secure=false", "--metrics-addr", ""}, ""},
		{[]string{"--metrics-secure=false", "--metrics-addr", "127.0.0.1:9464", "--tls-cert-file", "/c", "--tls-private-key-file", "/k"}, "is for --metrics-secure"},
		{[]string{"--tls-cert-file", "/c"}, "go together"},
		{[]string{"--metrics-addr", "9464"}, "--metrics-addr"},
		{nil, ""},
	} {
		c := parse(t, append([]string{"--node-name", "n", "--nri=false", "--watchdog=false"}, tc.args...)...)
		err := c.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.err)
		}
	}
}

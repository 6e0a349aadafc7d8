// SPDX-License-Identifier: Apache-2.0

package health

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestProgressStalled(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var p Progress
	if err := p.Stalled(t0, time.Minute, "loop"); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Fatalf("before Start: %v", err)
	}
	p.Start(t0)
	if err := p.Stalled(t0.Add(59*time.Second), time.Minute, "loop"); err != nil {
		t.Fatalf("within the bound before the first pass: %v", err)
	}
	if err := p.Stalled(t0.Add(61*time.Second), time.Minute, "loop"); err == nil || !strings.Contains(err.Error(), "no pass completed") {
		t.Fatalf("first pass never came: %v", err)
	}
	// A pass that failed still shows the loop is alive.
	p.Pass(t0.Add(50*time.Second), errors.New("NVML gone"))
	if err := p.Stalled(t0.Add(100*time.Second), time.Minute, "loop"); err != nil {
		t.Fatalf("failed pass 50s ago: %v", err)
	}
	if at, err := p.Last(); !at.Equal(t0.Add(50*time.Second)) || err == nil {
		t.Fatalf("Last: %v %v", at, err)
	}
	if err := p.Stalled(t0.Add(111*time.Second), time.Minute, "loop"); err == nil || !strings.Contains(err.Error(), "last pass 1m1s ago") {
		t.Fatalf("wedged after a pass: %v", err)
	}
	// Start again (a restarted loop) does not move the baseline back.
	p.Start(t0.Add(time.Hour))
	if err := p.Stalled(t0.Add(111*time.Second), time.Minute, "loop"); err == nil {
		t.Fatal("Start reset the last pass")
	}
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestEndpoints(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &Checker{}
	c.SetClock(func() time.Time { return now })
	var liveErr, readyErr error
	c.Add(Check{Name: "loop",
		Live:  func(at time.Time) error { return liveErr },
		Ready: func(at time.Time) error { return readyErr }})
	c.Add(Check{Name: "ready-only", Ready: func(at time.Time) error {
		if !at.Equal(now) {
			return errors.New("wrong clock")
		}
		return nil
	}})
	mux := http.NewServeMux()
	c.Register(mux)

	for _, p := range []string{"/healthz", "/livez", "/readyz"} {
		if code, body := get(t, mux, p); code != 200 || body != "ok\n" {
			t.Errorf("%s all passing: %d %q", p, code, body)
		}
	}
	code, body := get(t, mux, "/readyz?verbose")
	if code != 200 || !strings.Contains(body, "[+]loop ok\n[+]ready-only ok\nreadyz check passed") {
		t.Errorf("verbose: %d %q", code, body)
	}
	// A readiness failure leaves liveness alone.
	readyErr = errors.New("GPU inventory not published yet")
	if code, _ := get(t, mux, "/healthz"); code != 200 {
		t.Errorf("healthz with a readiness failure: %d", code)
	}
	code, body = get(t, mux, "/readyz")
	if code != 503 || !strings.Contains(body, "[-]loop failed: GPU inventory not published yet") || !strings.Contains(body, "readyz check failed") {
		t.Errorf("readyz failing: %d %q", code, body)
	}
	// Liveness: only checks with a Live function take part.
	liveErr = errors.New("inventory poll loop: last pass 5m0s ago")
	code, body = get(t, mux, "/healthz")
	if code != 503 || !strings.Contains(body, "[-]loop failed: inventory poll loop") || strings.Contains(body, "ready-only") {
		t.Errorf("healthz failing: %d %q", code, body)
	}
}

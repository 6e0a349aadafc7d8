// SPDX-License-Identifier: Apache-2.0

// Package health serves the node agent's liveness (/healthz) and readiness (/readyz)
// endpoints. Each subsystem contributes a named check; a check says whether the
// subsystem's loop is making progress (liveness: a failure restarts the agent's
// container) and whether it is doing its job now (readiness: a failure only marks the
// pod not ready).
//
// The responses follow the Kubernetes components' convention: 200 and "ok", or 503 and
// one line per check, "[+]name ok" or "[-]name failed: reason"; ?verbose lists every
// check on success too.
//
// The endpoints answer without credentials (kubelet's probes carry none), so a reason
// names only the agent's own state: a loop, a socket path, the node's inventory, an
// error from NVML, the runtime, kubelet or the API server about the node. Never a pod,
// container or namespace: those belong to the node's tenants.
package health

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Check is one subsystem's contribution. Either function may be nil: the check then
// takes no part in that probe. Each is given the time of the probe.
type Check struct {
	Name  string
	Live  func(now time.Time) error
	Ready func(now time.Time) error
}

// Checker holds the checks. It is safe for concurrent use.
type Checker struct {
	mu     sync.Mutex
	now    func() time.Time // the clock; time.Now when nil
	checks []Check
}

// SetClock replaces the clock the checks are given (tests move it forward).
func (c *Checker) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// Add registers a check.
func (c *Checker) Add(ch Check) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checks = append(c.checks, ch)
}

// Result is the outcome of one probe.
type Result struct {
	OK    bool
	Lines []string // "[+]name ok" / "[-]name failed: reason", in registration order
}

func (c *Checker) run(ready bool) Result {
	c.mu.Lock()
	checks := append([]Check(nil), c.checks...)
	clock := c.now
	c.mu.Unlock()
	if clock == nil {
		clock = time.Now
	}
	now := clock()
	r := Result{OK: true}
	for _, ch := range checks {
		f := ch.Live
		if ready {
			f = ch.Ready
		}
		if f == nil {
			continue
		}
		if err := f(now); err != nil {
			r.OK = false
			r.Lines = append(r.Lines, fmt.Sprintf("[-]%s failed: %v", ch.Name, err))
		} else {
			r.Lines = append(r.Lines, fmt.Sprintf("[+]%s ok", ch.Name))
		}
	}
	return r
}

// Live runs the liveness checks.
func (c *Checker) Live() Result { return c.run(false) }

// Ready runs the readiness checks.
func (c *Checker) Ready() Result { return c.run(true) }

// Register adds /healthz (also /livez) and /readyz to mux.
func (c *Checker) Register(mux *http.ServeMux) {
	live := handler(c.Live, "healthz")
	mux.Handle("/healthz", live)
	mux.Handle("/livez", live)
	mux.Handle("/readyz", handler(c.Ready, "readyz"))
}

func handler(probe func() Result, name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res := probe()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, verbose := r.URL.Query()["verbose"]
		if res.OK && !verbose {
			_, _ = fmt.Fprintln(w, "ok")
			return
		}
		if !res.OK {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		status := "passed"
		if !res.OK {
			status = "failed"
		}
		_, _ = fmt.Fprintf(w, "%s\n%s check %s\n", strings.Join(res.Lines, "\n"), name, status)
	})
}

// Progress records when a loop last completed a pass, so that a check can tell a
// wedged loop (no pass for too long) from a slow one. The zero value is usable; the
// time before the first pass counts from Start.
type Progress struct {
	mu      sync.Mutex
	started time.Time
	last    time.Time
	err     error
}

// Start marks the loop as started (the baseline before its first pass).
func (p *Progress) Start(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started.IsZero() {
		p.started = now
	}
}

// Pass records a completed pass and its outcome.
func (p *Progress) Pass(now time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.err = now, err
}

// Last returns the time of the last pass (zero before the first) and its error.
func (p *Progress) Last() (time.Time, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.err
}

// Stalled returns an error when no pass completed within bound of now (counting from
// Start before the first pass), naming what.
func (p *Progress) Stalled(now time.Time, bound time.Duration, what string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.last.IsZero():
		if age := now.Sub(p.last); age > bound {
			return fmt.Errorf("%s: last pass %s ago, longer than %s", what, age.Round(time.Second), bound)
		}
	case !p.started.IsZero():
		if age := now.Sub(p.started); age > bound {
			return fmt.Errorf("%s: no pass completed in the %s since it started (limit %s)", what, age.Round(time.Second), bound)
		}
	default:
		return fmt.Errorf("%s: not started", what)
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

package progress

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer the reporter's goroutine and the test can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLine(t *testing.T) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name         string
		total, count int64
		elapsed      time.Duration
		want         string
	}{
		// ETA: 120 s for 12,000 units, so 28,000 more take 280 s.
		{"running", 40000, 12000, 2 * time.Minute, "progress: binpack seed 42: 12000/40000 (30.0%), 2m0s elapsed, ETA 4m40s"},
		{"not started", 40000, 0, time.Second, "progress: binpack seed 42: 0/40000 (0.0%), 1s elapsed, ETA unknown"},
		{"total unknown", 0, 7, 3 * time.Second, "progress: binpack seed 42: 7, 3s elapsed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &Task{name: "binpack seed 42", start: start, total: tc.total, count: tc.count}
			if got := task.line(start.Add(tc.elapsed)); got != tc.want {
				t.Errorf("line = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLinesMode(t *testing.T) {
	var out syncBuffer
	r := New(&out, Auto, 10*time.Millisecond)
	if r.Mode() != Lines {
		t.Fatalf("a buffer is no terminal: mode %s, want lines", r.Mode())
	}
	a, b := r.Add("a", 10), r.Add("b", 0)
	a.Set(5)
	b.SetTotal(4)
	b.Set(1)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "progress: b: 1/4") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	a.Done(true)
	b.Done(false)
	r.Wait()
	got := out.String()
	for _, want := range []string{"progress: a: 5/10 (50.0%)", "progress: b: 1/4 (25.0%)", "progress: a: 5/10, done in ", "progress: b: 1/4, failed in "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// Nothing is printed for a task once it is done.
	n := len(got)
	time.Sleep(30 * time.Millisecond)
	if len(out.String()) != n {
		t.Errorf("lines printed after Wait: %q", out.String()[n:])
	}
}

func TestBarsMode(t *testing.T) {
	var out syncBuffer
	r := New(&out, Bars, 0)
	task := r.Add("fragmentation seed 7", 0)
	task.SetTotal(200)
	task.Set(50)
	task.Set(200)
	task.Done(true)
	r.Wait()
	got := out.String()
	for _, want := range []string{"fragmentation seed 7", "200 / 200", "100 %", "done"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar output lacks %q:\n%q", want, got)
		}
	}
	// A buffer is no terminal: results go straight to it, not above the bars.
	var res bytes.Buffer
	if w := r.Writer(&res); w != &res {
		t.Errorf("Writer(buffer) = %T, want the buffer", w)
	}
}

func TestOff(t *testing.T) {
	var out syncBuffer
	for _, r := range []*Reporter{New(&out, Off, time.Millisecond), New(&out, Lines, 0)} {
		task := r.Add("x", 3)
		task.Set(1)
		time.Sleep(5 * time.Millisecond)
		task.Done(true)
		r.Wait()
	}
	if out.String() != "" {
		t.Errorf("off printed %q", out.String())
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"auto", "bars", "lines", "off"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("fancy"); err == nil {
		t.Error("ParseMode(fancy) accepted")
	}
}

func TestBarsRemoveDone(t *testing.T) {
	var out syncBuffer
	r := New(&out, Bars, 0, RemoveDone())
	task := r.Add("binpack seed 42", 10)
	task.Set(10)
	task.Done(true)
	r.Wait()
	// The last thing written moves the cursor up over the bar and erases it.
	if got := out.String(); !strings.HasSuffix(got, "\x1b[1A\x1b[J") {
		t.Errorf("the bar was not erased at the end:\n%q", got)
	}
}

func TestCloseLeavesUnfinished(t *testing.T) {
	for _, m := range []Mode{Bars, Lines} {
		var out syncBuffer
		r := New(&out, m, time.Millisecond)
		r.Add("never done", 10).Set(3)
		finished := make(chan struct{})
		go func() { r.Close(); r.Close(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Close waited for an unfinished task", m)
		}
	}
}

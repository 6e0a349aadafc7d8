// SPDX-License-Identifier: Apache-2.0

// Package progress shows how far long runs (the B1 replay, the B2 phases) have got:
// one bar per task with an ETA when the output is a terminal, and plain lines every
// interval (and one at each task's end) when it is not (CI logs, a redirect), which read well in a log file and
// carry no escape sequences.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// Mode says how progress is shown.
type Mode string

const (
	// Auto is Bars when the output is a terminal and Lines otherwise.
	Auto Mode = "auto"
	// Bars draws one bar per running task (mpb), redrawn in place.
	Bars Mode = "bars"
	// Lines prints one line per running task every interval, and one when it ends.
	Lines Mode = "lines"
	// Off shows nothing.
	Off Mode = "off"
)

// ParseMode checks a mode given on a command line.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Auto, Bars, Lines, Off:
		return m, nil
	}
	return "", fmt.Errorf("progress mode %q: want auto, bars, lines or off", s)
}

// LinePrefix starts every plain progress line, so that a wrapper can pick them out of
// a longer log.
const LinePrefix = "progress: "

// IsTerminal says whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Reporter shows the progress of tasks that run at the same time. Its methods are
// safe for concurrent use.
type Reporter struct {
	mode     Mode
	out      io.Writer
	interval time.Duration
	now      func() time.Time

	bars       *mpb.Progress // Bars mode
	removeDone bool

	mu    sync.Mutex
	tasks []*Task // Lines mode: the tasks not yet done, in the order added
	stop  chan struct{}
	done  chan struct{}
	close sync.Once
}

// Option changes a Reporter.
type Option func(*Reporter)

// RemoveDone takes a finished task's bar off the screen, for callers that print a
// result line for it instead (many tasks would otherwise pile up their bars).
func RemoveDone() Option { return func(r *Reporter) { r.removeDone = true } }

// New starts a reporter that writes to out; in Lines mode it prints every interval.
func New(out io.Writer, mode Mode, interval time.Duration, opts ...Option) *Reporter {
	if mode == Auto || mode == "" {
		mode = Lines
		if IsTerminal(out) {
			mode = Bars
		}
	}
	if mode == Lines && interval <= 0 {
		mode = Off
	}
	r := &Reporter{mode: mode, out: out, interval: interval, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	switch mode {
	case Bars:
		// The caller chose bars: draw them (escape sequences, refreshed) also to a
		// writer mpb cannot tell is a terminal, such as a test's buffer.
		r.bars = mpb.New(mpb.WithOutput(out), mpb.WithWidth(100), mpb.WithRefreshRate(200*time.Millisecond), mpb.ForceTTY(), mpb.WithAutoRefresh())
	case Lines:
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.tick()
	}
	return r
}

// Mode is the mode the reporter runs in (Auto resolved).
func (r *Reporter) Mode() Mode { return r.mode }

// Add starts a task of total units (0: not yet known; SetTotal tells it later).
func (r *Reporter) Add(name string, total int64) *Task {
	t := &Task{r: r, name: name, total: total, start: r.now()}
	switch r.mode {
	case Bars:
		t.bar = r.bars.AddBar(total,
			mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.CountersNoUnit("%d / %d", decor.WCSyncSpace)),
			mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.Name(" "),
				decor.OnComplete(decor.AverageETA(decor.ET_STYLE_GO, decor.WCSyncSpace), "done")),
			mpb.BarOptional(mpb.BarRemoveOnComplete(), r.removeDone))
	case Lines:
		r.mu.Lock()
		r.tasks = append(r.tasks, t)
		r.mu.Unlock()
	}
	return t
}

// Writer is where a caller prints result lines while tasks run, so that they do not
// tear a bar: above the bars when out is a terminal and the bars share it, else out.
func (r *Reporter) Writer(out io.Writer) io.Writer {
	if r.mode == Bars && IsTerminal(out) && IsTerminal(r.out) {
		return r.bars
	}
	return out
}

// Wait returns when every task is done (bars drawn for the last time, the ticker
// stopped). Call it after the last task's Done.
func (r *Reporter) Wait() {
	if r.mode == Bars {
		r.bars.Wait()
	}
	r.Close()
}

// Close stops the reporter without waiting for unfinished tasks (a caller that fails
// half way); bars are left as last drawn. It may be called more than once, and after
// Wait.
func (r *Reporter) Close() {
	r.close.Do(func() {
		switch r.mode {
		case Bars:
			r.bars.Shutdown()
		case Lines:
			close(r.stop)
			<-r.done
		}
	})
}

func (r *Reporter) tick() {
	defer close(r.done)
	tk := time.NewTicker(r.interval)
	defer tk.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tk.C:
			r.printLines()
		}
	}
}

// printLines writes one line per running task.
func (r *Reporter) printLines() {
	r.mu.Lock()
	tasks := append([]*Task(nil), r.tasks...)
	r.mu.Unlock()
	now := r.now()
	for _, t := range tasks {
		fmt.Fprintln(r.out, t.line(now))
	}
}

// Task is one unit of work with a known or later-known total.
type Task struct {
	r     *Reporter
	name  string
	start time.Time
	bar   *mpb.Bar

	mu           sync.Mutex
	total, count int64
}

// SetTotal sets the task's total once it is known.
func (t *Task) SetTotal(total int64) {
	t.mu.Lock()
	t.total = total
	t.mu.Unlock()
	if t.bar != nil {
		t.bar.SetTotal(total, false)
	}
}

// Set records how many units are done.
func (t *Task) Set(n int64) {
	t.mu.Lock()
	t.count = n
	t.mu.Unlock()
	if t.bar != nil {
		t.bar.SetCurrent(n)
	}
}

// Done ends the task: its bar shows "done" at the count reached (or goes, with
// RemoveDone); in Lines mode a last line says so. ok false (the task failed) drops
// its bar, and its last line says "failed".
func (t *Task) Done(ok bool) {
	r := t.r
	r.mu.Lock()
	for i, x := range r.tasks {
		if x == t {
			r.tasks = append(r.tasks[:i], r.tasks[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	if r.mode == Lines {
		end := "done"
		if !ok {
			end = "failed"
		}
		fmt.Fprintln(r.out, t.endLine(r.now(), end))
	}
	if t.bar != nil {
		if ok {
			t.bar.SetTotal(-1, true)
		} else {
			t.bar.Abort(false)
		}
	}
}

// endLine is the task's last line, e.g. "progress: baseline: 2000/2000, done in 2.3s".
func (t *Task) endLine(now time.Time, end string) string {
	t.mu.Lock()
	n, total := t.count, t.total
	t.mu.Unlock()
	count := fmt.Sprint(n)
	if total > 0 {
		count = fmt.Sprintf("%d/%d", n, total)
	}
	return fmt.Sprintf("%s%s: %s, %s in %s", LinePrefix, t.name, count, end, now.Sub(t.start).Round(100*time.Millisecond))
}

// line is the task's plain progress line, e.g.
// "progress: binpack seed 42: 12000/40000 (30.0%), 2m0s elapsed, ETA 4m40s".
func (t *Task) line(now time.Time) string {
	t.mu.Lock()
	n, total := t.count, t.total
	t.mu.Unlock()
	el := now.Sub(t.start).Round(time.Second)
	if total <= 0 {
		return fmt.Sprintf("%s%s: %d, %s elapsed", LinePrefix, t.name, n, el)
	}
	eta := "unknown"
	if n > 0 {
		eta = (time.Duration(float64(now.Sub(t.start)) * float64(total-n) / float64(n))).Round(time.Second).String()
	}
	return fmt.Sprintf("%s%s: %d/%d (%.1f%%), %s elapsed, ETA %s", LinePrefix, t.name, n, total, 100*float64(n)/float64(total), el, eta)
}

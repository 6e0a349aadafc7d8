// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// activations records what the plugin asked the queue to activate.
type activations struct{ calls [][]string }

func (a *activations) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	var keys []string
	for k := range pods {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	a.calls = append(a.calls, keys)
}

func claimPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

func TestRequeue(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	a, b, c := claimPod("a"), claimPod("b"), claimPod("c")
	type step struct {
		do   string // preFilter, reserved, left, wait (advance the clock), timer (advance it to the timer and fire it)
		pod  *v1.Pod
		wait time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  [][]string
	}{{
		// b meets a's claims in flight and is woken when a's PreBind ends; a second
		// end of a (Unreserve after a failed PreBind) wakes nobody.
		name:  "woken when the pod in flight leaves",
		steps: []step{{do: "reserved", pod: a}, {do: "preFilter", pod: b}, {do: "preFilter", pod: c}, {do: "left", pod: a}, {do: "left", pod: a}},
		want:  [][]string{{"ns/b", "ns/c"}},
	}, {
		name:  "nothing in flight at PreFilter",
		steps: []step{{do: "preFilter", pod: b}, {do: "reserved", pod: a}, {do: "left", pod: a}},
	}, {
		// A pod's own retry does not count its own flight.
		name:  "own flight",
		steps: []step{{do: "reserved", pod: a}, {do: "preFilter", pod: a}, {do: "left", pod: a}},
	}, {
		// b met a, then was itself reserved: it no longer waits.
		name:  "placed after all",
		steps: []step{{do: "reserved", pod: a}, {do: "preFilter", pod: b}, {do: "reserved", pod: b}, {do: "left", pod: a}, {do: "left", pod: b}},
	}, {
		// b is remembered again at each retry while another pod is in flight, and
		// woken by whichever leaves after it, at most once a second: a's leaving
		// 100 ms after c's wakes it by a timer.
		name: "two in flight",
		steps: []step{{do: "reserved", pod: a}, {do: "reserved", pod: c}, {do: "preFilter", pod: b}, {do: "left", pod: c},
			{do: "wait", wait: 100 * time.Millisecond}, {do: "preFilter", pod: b}, {do: "left", pod: a}, {do: "timer"}},
		want: [][]string{{"ns/b"}, {"ns/b"}},
	}, {
		// A second later, a retry's wake-up is immediate again.
		name: "a second later",
		steps: []step{{do: "reserved", pod: a}, {do: "reserved", pod: c}, {do: "preFilter", pod: b}, {do: "left", pod: c},
			{do: "wait", wait: activateEvery}, {do: "preFilter", pod: b}, {do: "left", pod: a}},
		want: [][]string{{"ns/b"}, {"ns/b"}},
	}, {
		// A pod never ended (no PreBind nor Unreserve) stops counting after the
		// horizon.
		name:  "horizon",
		steps: []step{{do: "reserved", pod: a}, {do: "wait", wait: inFlightHorizon + time.Second}, {do: "preFilter", pod: b}, {do: "left", pod: a}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			act := &activations{}
			r := newRequeue(act)
			now := time.Unix(1000, 0)
			r.now = func() time.Time { return now }
			var timer func()
			var timerAt time.Duration
			r.after = func(d time.Duration, f func()) {
				if timer != nil {
					t.Fatal("a second timer while one is set")
				}
				timer, timerAt = f, d
			}
			for _, s := range tc.steps {
				switch s.do {
				case "preFilter":
					r.preFilter(s.pod)
				case "reserved":
					r.reserved(s.pod)
				case "left":
					r.left(logger, s.pod)
				case "wait":
					now = now.Add(s.wait)
				case "timer":
					if timer == nil {
						t.Fatal("no timer set")
					}
					f := timer
					timer, now = nil, now.Add(timerAt)
					f()
				}
			}
			if len(act.calls) != len(tc.want) {
				t.Fatalf("activations %v, want %v", act.calls, tc.want)
			}
			for i := range tc.want {
				if !slices.Equal(act.calls[i], tc.want[i]) {
					t.Errorf("activation %d: %v, want %v", i, act.calls[i], tc.want[i])
				}
			}
			if len(r.waiting) != 0 && len(r.inFlight) == 0 || len(r.due) != 0 && timer == nil {
				t.Errorf("%d pods still waiting with none in flight, %d due with no timer", len(r.waiting), len(r.due))
			}
		})
	}
}

// Profiles of one scheduler share its requeue; it is forgotten when the scheduler's
// context ends, and a scheduler started after that gets a new one.
func TestRequeueForScheduler(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := &draHandle{}
	mgr := h.SharedDRAManager()
	a, b := requeueFor(ctx, h), requeueFor(ctx, h)
	if a != b {
		t.Fatal("two profiles of one scheduler got two requeues")
	}
	if other := requeueFor(ctx, &draHandle{}); other == a {
		t.Fatal("another scheduler got the first one's requeue")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := requeues.Load(mgr); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an ended scheduler's requeue is still kept")
		}
		time.Sleep(time.Millisecond)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if c := requeueFor(ctx2, h); c == a {
		t.Fatal("a scheduler started after the first ended got its requeue")
	}
}

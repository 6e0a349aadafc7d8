// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// The attacks of a tenant who can create and edit pods in its namespace: each must be
// refused by the binder on its own, without the admission policy that reserves the
// assignment annotation to the scheduler.
func TestForgedAssignmentsRefused(t *testing.T) {
	whole := func(uuid string) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: uuid, MemoryMiB: 81920, Cores: 100}}}
	}
	marker := deviceplugin.EnvRequested + "=1"
	for name, tc := range map[string]struct {
		spec   func(ann map[string]string) *corev1.Pod
		grant  api.ContainerAssignment
		env    []string
		refuse string
	}{
		// The reproduction in the issue: no GPU request, no marker, a hand-written
		// assignment granting a whole GPU.
		"grant without a GPU request": {
			spec:   func(ann map[string]string) *corev1.Pod { return pod("uid-1", "train", ann, ctr("main", nil)) },
			grant:  whole("GPU-0"),
			refuse: "its spec asks for no tessera.dev/gpu",
		},
		"more memory than requested": {
			spec: func(ann map[string]string) *corev1.Pod {
				return pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
			},
			grant:  api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 81920}}},
			env:    []string{marker},
			refuse: "grants 81920 MiB on GPU-0, the container's request (1 GPU × 4096 MiB) takes 4096 MiB",
		},
		"more cores than requested": {
			spec: func(ann map[string]string) *corev1.Pod {
				return pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 10)))
			},
			grant:  api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096, Cores: 100}}},
			refuse: "grants 100% cores on GPU-0, the container asks for 10%",
		},
		"more GPUs than requested": {
			spec: func(ann map[string]string) *corev1.Pod {
				return pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
			},
			grant: api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{
				{UUID: "GPU-0", MemoryMiB: 4096}, {UUID: "GPU-1", Index: 1, MemoryMiB: 4096}}},
			refuse: "grants 2 devices, the container asks for 1",
		},
		"a MIG-mode GPU as a whole": {
			spec: func(ann map[string]string) *corev1.Pod {
				return pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 0, 0)))
			},
			grant:  api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-2", Index: 2, MemoryMiB: 81920}}},
			refuse: "GPU-2, which is not a schedulable GPU or MIG instance",
		},
		"not placed by Tessera (spec.nodeName set, default scheduler)": {
			spec: func(ann map[string]string) *corev1.Pod {
				p := pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 0, 100)))
				p.Spec.SchedulerName = corev1.DefaultSchedulerName
				return p
			},
			grant:  whole("GPU-0"),
			refuse: `spec.schedulerName "default-scheduler" is not one of Tessera's schedulers`,
		},
		"init flag flipped": {
			spec: func(ann map[string]string) *corev1.Pod {
				return pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 0, 100)))
			},
			grant:  api.ContainerAssignment{Name: "main", Init: true, Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 81920, Cores: 100}}},
			refuse: "init=true",
		},
		"pod bound elsewhere": {
			spec: func(ann map[string]string) *corev1.Pod {
				p := pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 0, 100)))
				p.Spec.NodeName = "node-2"
				return p
			},
			grant:  whole("GPU-0"),
			refuse: `the pod is bound to node "node-2"`,
		},
		"pod unknown to the API server": {
			spec:   func(map[string]string) *corev1.Pod { return nil },
			grant:  whole("GPU-0"),
			refuse: "the pod does not exist in the API server",
		},
		"annotation differs from the API server's": {
			spec: func(map[string]string) *corev1.Pod {
				return pod("uid-1", "train", assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 81920}}}),
					ctr("main", gpuLimits(1, 0, 100)))
			},
			grant:  whole("GPU-0"),
			refuse: "differs from the one it was created with",
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, ps := newBinderWithPods(t, t.TempDir())
			ann := assignment(t, "node-1", tc.grant)
			if p := tc.spec(ann); p != nil {
				ps.byUID["uid-1"] = p
			}
			e, err := b.Bind(req("c1", "main", ann, tc.env...))
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.refuse) {
				t.Fatalf("got %v, %v; want a refusal containing %q", e, err, tc.refuse)
			}
			if len(b.Records()) != 0 {
				t.Errorf("a refused container was recorded: %+v", b.Records())
			}
			entries, _ := os.ReadDir(filepath.Join(b.cfg.LimitsRoot))
			if len(entries) != 0 {
				t.Errorf("a refused container got a limits directory")
			}
		})
	}
}

// The API server cannot be reached: a container with an assignment is refused (it
// would otherwise run on an unchecked grant); a container without one is untouched.
func TestPodUnreadable(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	ps.err = errors.New("connection refused")
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096}}})
	if _, err := b.Bind(req("c1", "main", ann)); err == nil || !strings.Contains(err.Error(), "cannot read the pod to check its GPU assignment: connection refused") {
		t.Fatalf("got %v", err)
	}
	if e, err := b.Bind(req("c2", "web", nil)); e != nil || err != nil {
		t.Fatalf("a container without GPUs was touched: %v %v", e, err)
	}
}

// The cache may lag a pod bound a moment ago: the binder reads it again from the API
// server before refusing.
func TestStaleCacheReadAgain(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
	ps.staleCached = map[string]*corev1.Pod{"uid-1": pod("uid-1", "train", nil, ctr("main", gpuLimits(1, 4096, 0)))}
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	if ps.freshReads == 0 {
		t.Error("the stale cached pod was not read again")
	}
}

// Two pods whose assignments each match their requests but together exceed a GPU (a
// tenant placing a pod itself with spec.nodeName and a copied assignment): the second
// is refused while the first pod exists, and bound once it is gone.
func TestNoGPUGrantedTwice(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	grant := func(mib int64, cores int) map[string]string {
		return assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: mib, Cores: cores}}})
	}
	annA, annB := grant(50000, 60), grant(40000, 30)
	ps.byUID["uid-a"] = pod("uid-a", "a", annA, ctr("main", gpuLimits(1, 50000, 60)))
	ps.byUID["uid-b"] = pod("uid-b", "b", annB, ctr("main", gpuLimits(1, 40000, 30)))
	reqFor := func(uid, name, id string, ann map[string]string) Request {
		r := req(id, "main", ann)
		r.PodUID, r.Pod = uid, name
		return r
	}
	if _, err := b.Bind(reqFor("uid-a", "a", "ca", annA)); err != nil {
		t.Fatal(err)
	}
	_, err := b.Bind(reqFor("uid-b", "b", "cb", annB))
	if err == nil || !strings.Contains(err.Error(), "90000 MiB of 81920") || !strings.Contains(err.Error(), "granted twice") {
		t.Fatalf("second grant: %v", err)
	}
	// Cores alone over 100% are refused too.
	annC := grant(1000, 50)
	ps.byUID["uid-c"] = pod("uid-c", "c", annC, ctr("main", gpuLimits(1, 1000, 50)))
	if _, err := b.Bind(reqFor("uid-c", "c", "cc", annC)); err == nil || !strings.Contains(err.Error(), "110% cores") {
		t.Fatalf("cores over 100%%: %v", err)
	}
	// A restarted instance of the same container does not count against itself.
	if _, err := b.Bind(reqFor("uid-a", "a", "ca-2", annA)); err != nil {
		t.Fatalf("restart of the first container: %v", err)
	}
	// The first pod is deleted (its containers' records may linger until the runtime
	// removes them): the second binds.
	delete(ps.byUID, "uid-a")
	if _, err := b.Bind(reqFor("uid-b", "b", "cb", annB)); err != nil {
		t.Fatalf("after the first pod is gone: %v", err)
	}
}

// A bound container's grant is frozen: an edit of its pod's annotation afterwards
// (raising its own memory) changes nothing when it is bound again, as every new
// process is under the fallback binding and every container after an agent restart.
func TestGrantFrozenAfterFirstBind(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	edited := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 81920, Cores: 100}}})
	ps.byUID["uid-1"].Annotations = edited
	e, err := b.Bind(req("c1", "main", edited))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(e.Limits)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) != 1 || l.GPUs[0].MemoryMiB != 4096 || l.GPUs[0].Cores != 0 {
		t.Fatalf("limits after the edit: %+v", l.GPUs)
	}
	// The same container id in another cgroup is not this container.
	r := req("c1", "main", ann)
	r.CgroupsPath = "kubepods-burstable-poduid_2.slice:cri-containerd:c1"
	if _, err := b.Bind(r); err == nil || !strings.Contains(err.Error(), "was bound in cgroup") {
		t.Fatalf("other cgroup: %v", err)
	}
}

// A grant below this node's charge for one CUDA context (--context-mib; the default
// 576 MiB) is refused at creation: no process of the container could create a
// context. The scheduler places no such grant on a node that publishes its charge;
// the binder holds the line for grants it did not make and nodes it misjudged.
func TestGrantBelowContextChargeRefused(t *testing.T) {
	pct := func(p int64) corev1.ResourceList {
		rl := gpuLimits(1, 0, 0)
		rl["tessera.dev/gpu-memory-percent"] = *resource.NewQuantity(p, resource.DecimalSI)
		return rl
	}
	for _, tc := range []struct {
		name       string
		contextMiB int64 // the binder's; 0: the default
		limits     corev1.ResourceList
		grantMiB   int64
		refuse     string // "" when bound
	}{
		{"MiB below the default charge", 0, gpuLimits(1, 512, 0), 512,
			"its grant on GPU-0 is 512 MiB, less than the 576 MiB the CUDA hook on this node charges for each process's CUDA context (--context-mib 576)"},
		{"MiB at the default charge", 0, gpuLimits(1, 576, 0), 576, ""},
		{"MiB below this node's larger charge", 1024, gpuLimits(1, 1000, 0), 1000, "less than the 1024 MiB"},
		{"MiB below the default, above this node's smaller charge", 300, gpuLimits(1, 400, 0), 400, ""},
		// 1% of GPU-0's 81920 MiB is 819.
		{"percent above the default charge", 0, pct(1), 819, ""},
		{"percent below this node's charge", 1024, pct(1), 819, "its grant on GPU-0 is 819 MiB, less than the 1024 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, ps := newBinderWithPods(t, t.TempDir())
			if tc.contextMiB != 0 {
				b.cfg.ContextMiB = tc.contextMiB
			}
			ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: tc.grantMiB}}})
			ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", tc.limits))
			_, err := b.Bind(req("c1", "main", ann, deviceplugin.EnvRequested+"=1"))
			if tc.refuse == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.refuse) {
				t.Fatalf("got %v; want a refusal containing %q", err, tc.refuse)
			}
		})
	}
}

// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/binding/bindingtest"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// fakePods is the agent's pod cache for one node.
type fakePods struct {
	mu   sync.Mutex
	pods map[string]*corev1.Pod
}

func (f *fakePods) PodByUID(uid string) *corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods[uid]
}

// Get is the binder's view of the same pods (binding.Config.Pods).
func (f *fakePods) Get(namespace, name, uid string, _ bool) (*corev1.Pod, error) {
	p := f.PodByUID(uid)
	if p == nil || p.Namespace != namespace || p.Name != name {
		return nil, nil
	}
	return p, nil
}

func (f *fakePods) set(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[string(p.UID)] = p
}

func fakeDev(path string) (binding.DeviceNode, error) {
	var n int64
	base := filepath.Base(path)
	switch {
	case base == "nvidiactl":
		return binding.DeviceNode{Path: path, Type: "c", Major: 195, Minor: 255}, nil
	case base == "nvidia-uvm":
		return binding.DeviceNode{Path: path, Type: "c", Major: 510}, nil
	default:
		if _, err := fmt.Sscanf(base, "nvidia%d", &n); err == nil {
			return binding.DeviceNode{Path: path, Type: "c", Major: 195, Minor: n}, nil
		}
	}
	return binding.DeviceNode{}, os.ErrNotExist
}

type env struct {
	t       *testing.T
	dir     string
	socket  string
	proc    string
	pods    *fakePods
	srv     *Server
	binder  *binding.Binder
	mu      sync.Mutex
	refused []string
}

func newEnv(t *testing.T, wait time.Duration, opts ...func(*Config)) *env {
	t.Helper()
	// Unix socket paths are short (108 bytes): keep the directory short too.
	dir, err := os.MkdirTemp("", "tb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	pods := &fakePods{pods: map[string]*corev1.Pod{}}
	b, err := binding.New(binding.Config{
		NodeName: "node-1", Names: api.DefaultResourceNames(), Store: store, LimitsRoot: filepath.Join(dir, "limits"),
		Devices: func() ([]gpu.Device, error) {
			return []gpu.Device{{UUID: "GPU-0", Minor: 0}, {UUID: "GPU-1", Index: 1, Minor: 1}}, nil
		},
		StatDevice: fakeDev, Pods: pods.Get, SchedulerNames: []string{bindingtest.Scheduler},
		Inventory: func() (*api.NodeInventory, error) { return bindingtest.Inventory(81920, "GPU-0", "GPU-1"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, socket: filepath.Join(dir, "bind", "bind.sock"), proc: filepath.Join(dir, "proc"),
		pods: pods, binder: b}
	cfg := Config{
		Socket: e.socket, ProcRoot: e.proc, Pods: e.pods, Binder: b, StatusWait: wait, StatusPoll: 20 * time.Millisecond,
		OnRefused: func(pod *corev1.Pod, c, reason string) {
			e.mu.Lock()
			defer e.mu.Unlock()
			who := "<no pod>"
			if pod != nil {
				who = pod.Namespace + "/" + pod.Name
			}
			e.refused = append(e.refused, who+": "+reason)
		},
		Log: logr.Discard(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.srv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return e
}

// caller puts the test process (the peer of every connection it makes) in a cgroup.
func (e *env) caller(cgroupFile string) {
	d := filepath.Join(e.proc, fmt.Sprint(os.Getpid()))
	if err := os.MkdirAll(d, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte(cgroupFile), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) lastRefusal() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.refused) == 0 {
		return ""
	}
	return e.refused[len(e.refused)-1]
}

const cg = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope"

func pod(t *testing.T, node string, statusID string, cs ...api.ContainerAssignment) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "train", UID: types.UID(uid), Annotations: map[string]string{}}}
	if len(cs) > 0 {
		// As Tessera's scheduler placed it: the spec asks for what cs grants.
		a := &api.PodAssignment{Version: api.AssignmentVersion, Node: node, Containers: cs}
		if _, err := api.EncodeAssignment(a); err != nil {
			t.Fatal(err)
		}
		p = bindingtest.Placed("team", "train", uid, a, "sidecar")
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "sidecar", ContainerID: "containerd://" + strings.Repeat("e", 64)}}
	if statusID != "" {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "main", ContainerID: statusID})
	}
	return p
}

// fetchLimits asks the server for the calling process's limits, as the hook does, and
// decodes them.
func (e *env) fetchLimits(t *testing.T) ([]byte, *api.ContainerLimits) {
	t.Helper()
	data, err := Fetch(e.socket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	return data, l
}

var mainGrant = api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 30}}}

func TestBindAtFirstCall(t *testing.T) {
	e := newEnv(t, 5*time.Second)
	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	data, l := e.fetchLimits(t)
	if l.Cgroup != cg || len(l.GPUs) != 1 || l.GPUs[0] != (api.GPULimit{UUID: "GPU-1", MemoryMiB: 4096, Cores: 30}) {
		t.Errorf("limits %+v", l)
	}
	// Recorded like an NRI binding, so that the watchdog and the metrics see it.
	recs := e.binder.Records()
	if len(recs) != 1 || recs[0].ContainerID != cid || recs[0].Container != "main" || recs[0].Cgroup != cg || recs[0].Pod != "train" {
		t.Fatalf("records %+v", recs)
	}
	// A second process of the container gets the same limits (and the same phase).
	again, err := Fetch(e.socket, 10*time.Second)
	if err != nil || string(again) != string(data) {
		t.Fatalf("second call: %v\n%s\nfirst:\n%s", err, again, data)
	}
	// A process in a cgroup below the container's belongs to it too.
	e.caller("0::" + cg + "/worker\n")
	if again, err := Fetch(e.socket, 10*time.Second); err != nil || string(again) != string(data) {
		t.Fatalf("nested cgroup: %v", err)
	}

	// The container restarts as a new one: reconciling forgets the old record.
	e.pods.set(pod(t, "node-1", "containerd://"+strings.Repeat("f", 64), mainGrant))
	if errs := e.srv.Reconcile(); len(errs) != 0 {
		t.Fatal(errs)
	}
	if recs := e.binder.Records(); len(recs) != 0 {
		t.Fatalf("records after restart %+v", recs)
	}
}

// A container of a deleted pod holds its compute window until it is forgotten: a
// bind forgets it first, so that the new container's window is placed among the
// containers still there (here: at 0, not after the gone pod's 70%).
func TestBindForgetsDeletedPods(t *testing.T) {
	e := newEnv(t, 5*time.Second)
	gone := bindingtest.Placed("team", "gone", uid2, &api.PodAssignment{Version: api.AssignmentVersion, Node: "node-1",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 70}}}}})
	e.pods.set(gone)
	if _, err := e.binder.Bind(binding.Request{PodUID: uid2, Namespace: "team", Pod: "gone", PodAnnotations: gone.Annotations,
		Container: "main", ContainerID: cid2, CgroupsPath: "/kubepods/pod" + uid2 + "/" + cid2,
		Env: []string{deviceplugin.EnvRequested + "=1"}, Started: true}); err != nil {
		t.Fatal(err)
	}
	// Deleted: gone from the pod cache, its record still there.
	e.pods.mu.Lock()
	delete(e.pods.pods, uid2)
	e.pods.mu.Unlock()
	if recs := e.binder.Records(); len(recs) != 1 || recs[0].Phases["GPU-1"] != 0 {
		t.Fatalf("records %+v", recs)
	}

	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	_, l := e.fetchLimits(t)
	if len(l.GPUs) != 1 || l.GPUs[0].Cores != 30 || l.GPUs[0].Phase != 0 {
		t.Errorf("limits %+v: want 30%% at phase 0, the deleted pod's window free", l.GPUs)
	}
	if recs := e.binder.Records(); len(recs) != 1 || recs[0].ContainerID != cid {
		t.Errorf("records %+v: want the new container's only", recs)
	}
}

// A CUDA program may call cuInit before kubelet has put the container in the pod's
// status: the agent waits for it.
func TestWaitsForStatus(t *testing.T) {
	e := newEnv(t, 5*time.Second)
	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "", mainGrant))
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	}()
	start := time.Now()
	if _, err := Fetch(e.socket, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("answered after %s, before the status had the container", d)
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t, 200*time.Millisecond)
	for _, tc := range []struct {
		name, cgroupFile string
		pod              *corev1.Pod
		want             string
		event            string // "": no pod to put an event on
	}{
		{"host process", "0::/system.slice/sshd.service\n", nil, "unknown cgroup", ""},
		{"pod not on this node", "0::" + cg + "\n", nil, "is not a pod of this node", ""},
		{"no assignment", "0::" + cg + "\n", pod(t, "", "containerd://"+cid), "has no tessera.dev/gpu-assignment annotation", "team/train"},
		{"no entry for the container", "0::" + cg + "\n",
			pod(t, "node-1", "containerd://"+cid, api.ContainerAssignment{Name: "other", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1}}}),
			"has no entry for it", "team/train"},
		{"assignment for another node", "0::" + cg + "\n", pod(t, "node-2", "containerd://"+cid, mainGrant), `is for node "node-2"`, "team/train"},
		{"container never in the status", "0::" + cg + "\n", pod(t, "node-1", "", mainGrant), "does not appear in the pod's status", "team/train"},
		{"container id of another pod's container", "0::" + cg + "\n", pod(t, "node-1", "containerd://"+strings.Repeat("d", 64), mainGrant),
			"does not appear in the pod's status", "team/train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.caller(tc.cgroupFile)
			e.pods.mu.Lock()
			e.pods.pods = map[string]*corev1.Pod{}
			e.pods.mu.Unlock()
			if tc.pod != nil {
				e.pods.set(tc.pod)
			}
			_, err := Fetch(e.socket, 10*time.Second)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			ev := e.lastRefusal()
			if !strings.HasPrefix(ev, cond(tc.event == "", "<no pod>", tc.event)+": ") || !strings.Contains(ev, tc.want) {
				t.Errorf("refusal reported as %q", ev)
			}
			if len(e.binder.Records()) != 0 {
				t.Error("a refused container was recorded")
			}
		})
	}
	// A caller that speaks another protocol gets an error line, and the server goes on.
	c, err := net.Dial("unixpacket", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "error the agent expected") {
		t.Errorf("reply %q", buf[:n])
	}
}

// Connections that never send a request are dropped after RequestTimeout, and one
// container holds at most MaxOpenPerContainer: more are refused at once with the
// reason, and its callers are served again once the silent ones are dropped.
func TestSilentCallersDoNotBlock(t *testing.T) {
	e := newEnv(t, time.Second, func(c *Config) { c.RequestTimeout = 200 * time.Millisecond })
	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	var idle []net.Conn
	for i := 0; i < 80; i++ { // more than MaxOpenPerContainer (64)
		c, err := net.Dial("unixpacket", e.socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	buf := make([]byte, 512)
	_ = idle[79].SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := idle[79].Read(buf); !strings.Contains(string(buf[:n]), "already holds 64 connections to the node agent") {
		t.Errorf("connection over the bound: reply %q", buf[:n])
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if _, err := Fetch(e.socket, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a caller waited %s behind silent connections", d)
	}
}

// A second pod's container, for the flood.
const (
	uid2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
	cid2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	cg2  = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9a8b7c6d_5e4f_4a3b_8c2d_1e0f9a8b7c6d.slice/cri-containerd-" + cid2 + ".scope"
)

// TestFloodHelper is the flooding container's process in TestFloodFromOneContainer
// (the test binary run again, so that its connections have a peer of their own): it
// opens TESSERA_FLOOD_N connections, sends the request on half of them, and holds
// them all until its stdin closes.
func TestFloodHelper(t *testing.T) {
	sock := os.Getenv("TESSERA_FLOOD_SOCKET")
	if sock == "" {
		t.Skip("run by TestFloodFromOneContainer")
	}
	n, _ := strconv.Atoi(os.Getenv("TESSERA_FLOOD_N"))
	in := bufio.NewReader(os.Stdin)
	_, _ = in.ReadString('\n')
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.Dial("unixpacket", sock)
		if err != nil {
			continue
		}
		if i%2 == 0 {
			_, _ = c.Write([]byte(Request))
		}
		conns = append(conns, c)
	}
	fmt.Printf("dialled %d\n", len(conns))
	_, _ = io.Copy(io.Discard, in)
	for _, c := range conns {
		c.Close()
	}
}

// One container (another process, in another pod's cgroup) opens many connections
// and holds them: half silent, half asking for a container that kubelet has not
// reported, so their binds wait. Another container's first CUDA call must still be
// answered in under a second, throughout.
func TestFloodFromOneContainer(t *testing.T) {
	e := newEnv(t, 5*time.Second)
	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	flooder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "flood", UID: types.UID(uid2)}}
	e.pods.set(flooder)

	const n = 300
	cmd := exec.Command(os.Args[0], "-test.run=^TestFloodHelper$")
	cmd.Env = append(os.Environ(), "TESSERA_FLOOD_SOCKET="+e.socket, fmt.Sprintf("TESSERA_FLOOD_N=%d", n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	// The flooder's cgroup, as /proc shows it, before it connects.
	d := filepath.Join(e.proc, strconv.Itoa(cmd.Process.Pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte("0::"+cg2+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	floodStart := time.Now()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	dialled := ""
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "dialled ") {
			dialled = sc.Text()
			break
		}
	}
	if dialled == "" {
		t.Fatal("the flooding process did not connect")
	}
	t.Logf("flooding container: %s connections in %s", strings.TrimPrefix(dialled, "dialled "), time.Since(floodStart).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond)
	var worst time.Duration
	var took []string
	for i := 0; i < 6; i++ {
		start := time.Now()
		if _, err := Fetch(e.socket, 10*time.Second); err != nil {
			t.Fatalf("the other container's call %d: %v", i, err)
		}
		d := time.Since(start)
		took = append(took, d.Round(10*time.Microsecond).String())
		worst = max(worst, d)
		time.Sleep(400 * time.Millisecond)
	}
	t.Logf("the other container bound in %s (worst %s) while the flood held its connections", strings.Join(took, ", "), worst)
	if worst >= time.Second {
		t.Errorf("the other container waited %s behind the flood", worst)
	}
}

// Slots go to containers in turn: a container with many callers waiting does not
// keep a newcomer from the next free slot.
func TestFairSlots(t *testing.T) {
	f := newFairSlots(2, 2)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if !f.acquire(ctx, "a") {
			t.Fatal("a free slot was not given")
		}
	}
	got := make(chan string, 20)
	for i := 0; i < 8; i++ {
		go func() {
			if f.acquire(ctx, "a") {
				got <- "a"
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	go func() {
		if f.acquire(ctx, "b") {
			got <- "b"
		}
	}()
	time.Sleep(50 * time.Millisecond)
	// a's callers queued first, so a is first in turn; b is next, ahead of a's
	// seven others.
	f.release("a")
	first := <-got
	f.release("a")
	if second := <-got; first != "a" || second != "b" {
		t.Fatalf("freed slots went to %s then %s, want a then b (in turn)", first, second)
	}
	// Per-container bound: c gets no second slot while d still gets one.
	g := newFairSlots(10, 1)
	if !g.acquire(ctx, "c") {
		t.Fatal("no slot")
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if g.acquire(short, "c") {
		t.Fatal("a container got more than its bound")
	}
	if !g.acquire(ctx, "d") {
		t.Fatal("another container was kept out")
	}
	// Open connections.
	for i := 0; i < 3; i++ {
		if !g.enter("e", 3) {
			t.Fatal("refused under the bound")
		}
	}
	if g.enter("e", 3) {
		t.Fatal("a fourth connection over a bound of 3")
	}
	g.leave("e")
	if !g.enter("e", 3) {
		t.Fatal("refused after one left")
	}
}

func cond(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

// The process that connected exits and its PID could be reused before the agent
// reads its cgroup: the pidfd of the original process shows it is gone.
func TestCallerExited(t *testing.T) {
	e := newEnv(t, time.Second)
	e.caller("0::" + cg + "\n")
	e.pods.set(pod(t, "node-1", "containerd://"+cid, mainGrant))
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		cmd.Wait()
		t.Skipf("no pidfd support: %v", err)
	}
	cmd.Wait()
	e.srv.peer = func(*net.UnixConn) (int, int, error) { return os.Getpid(), pidfd, nil }
	if _, err := Fetch(e.socket, 5*time.Second); err == nil || !strings.Contains(err.Error(), "exited before it could be identified") {
		t.Fatalf("error %v", err)
	}
	if len(e.binder.Records()) != 0 {
		t.Error("recorded")
	}
}

// The peer's credentials come from the kernel: the real peerCredentials sees the test
// process itself.
func TestPeerCredentials(t *testing.T) {
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("unixpacket", filepath.Join(dir, "s"))
		if err == nil {
			time.Sleep(200 * time.Millisecond)
			c.Close()
		}
	}()
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid, pidfd, err := peerCredentials(c)
	if err != nil || pid != os.Getpid() {
		t.Fatalf("pid %d, %v; want %d", pid, err, os.Getpid())
	}
	if pidfd >= 0 {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			t.Errorf("pidfd of a live process: %v", err)
		}
		unix.Close(pidfd)
	}
}

func TestListenChecksDirectory(t *testing.T) {
	e := newEnv(t, time.Second)
	dir, err := os.MkdirTemp("", "tl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "limits"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Socket: filepath.Join(dir, "bind.sock"), Pods: e.pods, Binder: e.binder, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), "must hold only the socket") {
		t.Fatalf("Listen: %v", err)
	}
	if fi, err := os.Stat(e.socket); err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("socket mode: %v %v", fi, err)
	}
}

func TestSealedMemfd(t *testing.T) {
	fd, err := sealedMemfd([]byte("version 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, []byte("X"), 0); err == nil {
		t.Error("a sealed memfd was writable")
	}
	if err := unix.Ftruncate(fd, 1); err == nil {
		t.Error("a sealed memfd could shrink")
	}
	seals, _ := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if seals&RequiredSeals != RequiredSeals {
		t.Errorf("seals %#x", seals)
	}
}

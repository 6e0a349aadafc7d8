// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	backendcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkplugins "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/tessera-dev/tessera/internal/progress"
	"github.com/tessera-dev/tessera/plugins/gpushare"
	"github.com/tessera-dev/tessera/plugins/gpushare/draplacement"
	"github.com/tessera-dev/tessera/plugins/noderesourcesfit"
)

// policy is one placement strategy the replay compares. Production policies are a
// profile of the Tessera scheduler config, optionally with the plugin's args changed;
// comparison policies (the FGD paper's baselines) replace the profile's Score plugins
// with a tool-only plugin but keep the production Filter and Reserve.
type policy struct {
	name    string
	profile string // schedulerName in the config
	// args adjusts TesseraGPUShare's args (nil: as configured).
	args func(*gpushare.TesseraGPUShareArgs)
	// score, when set, is the only Score plugin (a comparison policy).
	score string
	// inTreeDRA replaces TesseraDynamicResources with the in-tree DynamicResources
	// plugin: DRA mode's upstream allocator alone (first fit).
	inTreeDRA bool
	// modes is where the policy applies (nil: every mode).
	modes []string
	doc   string
}

var policies = []policy{
	{name: "binpack", profile: "tessera-binpack", doc: "the tessera-binpack profile as configured"},
	{name: "spread", profile: "tessera-spread", doc: "the tessera-spread profile as configured"},
	{name: "fragmentation", profile: "tessera-fragmentation", doc: "the tessera-fragmentation profile as configured"},
	{name: "fragmentation-gpuscore", profile: "tessera-fragmentation", score: gpushare.Name, modes: []string{modeDevicePlugin}, doc: "as fragmentation, with TesseraGPUShare the only Score plugin"},
	{name: "bestfit", profile: "tessera-binpack", score: bestFitName, modes: []string{modeDevicePlugin}, doc: "comparison: the FGD paper's BestFit node score; GPUs chosen best-fit",
		args: func(a *gpushare.TesseraGPUShareArgs) { a.DevicePolicy = gpushare.Binpack }},
	{name: "random", profile: "tessera-binpack", score: randomName, modes: []string{modeDevicePlugin}, doc: "comparison: a uniformly random feasible node"},
	{name: "first-fit", profile: "tessera-binpack", inTreeDRA: true, modes: []string{modeDRA}, doc: "comparison, DRA mode: the in-tree DynamicResources plugin in place of TesseraDynamicResources (devices first fit, nodes by the profile's other Score plugins)"},
}

// appliesTo says whether the policy can run in a mode.
func (p *policy) appliesTo(mode string) bool {
	if p.modes == nil {
		return true
	}
	for _, m := range p.modes {
		if m == mode {
			return true
		}
	}
	return false
}

func findPolicy(name string) (*policy, error) {
	for i := range policies {
		if policies[i].name == name {
			return &policies[i], nil
		}
	}
	return nil, fmt.Errorf("unknown policy %q", name)
}

// cluster is the replay's input, shared read-only by every run.
type cluster struct {
	mode string // modeDevicePlugin or modeDRA
	// memoryMiB, when set, makes device-plugin shares ask gpu-memory in MiB from it,
	// as claims do (-gpu-memory mib).
	memoryMiB *memoryTable
	nodes     []*v1.Node
	gpus      map[string]int // node -> GPU count
	totalGPU  int64          // milli-GPUs
	pods      []tracePod
	shapes    []shape // the trace's GPU pod shapes and frequencies, for the fragmentation metric
}

// point is the cluster state after one pod arrived.
type point struct {
	arrivedMilli, allocMilli int64
}

// runResult is one policy × seed.
type runResult struct {
	policy      string
	seed        int64
	points      []point
	scheduled   int
	failed      int
	fragAt      map[int]float64 // arrived % -> fragmentation ratio (% of free GPU capacity)
	failedKinds map[string]int  // pod kind -> pods that did not fit, up to 100% arrived load
	podsTotal   int
	checkMilli  int64 // GPU milli the plugin's cache holds at the end (must equal alloc)
	wallSeconds float64
	ledger      *ledger // free GPU capacity per node and GPU at the end
	// placements are the pods in arrival order, each with the node it was bound to
	// ("-" when it did not fit): for finding where two runs part (-placements).
	placements []string
}

// ledger is the replay's own record of free GPU capacity per node, in trace units
// (milli-GPU per device). The comparison plugins score from it; the fragmentation
// metric reads it; it is checked against the plugin's cache at the end.
type ledger struct {
	free map[string][]int64 // node -> per GPU milli left
}

func (l *ledger) nodeFree(node string) int64 {
	var s int64
	for _, f := range l.free[node] {
		s += f
	}
	return s
}

// replayOnce runs one policy with one seed: shuffle the pod list, inflate it with pods
// drawn with replacement to inflation × cluster GPU capacity, schedule one pod at a
// time through a real scheduler framework built from the profile, never delete.
// task, if not nil, is told the pods placed so far (scheduled or found not to fit).
func replayOnce(ctx context.Context, cl *cluster, pol *policy, cfg *schedconfig.KubeSchedulerConfiguration, seed int64, inflation float64, parallelism, maxPods int, task *progress.Task) (*runResult, error) {
	rng := rand.New(rand.NewSource(seed))
	order := workload(cl.pods, rng, inflation, cl.totalGPU)
	if maxPods > 0 && len(order) > maxPods {
		order = order[:maxPods]
	}
	if task != nil {
		task.SetTotal(int64(len(order)))
	}

	// The node order the framework sees is shuffled per seed too: score ties are
	// broken by a seeded random pick, so the order only matters for determinism.
	nodes := append([]*v1.Node(nil), cl.nodes...)
	rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })

	snapshot := backendcache.NewSnapshot(nil, nodes)
	infos := make([]fwk.NodeInfo, len(nodes))
	for i, n := range nodes {
		ni, err := snapshot.Get(n.Name)
		if err != nil {
			return nil, err
		}
		infos[i] = ni
	}
	led := &ledger{free: make(map[string][]int64, len(nodes))}
	for _, n := range nodes {
		g := make([]int64, cl.gpus[n.Name])
		for i := range g {
			g[i] = 1000
		}
		led.free[n.Name] = g
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var w *draWorld
	if cl.mode == modeDRA {
		var err error
		if w, err = newDRAWorld(ctx, nodes); err != nil {
			return nil, err
		}
	}
	fw, pl, err := buildFramework(ctx, cfg, pol, snapshot, led, rng, parallelism, w)
	if err != nil {
		return nil, err
	}

	res := &runResult{policy: pol.name, seed: seed, podsTotal: len(order), fragAt: map[int]float64{}, failedKinds: map[string]int{}, ledger: led}
	checkpoints := []int{50, 80, 90, 100}
	var arrived, alloc int64
	feasible := make([]fwk.NodeInfo, 0, len(infos))
	ok := make([]bool, len(infos))
	for k, tp := range order {
		name := fmt.Sprintf("%s-%d", tp.name, k)
		var pod *v1.Pod
		if w != nil {
			pod = claimPod(tp, name, k)
			if tp.numGPU > 0 {
				if err := w.submit(ctx, w.draClaim(tp, name)); err != nil {
					return nil, fmt.Errorf("pod %s: %w", name, err)
				}
			}
		} else {
			pod = podObject(tp, name, k)
			if cl.memoryMiB != nil {
				askMemoryMiB(pod, tp, cl.memoryMiB)
			}
		}
		arrived += tp.demandMilli()
		node, err := scheduleOne(ctx, fw, pod, infos, ok, &feasible, rng, w != nil)
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
		}
		placed := node
		if placed == "" {
			placed = "-"
		}
		res.placements = append(res.placements, pod.Name+" "+placed)
		if node == "" {
			res.failed++
			if arrived <= cl.totalGPU {
				res.failedKinds[tp.kind()]++
			}
		} else {
			res.scheduled++
			alloc += tp.demandMilli()
			if w != nil {
				err = w.bind(snapshot, pod, node, tp, led)
			} else {
				err = bind(snapshot, pl, pod, node, tp, led)
			}
			if err != nil {
				return nil, err
			}
		}
		res.points = append(res.points, point{arrived, alloc})
		// A pod takes milliseconds; telling the bar every pod would cost more than
		// the bar is worth.
		if task != nil && (k%progressEvery == 0 || k == len(order)-1) {
			task.Set(int64(k + 1))
		}
		for len(checkpoints) > 0 && arrived*100 >= int64(checkpoints[0])*cl.totalGPU {
			res.fragAt[checkpoints[0]] = fragmentationRatio(cl, snapshot, led)
			checkpoints = checkpoints[1:]
		}
	}
	if w != nil {
		if res.checkMilli, err = w.allocatedMilli(); err != nil {
			return nil, err
		}
		if res.checkMilli != alloc {
			return nil, fmt.Errorf("the claims hold %d milli-GPUs, the bound pods asked %d", res.checkMilli, alloc)
		}
		return res, nil
	}
	res.checkMilli = cacheMilli(pl, nodes)
	if res.checkMilli != alloc {
		// The ledger is built from the cache; a mismatch means a grant differs from
		// what the trace pod asked.
		return nil, fmt.Errorf("the plugin's cache holds %d milli-GPUs, the bound pods asked %d", res.checkMilli, alloc)
	}
	return res, nil
}

// progressEvery is how many pods a run places between two progress updates.
const progressEvery = 64

// workload is the FGD protocol's pod sequence: the list sorted by name and shuffled,
// then pods drawn uniformly with replacement appended while the total GPU demand stays
// within inflation × capacity.
func workload(pods []tracePod, rng *rand.Rand, inflation float64, capacityMilli int64) []*tracePod {
	base := make([]*tracePod, len(pods))
	for i := range pods {
		base[i] = &pods[i]
	}
	sort.SliceStable(base, func(i, j int) bool { return base[i].name < base[j].name })
	order := append([]*tracePod(nil), base...)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var demand int64
	for _, p := range order {
		demand += p.demandMilli()
	}
	target := int64(inflation * float64(capacityMilli))
	for {
		p := base[rng.Intn(len(base))]
		if demand+p.demandMilli() > target {
			break
		}
		demand += p.demandMilli()
		order = append(order, p)
	}
	return order
}

// scheduleOne is one scheduling cycle as kube-scheduler runs it: PreFilter, Filter on
// every node in parallel, PreScore and Score on the feasible ones, the highest total
// score wins (ties: a seeded random pick, as the scheduler's randomizer does), then
// Reserve, and PreBind where preBind is set (DRA mode: the in-tree plugin writes the
// claim's allocation there). It returns "" when no node fits.
func scheduleOne(ctx context.Context, fw framework.Framework, pod *v1.Pod, infos []fwk.NodeInfo, ok []bool, feasible *[]fwk.NodeInfo, rng *rand.Rand, preBind bool) (string, error) {
	state := framework.NewCycleState()
	if _, st, _ := fw.RunPreFilterPlugins(ctx, state, pod); !st.IsSuccess() {
		if st.IsRejected() {
			return "", nil
		}
		return "", st.AsError()
	}
	var errs atomic.Pointer[fwk.Status]
	fw.Parallelizer().Until(ctx, len(infos), func(i int) {
		st := fw.RunFilterPlugins(ctx, state, pod, infos[i])
		ok[i] = st.IsSuccess()
		if !st.IsSuccess() && !st.IsRejected() {
			errs.Store(st)
		}
	}, "Filter")
	if st := errs.Load(); st != nil {
		return "", st.AsError()
	}
	f := (*feasible)[:0]
	for i, good := range ok {
		if good {
			f = append(f, infos[i])
		}
	}
	*feasible = f
	if len(f) == 0 {
		return "", nil
	}
	best := f[0].Node().Name
	if len(f) > 1 {
		if st := fw.RunPreScorePlugins(ctx, state, pod, f); !st.IsSuccess() {
			return "", st.AsError()
		}
		scores, st := fw.RunScorePlugins(ctx, state, pod, f)
		if !st.IsSuccess() {
			return "", st.AsError()
		}
		var top int64 = -1 << 62
		ties := 0
		for _, s := range scores {
			switch {
			case s.TotalScore > top:
				top, best, ties = s.TotalScore, s.Name, 1
			case s.TotalScore == top:
				// Reservoir sampling: each tied node is equally likely.
				ties++
				if rng.Intn(ties) == 0 {
					best = s.Name
				}
			}
		}
	}
	if st := fw.RunReservePluginsReserve(ctx, state, pod, best); !st.IsSuccess() {
		fw.RunReservePluginsUnreserve(ctx, state, pod, best)
		return "", fmt.Errorf("reserve on %s: %v", best, st.AsError())
	}
	if preBind {
		if st := fw.RunPreBindPlugins(ctx, state, pod, best); !st.IsSuccess() {
			fw.RunReservePluginsUnreserve(ctx, state, pod, best)
			return "", fmt.Errorf("prebind on %s: %v", best, st.AsError())
		}
	}
	return best, nil
}

// bind makes the pod count on its node: the snapshot's NodeInfo (CPU and memory for
// NodeResourcesFit) and the replay's ledger. The plugin's cache already holds the GPU
// grant from Reserve (Assume), as it does between Reserve and the informer's update.
func bind(snapshot *backendcache.Snapshot, pl *gpushare.Plugin, pod *v1.Pod, node string, tp *tracePod, led *ledger) error {
	if err := addToNode(snapshot, pod, node); err != nil || tp.numGPU == 0 {
		return err
	}
	usage, err := pl.Cache().NodeUsage(node)
	if err != nil {
		return err
	}
	g := led.free[node]
	for i, d := range usage {
		g[i] = 1000 - int64(d.Cores)*10
	}
	return nil
}

// addToNode binds pod to node in the snapshot: its NodeInfo counts the pod's CPU and
// memory for NodeResourcesFit.
func addToNode(snapshot *backendcache.Snapshot, pod *v1.Pod, node string) error {
	pod.Spec.NodeName = node
	ni, err := snapshot.Get(node)
	if err != nil {
		return err
	}
	ni.(*framework.NodeInfo).AddPod(pod)
	return nil
}

// cacheMilli is the GPU capacity the plugin's cache holds as granted, in milli-GPUs
// (cores are granted as share × 100, so 10 milli per percent).
func cacheMilli(pl *gpushare.Plugin, nodes []*v1.Node) int64 {
	var s int64
	for _, n := range nodes {
		usage, err := pl.Cache().NodeUsage(n.Name)
		if err != nil {
			continue
		}
		for _, d := range usage {
			s += int64(d.Cores) * 10
		}
	}
	return s
}

// buildFramework builds a scheduler framework exactly as kube-scheduler does for the
// policy's profile: the in-tree registry plus TesseraGPUShare and
// TesseraNodeResourcesFit (and, for comparison policies, the tool's own Score
// plugin), over the replay's snapshot.
// In DRA mode (w set) the framework gets w's clientset, informers and DRA manager.
func buildFramework(ctx context.Context, cfg *schedconfig.KubeSchedulerConfiguration, pol *policy, snapshot *backendcache.Snapshot, led *ledger, rng *rand.Rand, parallelism int, w *draWorld) (framework.Framework, *gpushare.Plugin, error) {
	var prof *schedconfig.KubeSchedulerProfile
	for i := range cfg.Profiles {
		if cfg.Profiles[i].SchedulerName == pol.profile {
			prof = cfg.Profiles[i].DeepCopy()
		}
	}
	if prof == nil {
		return nil, nil, fmt.Errorf("policy %s: the config has no profile %q", pol.name, pol.profile)
	}
	// Fill GPU nodes as the FGD protocol does: every node is evaluated for every pod.
	prof.PercentageOfNodesToScore = ptrInt32(100)
	for i := range prof.PluginConfig {
		pc := &prof.PluginConfig[i]
		if pc.Name != gpushare.Name {
			continue
		}
		a, err := gpushare.DecodeArgs(pc.Args, gpushare.Defaults{})
		if err != nil {
			return nil, nil, err
		}
		if pol.args != nil {
			pol.args(a)
		}
		// The trace's nodes publish their inventory once and never heartbeat: a run
		// longer than the staleness limit would find every node stale.
		a.InventoryStaleness = &metav1.Duration{}
		pc.Args = a
	}
	switch {
	case w == nil:
		// The replay has no DRA objects (and so no DRA manager); a trace pod never
		// claims a device through DRA.
		withoutDRA(prof.Plugins)
	case pol.inTreeDRA:
		if err := inTreeDRA(prof); err != nil {
			return nil, nil, err
		}
	}
	if pol.score != "" {
		prof.Plugins.Score = schedconfig.PluginSet{
			Enabled:  []schedconfig.Plugin{{Name: pol.score, Weight: 1}},
			Disabled: []schedconfig.Plugin{{Name: "*"}},
		}
	}

	var pl *gpushare.Plugin
	registry := frameworkplugins.NewInTreeRegistry()
	extra := frameworkruntime.Registry{
		gpushare.Name: func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			p, err := gpushare.New(ctx, obj, h)
			if err == nil {
				pl = p.(*gpushare.Plugin)
			}
			return p, err
		},
		noderesourcesfit.Name: noderesourcesfit.New,
		draplacement.Name:     draplacement.New,
		bestFitName: func(_ context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			return &bestFit{handle: h, ledger: led}, nil
		},
		randomName: func(_ context.Context, _ runtime.Object, _ fwk.Handle) (fwk.Plugin, error) {
			return randomScore{}, nil
		},
	}
	if err := registry.Merge(extra); err != nil {
		return nil, nil, err
	}
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	opts := []frameworkruntime.Option{}
	if w != nil {
		client, factory = w.client, w.factory
		opts = append(opts, frameworkruntime.WithSharedDRAManager(w.manager))
	}
	fw, err := frameworkruntime.NewFramework(ctx, registry, prof, append(opts,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithParallelism(parallelism),
		frameworkruntime.WithLogger(klog.FromContext(ctx)),
	)...)
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", pol.name, err)
	}
	if pl == nil {
		return nil, nil, fmt.Errorf("policy %s: profile %s does not enable %s", pol.name, pol.profile, gpushare.Name)
	}
	// The plugin's cache follows the (empty) informers; nodes reach it from the
	// snapshot, grants from Reserve.
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// The plugin's informer handlers report synced a moment after the informers: wait
	// for its PreFilter to stop saying so.
	probe := podObject(&tracePod{name: "probe", numGPU: 1, gpuMilli: 1000}, "probe", -1)
	for i := 0; ; i++ {
		_, st, _ := fw.RunPreFilterPlugins(ctx, framework.NewCycleState(), probe)
		if st.IsSuccess() || st.IsRejected() {
			break
		}
		if i == 1000 {
			return nil, nil, fmt.Errorf("policy %s: %v", pol.name, st.AsError())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fw, pl, nil
}

func ptrInt32(v int32) *int32 { return &v }

// withoutDRA removes DynamicResources and TesseraDynamicResources from every
// extension point of a profile.
func withoutDRA(p *schedconfig.Plugins) {
	for _, set := range []*schedconfig.PluginSet{&p.MultiPoint, &p.PreEnqueue, &p.QueueSort, &p.PreFilter, &p.Filter, &p.PostFilter,
		&p.PreScore, &p.Score, &p.Reserve, &p.Permit, &p.PreBind, &p.Bind, &p.PostBind} {
		kept := set.Enabled[:0]
		for _, pl := range set.Enabled {
			if pl.Name != names.DynamicResources && pl.Name != draplacement.Name {
				kept = append(kept, pl)
			}
		}
		set.Enabled = kept
	}
}

// inTreeDRA puts the in-tree DynamicResources plugin, with its default args, wherever
// a profile has TesseraDynamicResources.
func inTreeDRA(prof *schedconfig.KubeSchedulerProfile) error {
	gvk := configv1.SchemeGroupVersion.WithKind("DynamicResourcesArgs")
	args := &schedconfig.DynamicResourcesArgs{}
	if _, _, err := scheme.Codecs.UniversalDecoder().Decode([]byte("{}"), &gvk, args); err != nil {
		return err
	}
	prof.PluginConfig = append(prof.PluginConfig, schedconfig.PluginConfig{Name: names.DynamicResources, Args: args})
	p := prof.Plugins
	for _, set := range []*schedconfig.PluginSet{&p.MultiPoint, &p.PreEnqueue, &p.QueueSort, &p.PreFilter, &p.Filter, &p.PostFilter,
		&p.PreScore, &p.Score, &p.Reserve, &p.Permit, &p.PreBind, &p.Bind, &p.PostBind} {
		for i := range set.Enabled {
			if set.Enabled[i].Name == draplacement.Name {
				set.Enabled[i].Name = names.DynamicResources
			}
		}
		kept := set.Disabled[:0]
		for _, pl := range set.Disabled {
			if pl.Name != names.DynamicResources {
				kept = append(kept, pl)
			}
		}
		set.Disabled = kept
	}
	return nil
}

// loadConfig reads a KubeSchedulerConfiguration the way kube-scheduler does (with
// defaults, so every default plugin is in each profile).
func loadConfig(path string) (*schedconfig.KubeSchedulerConfiguration, error) {
	// The framework records its extension-point metrics as kube-scheduler does.
	metrics.Register()
	cfg, err := options.LoadConfigFromFile(klog.Background(), path)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", path, err)
	}
	return cfg, nil
}

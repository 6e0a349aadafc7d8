// SPDX-License-Identifier: Apache-2.0

// Command tessera-sim replays a cluster trace through the Tessera scheduler's real
// plugin code and reports placement quality (benchmark B1, docs/benchmarks.md). It follows the protocol of
// the FGD paper (USENIX ATC'23) on the Alibaba GPU trace: for each seed the pod list
// is shuffled and inflated with pods drawn with replacement until the GPU demand
// reaches 130% of the cluster's GPU capacity; pods are scheduled one at a time through
// a kube-scheduler framework built from a Tessera scheduler profile (PreFilter, Filter,
// Score, Reserve of the production plugins); failures are dropped and nothing leaves.
//
// Output (in -out): curves.csv (A(x) and U(x) per run for x = 0..130), runs.csv (one
// row per policy and seed), summary.csv and summary.md (U(100) mean ± sd, fragmentation
// ratio at 50/80/90/100% arrived load per policy), and alloc.svg (allocated GPU
// capacity against arrived load for every policy).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/internal/progress"
)

func main() {
	var (
		nodesPath  = flag.String("nodes", "../shared/data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv", "node list (openb format: sn,cpu_milli,memory_mib,gpu,model)")
		podsPath   = flag.String("pods", "../shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv", "pod list (openb format: name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...)")
		configPath = flag.String("config", "config/scheduler/tessera-scheduler.yaml", "KubeSchedulerConfiguration with the Tessera profiles")
		policyList = flag.String("policies", "bestfit,binpack,fragmentation", "comma-separated policies: "+policyNames())
		seedList   = flag.String("seeds", "42-51", "seeds: a list (42,43) or a range (42-51)")
		inflation  = flag.Float64("inflation", 1.3, "GPU demand of the workload as a multiple of cluster GPU capacity")
		outDir     = flag.String("out", "_output/b1", "directory for the result files")
		jobs       = flag.Int("jobs", runtime.GOMAXPROCS(0), "runs (policy × seed) executed at once")
		maxPods    = flag.Int("max-pods", 0, "stop each run after this many pods (0: the whole workload); for quick checks")
		progMode   = flag.String("progress", "auto", "progress on stderr: bars (one per running run), lines (one line per running run every -progress-interval), off; auto: bars on a terminal, else lines")
		progEvery  = flag.Duration("progress-interval", 30*time.Second, "how often lines mode reports")
		workload   = flag.String("workload", "default", "workload variety built from -pods, as the FGD paper's: default, gpuspecNN, multigpuNN, gpushareNN, cpuNNN (see docs/simulator.md)")
		wlSeed     = flag.Int64("workload-seed", 1, "seed of the -workload transformation (one variety for all -seeds)")
		wlOut      = flag.String("workload-out", "", "also write the workload's pod list to this CSV file")
		gpuMode    = flag.String("mode", modeDevicePlugin, "how pods ask for GPUs: device-plugin (extended resources) or dra (ResourceClaims; policies binpack, spread, fragmentation and first-fit)")
		gpuMemory  = flag.String("gpu-memory", memoryPercent, "device-plugin mode: how a share asks GPU memory: percent (gpu-memory-percent = its share of whichever GPU it lands on) or mib "+
			"(gpu-memory in MiB, its share of the smallest GPU model it accepts: what a ResourceClaim asks in dra mode, which has no percentage; to compare the two modes with the same requests)")
		cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the whole invocation to this file (go tool pprof)")
		placeDir   = flag.String("placements", "", "also write each run's placements (a line per pod in arrival order: the pod and its node, - when it did not fit) to DIR/<policy>-<seed>.txt, to find where two runs (two modes, two versions) part")
	)
	klog.InitFlags(nil)
	flag.Parse()
	mode, err := progress.ParseMode(*progMode)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tessera-sim: -progress:", err)
		os.Exit(2)
	}
	prog := progressOptions{mode: mode, interval: *progEvery}
	wl, err := parseVariety(*workload)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tessera-sim: -workload:", err)
		os.Exit(2)
	}
	wo := workloadOptions{variety: wl, seed: *wlSeed, out: *wlOut, mode: *gpuMode, memoryMiB: *gpuMemory == memoryMiB}
	if *gpuMode != modeDevicePlugin && *gpuMode != modeDRA {
		fmt.Fprintf(os.Stderr, "tessera-sim: -mode: %q is neither %s nor %s\n", *gpuMode, modeDevicePlugin, modeDRA)
		os.Exit(2)
	}
	if *gpuMemory != memoryPercent && *gpuMemory != memoryMiB {
		fmt.Fprintf(os.Stderr, "tessera-sim: -gpu-memory: %q is neither %s nor %s\n", *gpuMemory, memoryPercent, memoryMiB)
		os.Exit(2)
	}
	if wo.memoryMiB && *gpuMode == modeDRA {
		fmt.Fprintf(os.Stderr, "tessera-sim: -gpu-memory %s is for device-plugin mode: claims always ask memory in MiB\n", memoryMiB)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "tessera-sim: -cpuprofile:", err)
			os.Exit(2)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if err := run(*nodesPath, *podsPath, *configPath, *policyList, *seedList, *inflation, *outDir, *placeDir, *jobs, *maxPods, prog, wo); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-sim:", err)
		os.Exit(1)
	}
}

// newCluster is the replay's input for a node list, a pod list and a mode.
func newCluster(tn []traceNode, tp []tracePod, mode string) (*cluster, error) {
	cl := &cluster{mode: mode, gpus: map[string]int{}, pods: tp, shapes: workloadShapes(tp)}
	for i := range tn {
		n, err := nodeObject(&tn[i])
		if err != nil {
			return nil, err
		}
		cl.nodes = append(cl.nodes, n)
		cl.gpus[n.Name] = tn[i].gpus
		cl.totalGPU += int64(tn[i].gpus) * 1000
	}
	if cl.totalGPU == 0 {
		return nil, fmt.Errorf("the cluster has no GPUs")
	}
	if mode == modeDRA {
		var err error
		if cl.nodes, err = markDRA(cl.nodes); err != nil {
			return nil, err
		}
	}
	return cl, nil
}

// workloadOptions says which variety of the pod list is replayed.
type workloadOptions struct {
	variety variety
	seed    int64
	out     string // write the variety's pod list here too, if set
	mode    string // modeDevicePlugin or modeDRA
	// memoryMiB: device-plugin shares ask gpu-memory in MiB as claims do (-gpu-memory mib).
	memoryMiB bool
}

// The values of -gpu-memory.
const (
	memoryPercent = "percent"
	memoryMiB     = "mib"
)

// loadWorkload reads the pod list and builds the variety from it.
func loadWorkload(podsPath string, nodes []traceNode, wo workloadOptions) ([]tracePod, error) {
	rows, err := readCSV(podsPath)
	if err != nil {
		return nil, err
	}
	if rows, err = applyVariety(rows, nodes, wo.variety, wo.seed); err != nil {
		return nil, err
	}
	if wo.out != "" {
		if err := writePodCSV(wo.out, rows); err != nil {
			return nil, err
		}
	}
	name := podsPath
	if wo.variety.kind != "default" {
		name = fmt.Sprintf("%s (workload %s)", podsPath, wo.variety.name)
	}
	return parsePods(rows, name)
}

// progressOptions says how the runs' progress is shown on stderr.
type progressOptions struct {
	mode     progress.Mode
	interval time.Duration
}

func policyNames() string {
	var n []string
	for _, p := range policies {
		n = append(n, p.name)
	}
	return strings.Join(n, ", ")
}

func parseSeeds(s string) ([]int64, error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err1 := strconv.ParseInt(a, 10, 64)
		hi, err2 := strconv.ParseInt(b, 10, 64)
		if err1 != nil || err2 != nil || hi < lo {
			return nil, fmt.Errorf("bad seed range %q", s)
		}
		var out []int64
		for x := lo; x <= hi; x++ {
			out = append(out, x)
		}
		return out, nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		x, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q", f)
		}
		out = append(out, x)
	}
	return out, nil
}

func run(nodesPath, podsPath, configPath, policyList, seedList string, inflation float64, outDir, placeDir string, jobs, maxPods int, prog progressOptions, wo workloadOptions) error {
	seeds, err := parseSeeds(seedList)
	if err != nil {
		return err
	}
	var pols []*policy
	for _, name := range strings.Split(policyList, ",") {
		p, err := findPolicy(strings.TrimSpace(name))
		if err != nil {
			return fmt.Errorf("%w; known: %s", err, policyNames())
		}
		if !p.appliesTo(wo.mode) {
			return fmt.Errorf("policy %s does not apply in %s mode", p.name, wo.mode)
		}
		pols = append(pols, p)
	}
	cfg, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	tn, err := readNodes(nodesPath)
	if err != nil {
		return err
	}
	tp, err := loadWorkload(podsPath, tn, wo)
	if err != nil {
		return err
	}
	cl, err := newCluster(tn, tp, wo.mode)
	if err != nil {
		return fmt.Errorf("%s: %w", nodesPath, err)
	}
	if wo.memoryMiB {
		t, err := newMemoryTable(cl.nodes)
		if err != nil {
			return fmt.Errorf("%s: %w", nodesPath, err)
		}
		cl.memoryMiB = &t
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	memNote := ""
	if wo.memoryMiB {
		memNote = " (shares ask gpu-memory in MiB, as claims do)"
	}
	fmt.Printf("cluster: %d nodes, %d GPUs; workload: %d pods (%s, %s); mode: %s%s; policies: %s; seeds: %s; inflation %.2f\n",
		len(cl.nodes), cl.totalGPU/1000, len(tp), filepath.Base(podsPath), wo.variety.name, cl.mode, memNote, policyList, seedList, inflation)

	type job struct {
		pol  *policy
		seed int64
	}
	var work []job
	for _, p := range pols {
		for _, s := range seeds {
			work = append(work, job{p, s})
		}
	}
	results := make([]*runResult, len(work))
	errs := make([]error, len(work))
	if jobs < 1 {
		jobs = 1
	}
	// Runs go side by side; each runs its Filter on one goroutine so that the cores
	// are not oversubscribed.
	parallelism := 1
	if jobs == 1 {
		parallelism = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ctx := klog.NewContext(context.Background(), klog.Background())
	// Progress goes to stderr, the results to stdout; while bars are drawn on the
	// terminal stdout also is, the result lines are printed above the bars, and a
	// finished run's line replaces its bar.
	rep := progress.New(os.Stderr, prog.mode, prog.interval, progress.RemoveDone())
	stdout := rep.Writer(os.Stdout)
	// klog's lines (a framework being built) would tear the bars just as well.
	if w := rep.Writer(os.Stderr); w != io.Writer(os.Stderr) {
		klog.LogToStderr(false)
		klog.SetOutput(w)
	}
	for i, w := range work {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			start := time.Now()
			task := rep.Add(fmt.Sprintf("%s seed %d", w.pol.name, w.seed), 0)
			r, err := replayOnce(ctx, cl, w.pol, cfg, w.seed, inflation, parallelism, maxPods, task)
			task.Done(err == nil)
			if err != nil {
				errs[i] = fmt.Errorf("%s seed %d: %w", w.pol.name, w.seed, err)
				return
			}
			r.wallSeconds = time.Since(start).Seconds()
			results[i] = r
			u := curve(r.points, cl.totalGPU, 130)
			mu.Lock()
			fmt.Fprintf(stdout, "%-14s seed %d: U(100) = %5.2f%%  scheduled %d/%d  %.0fs  failed up to 100%%: %v\n", w.pol.name, w.seed, 100-u[100], r.scheduled, r.podsTotal, r.wallSeconds, r.failedKinds)
			mu.Unlock()
		}()
	}
	wg.Wait()
	rep.Wait()
	klog.LogToStderr(true)
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	var pks []packing
	for _, seed := range seeds {
		order := workload(cl.pods, rand.New(rand.NewSource(seed)), inflation, cl.totalGPU)
		pks = append(pks, packFractions(order, cl.totalGPU))
	}
	if placeDir != "" {
		if err := writePlacements(placeDir, results); err != nil {
			return err
		}
	}
	return writeReport(outDir, cl, pols, results, packingReport(seeds, pks, cl.totalGPU), wo.variety.name)
}

// writePlacements writes each run's placements to dir/<policy>-<seed>.txt.
func writePlacements(dir string, results []*runResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range results {
		name := filepath.Join(dir, fmt.Sprintf("%s-%d.txt", r.policy, r.seed))
		if err := os.WriteFile(name, []byte(strings.Join(r.placements, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

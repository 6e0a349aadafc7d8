// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake nvidia-cuda-mps-control, chosen by
// fakeEnv: "-f" runs the daemon in the foreground, no argument reads control
// commands from stdin like the real client, and "server" is an MPS server (a process
// that only waits to be killed). The daemon keeps its state in the pipe directory,
// where the client reads it and where a test steers it:
//
//	fake-state    written by the daemon: "server <pid>" per live server
//	fake-clients  written by a test: client PIDs of every server; while it is not
//	              empty and no server lives, the daemon starts one (as the real daemon
//	              does when a client connects)
//	fake-crash    the daemon exits with status 3, leaving its pid file behind
//	fake-hang     the client never answers
const fakeEnv = "TESSERA_FAKE_MPS_CONTROL"

// agentEnv makes the test binary an agent of the real-GPU tests (gpu_test.go): a
// supervisor of kept daemons until it is killed.
const agentEnv = "TESSERA_MPS_TEST_AGENT"

var agentMain func() int

// self is the test binary, as an absolute path (Config wants one; the binary may be
// started as ./mps.test).
var self = func() string {
	p, err := os.Executable()
	if err != nil {
		p = os.Args[0]
	}
	return p
}()

func TestMain(m *testing.M) {
	RunExecHelper()
	if agentMain != nil && os.Getenv(agentEnv) != "" {
		os.Exit(agentMain())
	}
	switch os.Getenv(fakeEnv) {
	case "":
		os.Exit(m.Run())
	case "server":
		select {}
	default:
		if len(os.Args) > 1 && os.Args[1] == "-f" {
			os.Exit(fakeDaemon())
		}
		os.Exit(fakeClient())
	}
}

func fakeDaemon() int {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	logDir := os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" || logDir == "" || !strings.HasPrefix(os.Getenv("CUDA_VISIBLE_DEVICES"), "GPU-") {
		fmt.Fprintln(os.Stderr, "fake daemon: pipe, log directory and CUDA_VISIBLE_DEVICES must be set")
		return 2
	}
	pidFile := filepath.Join(pipe, PidFile)
	if b, err := os.ReadFile(pidFile); err == nil {
		if p, _ := strconv.Atoi(strings.TrimSpace(string(b))); p > 0 && syscall.Kill(p, 0) == nil {
			fmt.Fprintln(os.Stderr, "An instance of this daemon is already running")
			return 1
		}
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return 1
	}
	if os.Getenv("TESSERA_FAKE_MPS_SHM_MARK") != "" {
		// Where the daemon's /dev/shm is, for the exec helper's test.
		mark := fmt.Sprintf("/dev/shm/tessera-fake-mps-%d", os.Getpid())
		if err := os.WriteFile(mark, nil, 0o644); err != nil {
			return 1
		}
		defer os.Remove(mark)
	}
	logf := func(format string, a ...any) {
		f, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			fmt.Fprintf(f, format+"\n", a...)
			f.Close()
		}
	}
	var mu sync.Mutex
	servers := map[int]*exec.Cmd{}
	stopServers := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range servers {
			_ = c.Process.Kill()
		}
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	for {
		select {
		case <-term:
			stopServers()
			os.Remove(pidFile)
			logf("quit")
			return 0
		case <-time.After(10 * time.Millisecond):
		}
		if _, err := os.Stat(filepath.Join(pipe, "fake-crash")); err == nil {
			// Like a daemon killed outright: its servers stay behind.
			logf("crash")
			return 3
		}
		clients, _ := os.ReadFile(filepath.Join(pipe, "fake-clients"))
		mu.Lock()
		if len(servers) == 0 && len(strings.TrimSpace(string(clients))) > 0 {
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), fakeEnv+"=server")
			if err := c.Start(); err == nil {
				servers[c.Process.Pid] = c
				logf("server %d started", c.Process.Pid)
				go func() {
					_ = c.Wait()
					mu.Lock()
					delete(servers, c.Process.Pid)
					mu.Unlock()
					logf("server %d exited", c.Process.Pid)
				}()
			}
		}
		var b strings.Builder
		for p := range servers {
			fmt.Fprintf(&b, "server %d\n", p)
		}
		mu.Unlock()
		tmp := filepath.Join(pipe, ".fake-state.tmp")
		if os.WriteFile(tmp, []byte(b.String()), 0o644) == nil {
			_ = os.Rename(tmp, filepath.Join(pipe, "fake-state"))
		}
	}
}

func fakeClient() int {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	b, err := os.ReadFile(filepath.Join(pipe, PidFile))
	p, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 || syscall.Kill(p, 0) != nil {
		fmt.Println("Cannot find MPS control daemon process")
		return 1
	}
	if _, err := os.Stat(filepath.Join(pipe, "fake-hang")); err == nil {
		select {}
	}
	state, _ := os.ReadFile(filepath.Join(pipe, "fake-state"))
	var servers []string
	for _, l := range strings.Split(string(state), "\n") {
		if s, ok := strings.CutPrefix(l, "server "); ok {
			servers = append(servers, s)
		}
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "get_server_list":
			for _, s := range servers {
				fmt.Println(s)
			}
		case len(f) == 2 && f[0] == "get_client_list":
			found := false
			for _, s := range servers {
				found = found || s == f[1]
			}
			if !found {
				fmt.Printf("Server %s not found\n", f[1])
				continue
			}
			clients, _ := os.ReadFile(filepath.Join(pipe, "fake-clients"))
			fmt.Print(string(clients))
		case len(f) == 1 && f[0] == "quit":
			_ = syscall.Kill(p, syscall.SIGTERM)
		default:
			fmt.Printf("Unknown command %q\n", sc.Text())
		}
	}
	return 0
}

package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// clkTck is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; it
// is 100 on every Linux ABI Go supports.
const clkTck = 100

// cpuTime is the user+system CPU time the process pid has used so far,
// from /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// rssKB is the VmRSS of the process pid in kB.
func rssKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			if f := strings.Fields(line); len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// rssSampler samples the VmRSS of a process every 100 ms and keeps the
// peak since the last reset.
type rssSampler struct {
	pid     int
	peak    atomic.Int64
	samples atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kb, err := rssKB(pid); err == nil {
				s.samples.Add(1)
				for {
					p := s.peak.Load()
					if kb <= p || s.peak.CompareAndSwap(p, kb) {
						break
					}
				}
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// reset starts a new peak from the current RSS.
func (s *rssSampler) reset() {
	kb, _ := rssKB(s.pid)
	s.peak.Store(kb)
}

func (s *rssSampler) peakKB() int64 { return s.peak.Load() }

func (s *rssSampler) close() {
	close(s.stop)
	<-s.done
}

// Children: every process the bench starts is registered here and killed
// when the bench exits, is interrupted or dies (Pdeathsig).

var children struct {
	mu   sync.Mutex
	cmds map[*exec.Cmd]struct{}
}

// startChild starts cmd, killed with SIGKILL if the bench dies first.
func startChild(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	children.mu.Lock()
	defer children.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	if children.cmds == nil {
		children.cmds = map[*exec.Cmd]struct{}{}
	}
	children.cmds[cmd] = struct{}{}
	return nil
}

// forgetChild is called once cmd has been waited for.
func forgetChild(cmd *exec.Cmd) {
	children.mu.Lock()
	defer children.mu.Unlock()
	delete(children.cmds, cmd)
}

// killChildren kills every child still registered.
func killChildren() {
	children.mu.Lock()
	defer children.mu.Unlock()
	for cmd := range children.cmds {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	}
}

// tmpDir is the run's temporary directory, removed on interrupt.
var tmpDir atomic.Pointer[string]

// killChildrenOnSignal kills the children and exits on SIGINT or SIGTERM.
func killChildrenOnSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-ch
		fmt.Fprintf(os.Stderr, "edged-bench: %v: killing the processes it started\n", sig)
		killChildren()
		if d := tmpDir.Load(); d != nil && !*keep {
			os.RemoveAll(*d)
		}
		os.Exit(130)
	}()
}

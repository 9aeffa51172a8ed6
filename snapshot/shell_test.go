package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// shell plays the coordinating actor and the tasks around a Coordinator and
// a Store, the way the runtime will: it carries out every action and feeds
// the results back.
type shell struct {
	t        *testing.T
	c        *Coordinator
	s        *Store
	tasks    []TaskID
	now      time.Time
	notified []ID
	aborted  []ID
	failed   bool
	ackNone  bool // tasks do not acknowledge (to leave checkpoints pending)
}

func (sh *shell) run(acts []Action) {
	sh.t.Helper()
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a := a.(type) {
		case Trigger:
			if _, err := sh.s.Begin(a); err != nil {
				sh.t.Fatal(err)
			}
			if sh.ackNone {
				continue
			}
			for _, task := range sh.tasks {
				w, err := sh.s.Create(a.Checkpoint, task.Vertex, task.Subtask)
				if err != nil {
					sh.t.Fatal(err)
				}
				fmt.Fprintf(w, "state of %s at %d", task, a.Checkpoint)
				h, err := w.Finish()
				if err != nil {
					sh.t.Fatal(err)
				}
				h.Sources = []byte(fmt.Sprint(a.Checkpoint))
				acts = append(acts, sh.c.Step(sh.now, Ack{Checkpoint: a.Checkpoint, Task: task,
					State: TaskState{Operators: map[string]Handle{task.Vertex: h}}})...)
			}
		case Complete:
			path, err := sh.s.Commit(a.Metadata)
			acts = append(acts, sh.c.Step(sh.now, Persisted{Checkpoint: a.Checkpoint, Path: path, Err: err})...)
		case NotifyComplete:
			sh.notified = append(sh.notified, a.Checkpoint)
		case Abort:
			sh.aborted = append(sh.aborted, a.Checkpoint)
		case Discard:
			if err := sh.s.Discard(a.Checkpoint); err != nil {
				sh.t.Fatal(err)
			}
		case FailJob:
			sh.failed = true
		}
	}
}

func (sh *shell) tick(d time.Duration) {
	sh.t.Helper()
	sh.now = sh.now.Add(d)
	sh.run(sh.c.Tick(sh.now))
}

func chkDirs(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.Dir(), "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func TestCoordinatorWithStore(t *testing.T) {
	s, _ := openTestStore(t, "sensors")
	cfg := DefaultConfig()
	cfg.Interval, cfg.Dir, cfg.Retain = 10*time.Second, s.Dir(), 2
	tasks := []TaskID{{"src", 0}, {"agg", 0}, {"agg", 1}}
	c, err := NewCoordinator(cfg, tasks, tasks[:1])
	if err != nil {
		t.Fatal(err)
	}
	sh := &shell{t: t, c: c, s: s, tasks: tasks, now: time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)}
	sh.tick(0)
	for range 5 {
		sh.tick(10 * time.Second)
	}
	if fmt.Sprint(sh.notified) != "[1 2 3 4 5]" {
		t.Fatalf("notified %v", sh.notified)
	}
	if got := chkDirs(t, s); fmt.Sprint(got) != "[chk-4 chk-5]" {
		t.Fatalf("checkpoint dirs %v, want chk-4 chk-5", got)
	}
	sh.run(c.Step(sh.now, TriggerSavepoint{}))
	md, err := s.Latest()
	if err != nil || md.Checkpoint != 5 {
		t.Fatalf("Latest = %v, %v", md, err)
	}
	if o, _ := md.Operator("agg"); o.Parallelism != 2 || string(o.Subtasks[1].Sources) != "5" {
		t.Fatalf("agg in metadata: %+v", o)
	}
	b, err := os.ReadFile(md.FilePath(md.Operators[0].Subtasks[1]))
	if err != nil || string(b) != "state of agg[1] at 5" {
		t.Fatalf("state file: %q, %v", b, err)
	}
	if rp, err := s.RecoveryPoint(false); err != nil || rp.Checkpoint != 6 || rp.Kind != KindSavepoint {
		t.Fatalf("RecoveryPoint(false) = %v, %v", rp, err)
	}

	// The device dies during checkpoint 7: Begun, never committed.
	sh.ackNone = true
	sh.tick(10 * time.Second)
	if got := chkDirs(t, s); fmt.Sprint(got) != "[chk-4 chk-5 chk-7]" {
		t.Fatalf("checkpoint dirs %v", got)
	}

	// After the restart, a new store and coordinator pick up from disk.
	s2, err := OpenStore(s.Dir(), "sensors", 128, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s2.Progress()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := NewCoordinator(cfg, tasks, tasks[:1])
	if err != nil {
		t.Fatal(err)
	}
	sh2 := &shell{t: t, c: c2, s: s2, tasks: tasks, now: sh.now.Add(time.Minute)}
	acts, err := c2.Recover(p)
	if err != nil {
		t.Fatal(err)
	}
	sh2.run(acts)
	if got := chkDirs(t, s2); fmt.Sprint(got) != "[chk-4 chk-5]" {
		t.Fatalf("checkpoint dirs after Recover %v", got)
	}
	sh2.tick(0)
	sh2.tick(10 * time.Second)
	if fmt.Sprint(sh2.notified) != "[8]" {
		t.Fatalf("after the restart notified %v, want [8]", sh2.notified)
	}
	if got := chkDirs(t, s2); fmt.Sprint(got) != "[chk-5 chk-8]" {
		t.Fatalf("checkpoint dirs %v", got)
	}
	if _, err := Load(filepath.Join(s.Dir(), "savepoints", fmt.Sprintf("sp-6-%d", sh.now.Add(-10*time.Second).UnixMilli()))); err != nil {
		t.Fatalf("savepoint 6: %v", err)
	}
}

package snapshot

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/script"
)

// TestCoordinatorScripts runs testdata/coordinator/*.txt. Commands (times
// are offsets from the Unix epoch, so a trigger at t=30s has ts=30000; t
// defaults to the previous command's time and may not go back):
//
//	new tasks=src:1,map:2 sources=src [interval= timeout= max-concurrent=
//	    min-pause= tolerable= retain= mode=] [persist=manual] [metadata=true]
//	tick t=
//	ack id= task=map[0] [t= size= align= ops=a,b]   (ops default: the vertex)
//	ack-all id= [t= size= align=]                   (every task not yet acked)
//	decline id= task= [t= reason=]
//	savepoint [t= path= stop=true]
//	persist id= [t= err=]                           (with persist=manual)
//	task-failed task= [t= reason=]
//	output-held task= [t=]                          (OutputHeld)
//	recover [next= completed=1,2 incomplete=3]
//	hold | resume                                   (Coordinator.Hold)
//	next | history | progress
//
// Unless persist=manual, every Complete is answered at once with a
// successful Persisted, whose actions follow the complete line.
//
// The scripts are run by internal/script; go test ./snapshot/ -run Script
// -update rewrites their expected output with what the coordinator does.
func TestCoordinatorScripts(t *testing.T) {
	script.Run(t, "testdata/coordinator", func(*testing.T) func(*script.Command) (string, error) {
		h := &coordHarness{}
		return h.handle
	})
}

type coordHarness struct {
	c        *Coordinator
	tasks    []TaskID
	now      time.Duration
	manual   bool
	metadata bool
}

var epoch = time.UnixMilli(0).UTC()

func (h *coordHarness) handle(cmd *script.Command) (string, error) {
	if cmd.Name == "new" {
		return h.create(cmd)
	}
	if h.c == nil {
		return "", errors.New("no coordinator: start with new")
	}
	if cmd.Has("t") {
		d, err := cmd.Duration("t")
		if err != nil {
			return "", err
		}
		if d < h.now {
			return "", fmt.Errorf("t=%s goes back from %s", d, h.now)
		}
		h.now = d
	}
	now := epoch.Add(h.now)
	switch cmd.Name {
	case "tick":
		return h.print(now, h.c.Tick(now)), nil
	case "hold":
		h.c.Hold(true)
		return "", nil
	case "resume":
		h.c.Hold(false)
		return "", nil
	case "ack":
		task, err := parseTask(cmd.StringOr("task", ""))
		if err != nil {
			return "", err
		}
		in, err := h.ack(cmd, task)
		if err != nil {
			return "", err
		}
		return h.print(now, h.c.Step(now, in)), nil
	case "ack-all":
		id, err := cmd.IntOr("id", 0)
		if err != nil {
			return "", err
		}
		var out []string
		for _, task := range h.tasks {
			in, err := h.ack(cmd, task)
			if err != nil {
				return "", err
			}
			in.Checkpoint = ID(id)
			if s := h.print(now, h.c.Step(now, in)); s != "" {
				out = append(out, s)
			}
		}
		return strings.Join(out, "\n"), nil
	case "decline":
		id, err := cmd.IntOr("id", 0)
		if err != nil {
			return "", err
		}
		task, err := parseTask(cmd.StringOr("task", ""))
		if err != nil {
			return "", err
		}
		reason := errors.New(cmd.StringOr("reason", "no space left on device"))
		return h.print(now, h.c.Step(now, Decline{Checkpoint: ID(id), Task: task, Reason: reason})), nil
	case "savepoint":
		stop, err := cmd.BoolOr("stop", false)
		if err != nil {
			return "", err
		}
		return h.print(now, h.c.Step(now, TriggerSavepoint{Path: cmd.StringOr("path", ""), Stop: stop})), nil
	case "end-of-data":
		return h.print(now, h.c.Step(now, EndOfData{})), nil
	case "persist":
		id, err := cmd.IntOr("id", 0)
		if err != nil {
			return "", err
		}
		in := Persisted{Checkpoint: ID(id), Path: fmt.Sprintf("/data/chk-%d", id)}
		if e, ok := cmd.Lookup("err"); ok {
			in = Persisted{Checkpoint: ID(id), Err: errors.New(e)}
		}
		return h.print(now, h.c.Step(now, in)), nil
	case "task-failed":
		task, err := parseTask(cmd.StringOr("task", ""))
		if err != nil {
			return "", err
		}
		in := TaskFailed{Task: task, Err: errors.New(cmd.StringOr("reason", "panic"))}
		return h.print(now, h.c.Step(now, in)), nil
	case "output-held":
		task, err := parseTask(cmd.StringOr("task", ""))
		if err != nil {
			return "", err
		}
		return h.print(now, h.c.Step(now, OutputHeld{Task: task})), nil
	case "recover":
		var p Progress
		n, err := cmd.IntOr("next", 0)
		if err != nil {
			return "", err
		}
		p.NextID = ID(n)
		if p.Completed, err = parseIDs(cmd.StringOr("completed", "")); err != nil {
			return "", err
		}
		if p.Incomplete, err = parseIDs(cmd.StringOr("incomplete", "")); err != nil {
			return "", err
		}
		acts, err := h.c.Recover(p)
		if err != nil {
			return "error: " + err.Error(), nil
		}
		return h.print(now, acts), nil
	case "next":
		at, ok := h.c.Next()
		if !ok {
			return "none", nil
		}
		return "t=" + at.Sub(epoch).String(), nil
	case "history":
		var out []string
		for _, s := range h.c.History() {
			out = append(out, fmtStats(s))
		}
		return strings.Join(out, "\n"), nil
	case "progress":
		p := h.c.Progress()
		return fmt.Sprintf("next=%d completed=%v history=%d", p.NextID, p.Completed, len(p.History)), nil
	}
	return "", fmt.Errorf("unknown command %q", cmd.Name)
}

func (h *coordHarness) create(cmd *script.Command) (string, error) {
	cfg := DefaultConfig()
	cfg.Dir = "/data"
	var err error
	must := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	cfg.Interval, e = cmd.DurationOr("interval", 0)
	must(e)
	cfg.Timeout, e = cmd.DurationOr("timeout", cfg.Timeout)
	must(e)
	cfg.MinPause, e = cmd.DurationOr("min-pause", 0)
	must(e)
	cfg.MaxConcurrent, e = cmd.IntOr("max-concurrent", cfg.MaxConcurrent)
	must(e)
	cfg.TolerableFailures, e = cmd.IntOr("tolerable", cfg.TolerableFailures)
	must(e)
	cfg.Retain, e = cmd.IntOr("retain", cfg.Retain)
	must(e)
	if m, ok := cmd.Lookup("mode"); ok {
		must(cfg.Mode.UnmarshalText([]byte(m)))
	}
	h.manual = cmd.StringOr("persist", "auto") == "manual"
	h.metadata, e = cmd.BoolOr("metadata", false)
	must(e)
	if err != nil {
		return "", err
	}
	h.tasks = nil
	for _, spec := range strings.Split(cmd.StringOr("tasks", ""), ",") {
		v, p, _ := strings.Cut(spec, ":")
		n, err := strconv.Atoi(p)
		if err != nil {
			return "", fmt.Errorf("tasks: %q is not vertex:parallelism", spec)
		}
		for i := range n {
			h.tasks = append(h.tasks, TaskID{Vertex: v, Subtask: i})
		}
	}
	var sources []TaskID
	for _, v := range strings.Split(cmd.StringOr("sources", ""), ",") {
		for _, t := range h.tasks {
			if t.Vertex == v {
				sources = append(sources, t)
			}
		}
	}
	h.now = 0
	h.c, err = NewCoordinator(cfg, h.tasks, sources)
	if err != nil {
		h.c = nil
		return "error: " + err.Error(), nil
	}
	return "ok", nil
}

// ack reads the arguments of an ack, for task.
func (h *coordHarness) ack(cmd *script.Command, task TaskID) (Ack, error) {
	id, err := cmd.IntOr("id", 0)
	if err != nil {
		return Ack{}, err
	}
	size, err := cmd.IntOr("size", 100)
	if err != nil {
		return Ack{}, err
	}
	align, err := cmd.DurationOr("align", 0)
	if err != nil {
		return Ack{}, err
	}
	ops := []string{task.Vertex}
	if o, ok := cmd.Lookup("ops"); ok {
		ops = nil
		if o != "" {
			ops = strings.Split(o, ",")
		}
	}
	st := TaskState{Operators: map[string]Handle{}}
	for _, op := range ops {
		h := Handle{}
		if size > 0 {
			h = Handle{File: fmt.Sprintf("%s.%d.state", op, task.Subtask), Size: int64(size), Checksum: uint32(size)}
		}
		st.Operators[op] = h
	}
	return Ack{Checkpoint: ID(id), Task: task, State: st, AlignmentTime: align}, nil
}

// print formats actions one per line, answering Completes with Persisted
// unless persistence is manual.
func (h *coordHarness) print(now time.Time, acts []Action) string {
	var b strings.Builder
	for _, a := range acts {
		switch a := a.(type) {
		case Trigger:
			fmt.Fprintf(&b, "trigger %d ts=%d mode=%s", a.Checkpoint, a.Timestamp, a.Mode)
			if a.Savepoint {
				b.WriteString(" savepoint")
			}
			if a.Stop {
				b.WriteString(" stop")
			}
			if a.Path != "" {
				b.WriteString(" path=" + a.Path)
			}
			if a.Final {
				b.WriteString(" final")
			}
		case Complete:
			md := a.Metadata
			fmt.Fprintf(&b, "complete %d %s size=%d ops=", a.Checkpoint, md.Kind, md.Size())
			for i, o := range md.Operators {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, "%s/%d", o.UID, o.Parallelism)
			}
			if a.Stop {
				b.WriteString(" stop")
			}
			if md.Finished {
				b.WriteString(" finished")
			}
			if h.metadata {
				for _, o := range md.Operators {
					for i, hd := range o.Subtasks {
						fmt.Fprintf(&b, "\n  %s[%d] file=%q size=%d", o.UID, i, hd.File, hd.Size)
					}
				}
			}
			if !h.manual {
				path := fmt.Sprintf("/data/chk-%d", a.Checkpoint)
				if a.Savepoint {
					path = fmt.Sprintf("/data/sp-%d", a.Checkpoint)
				}
				if more := h.print(now, h.c.Step(now, Persisted{Checkpoint: a.Checkpoint, Path: path})); more != "" {
					b.WriteString("\n" + more)
				}
			}
		case NotifyComplete:
			fmt.Fprintf(&b, "notify %d", a.Checkpoint)
			if a.Stop {
				b.WriteString(" stop")
			}
			if a.Final {
				b.WriteString(" final")
			}
		case Abort:
			kind := ""
			if a.Savepoint {
				kind = "savepoint "
			}
			fmt.Fprintf(&b, "abort %s%d: %v", kind, a.Checkpoint, a.Reason)
		case Discard:
			fmt.Fprintf(&b, "discard %d", a.Checkpoint)
		case FailJob:
			fmt.Fprintf(&b, "fail-job: %v", a.Reason)
		default:
			fmt.Fprintf(&b, "unknown action %T", a)
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func fmtStats(s Stats) string {
	line := fmt.Sprintf("%d %s %s t=%s", s.Checkpoint, s.Kind, s.Status, s.Triggered.Sub(epoch))
	if s.Stop {
		line += " stop"
	}
	if s.Status != InProgress {
		line += " took=" + s.Duration.String()
	}
	line += fmt.Sprintf(" acked=%d/%d size=%d align=%s", s.Acked, s.Tasks, s.Size, s.Alignment)
	if s.Path != "" {
		line += " path=" + s.Path
	}
	if s.Err != nil {
		line += " err=" + s.Err.Error()
	}
	return line
}

// parseTask reads "vertex[subtask]".
func parseTask(s string) (TaskID, error) {
	v, rest, ok := strings.Cut(s, "[")
	n, err := strconv.Atoi(strings.TrimSuffix(rest, "]"))
	if !ok || err != nil || !strings.HasSuffix(rest, "]") {
		return TaskID{}, fmt.Errorf("task %q is not vertex[subtask]", s)
	}
	return TaskID{Vertex: v, Subtask: n}, nil
}

func parseIDs(s string) ([]ID, error) {
	if s == "" {
		return nil, nil
	}
	var out []ID
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, ID(n))
	}
	return out, nil
}

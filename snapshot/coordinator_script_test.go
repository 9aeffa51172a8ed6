package snapshot

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
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
//	recover [next= completed=1,2 incomplete=3]
//	next | history | progress
//
// Unless persist=manual, every Complete is answered at once with a
// successful Persisted, whose actions follow the complete line.
func TestCoordinatorScripts(t *testing.T) {
	runScripts(t, "coordinator", func(t *testing.T) func(*command) (string, error) {
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

func (h *coordHarness) handle(cmd *command) (string, error) {
	if cmd.name == "new" {
		return h.create(cmd)
	}
	if h.c == nil {
		return "", errors.New("no coordinator: start with new")
	}
	if _, ok := cmd.args["t"]; ok {
		d, err := cmd.duration("t", 0)
		if err != nil {
			return "", err
		}
		if d < h.now {
			return "", fmt.Errorf("t=%s goes back from %s", d, h.now)
		}
		h.now = d
	}
	now := epoch.Add(h.now)
	switch cmd.name {
	case "tick":
		return h.print(now, h.c.Tick(now)), nil
	case "ack":
		in, err := h.ack(cmd)
		if err != nil {
			return "", err
		}
		return h.print(now, h.c.Step(now, in)), nil
	case "ack-all":
		id, err := cmd.int("id", 0)
		if err != nil {
			return "", err
		}
		var out []string
		for _, task := range h.tasks {
			cmd.args["task"] = task.String()
			in, err := h.ack(cmd)
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
		id, err := cmd.int("id", 0)
		if err != nil {
			return "", err
		}
		task, err := parseTask(cmd.str("task", ""))
		if err != nil {
			return "", err
		}
		reason := errors.New(cmd.str("reason", "no space left on device"))
		return h.print(now, h.c.Step(now, Decline{Checkpoint: ID(id), Task: task, Reason: reason})), nil
	case "savepoint":
		stop, err := cmd.bool("stop")
		if err != nil {
			return "", err
		}
		return h.print(now, h.c.Step(now, TriggerSavepoint{Path: cmd.str("path", ""), Stop: stop})), nil
	case "persist":
		id, err := cmd.int("id", 0)
		if err != nil {
			return "", err
		}
		in := Persisted{Checkpoint: ID(id), Path: fmt.Sprintf("/data/chk-%d", id)}
		if e, ok := cmd.lookup("err"); ok {
			in = Persisted{Checkpoint: ID(id), Err: errors.New(e)}
		}
		return h.print(now, h.c.Step(now, in)), nil
	case "task-failed":
		task, err := parseTask(cmd.str("task", ""))
		if err != nil {
			return "", err
		}
		in := TaskFailed{Task: task, Err: errors.New(cmd.str("reason", "panic"))}
		return h.print(now, h.c.Step(now, in)), nil
	case "recover":
		var p Progress
		n, err := cmd.int("next", 0)
		if err != nil {
			return "", err
		}
		p.NextID = ID(n)
		if p.Completed, err = parseIDs(cmd.str("completed", "")); err != nil {
			return "", err
		}
		if p.Incomplete, err = parseIDs(cmd.str("incomplete", "")); err != nil {
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
	return "", fmt.Errorf("unknown command %q", cmd.name)
}

func (h *coordHarness) create(cmd *command) (string, error) {
	cfg := DefaultConfig()
	cfg.Dir = "/data"
	var err error
	must := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	cfg.Interval, e = cmd.duration("interval", 0)
	must(e)
	cfg.Timeout, e = cmd.duration("timeout", cfg.Timeout)
	must(e)
	cfg.MinPause, e = cmd.duration("min-pause", 0)
	must(e)
	cfg.MaxConcurrent, e = cmd.int("max-concurrent", cfg.MaxConcurrent)
	must(e)
	cfg.TolerableFailures, e = cmd.int("tolerable", cfg.TolerableFailures)
	must(e)
	cfg.Retain, e = cmd.int("retain", cfg.Retain)
	must(e)
	if m, ok := cmd.lookup("mode"); ok {
		must(cfg.Mode.UnmarshalText([]byte(m)))
	}
	h.manual = cmd.str("persist", "auto") == "manual"
	h.metadata, e = cmd.bool("metadata")
	must(e)
	if err != nil {
		return "", err
	}
	h.tasks = nil
	for _, spec := range strings.Split(cmd.str("tasks", ""), ",") {
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
	for _, v := range strings.Split(cmd.str("sources", ""), ",") {
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

func (h *coordHarness) ack(cmd *command) (Ack, error) {
	id, err := cmd.int("id", 0)
	if err != nil {
		return Ack{}, err
	}
	task, err := parseTask(cmd.str("task", ""))
	if err != nil {
		return Ack{}, err
	}
	size, err := cmd.int("size", 100)
	if err != nil {
		return Ack{}, err
	}
	align, err := cmd.duration("align", 0)
	if err != nil {
		return Ack{}, err
	}
	ops := []string{task.Vertex}
	if o, ok := cmd.lookup("ops"); ok {
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

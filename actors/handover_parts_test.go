package actors

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/snapshot"
)

// partsSender is a control channel to a node whose frames carry at most
// max bytes: it decodes what the master sends and answers each handover
// step as done, at once.
type partsSender struct {
	r   *Runner
	max int
	mu  sync.Mutex
	got []controlMsg
}

func (s *partsSender) Send(_ context.Context, _ FrameKind, _ int64, body []byte) error {
	if len(body) > s.max {
		return errors.New("frame too large")
	}
	m, err := decodeControl(bytes.Clone(body))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.got = append(s.got, m)
	s.mu.Unlock()
	s.r.handoverReply("w", controlMsg{Kind: ctlStepDone, Epoch: m.Epoch, Checkpoint: m.Checkpoint, Step: m.Step, Task: m.Task, Value: 1})
	return nil
}
func (s *partsSender) MaxBody() int { return s.max }
func (s *partsSender) Close()       {}

// An adopt step whose savepoint metadata is larger than a control frame
// (a job of many subtasks) is sent in parts, each in its own frame, and
// the node joins them to the adopt step: it gets the metadata whole. One
// that fits goes in one frame. Parts out of order, or for another
// subtask, fail the step.
func TestAdoptMetadataInParts(t *testing.T) {
	const frame = 4 << 10
	r := &Runner{job: &Job{Name: "j"}, epoch: 3, log: slog.New(slog.DiscardHandler), mv: newMoveLink(),
		cfg: Config{Clock: clockwork.NewRealClock(), Cluster: &Cluster{ControlTimeout: 5 * time.Second}}}
	s := &partsSender{r: r, max: frame}
	r.ctl = &masterCtl{down: []*ctlSender{{out: s}}, ids: []string{"w"}}
	n := &hoNode{id: "w", index: 0}
	task := snapshot.TaskID{Vertex: "count-sum", Subtask: 1}
	blob := make([]byte, 5*frame+123)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	keys := []PlacedTask{{UID: "count-sum", Subtask: 0, Node: "a"}, {UID: "count-sum", Subtask: 1, Node: "w"}}
	ctx := context.Background()
	if _, err := r.sendAdopt(ctx, n, controlMsg{Step: hoAdopt, Checkpoint: 9, Task: task, Gen: 2, Blob: blob, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	if len(s.got) < 6 {
		t.Fatalf("%d frames for %d bytes of metadata in frames of %d", len(s.got), len(blob), frame)
	}
	// The node's side: it joins the parts to the adopt step.
	var p adoptParts
	var adopt controlMsg
	for i, m := range s.got {
		switch {
		case i < len(s.got)-1:
			if m.Step != hoAdoptPart {
				t.Fatalf("frame %d: step %d, want a part", i, m.Step)
			}
			if err := p.add(m); err != nil {
				t.Fatal(err)
			}
		default:
			if m.Step != hoAdopt || len(m.Keys) != 2 || m.Gen != 2 {
				t.Fatalf("last frame %+v, want the adopt step", m)
			}
			var err error
			if adopt, err = p.join(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Equal(adopt.Blob, blob) {
		t.Fatalf("the node got %d bytes of metadata, want the %d sent", len(adopt.Blob), len(blob))
	}
	if p.blob != nil {
		t.Fatal("parts kept after the adopt step")
	}

	// Small metadata: one frame.
	s.got = nil
	if _, err := r.sendAdopt(ctx, n, controlMsg{Step: hoAdopt, Checkpoint: 10, Task: task, Blob: blob[:100], Keys: keys}); err != nil {
		t.Fatal(err)
	}
	if len(s.got) != 1 || s.got[0].Step != hoAdopt {
		t.Fatalf("%d frames for small metadata", len(s.got))
	}
	if m, err := p.join(s.got[0]); err != nil || !bytes.Equal(m.Blob, blob[:100]) {
		t.Fatalf("join without parts: %v", err)
	}

	// A part out of order, or an adopt step for another subtask.
	if err := p.add(controlMsg{Step: hoAdoptPart, Checkpoint: 11, Task: task, Value: 10, Blob: blob[:10]}); !errors.Is(err, errControlMsg) {
		t.Fatalf("part at offset 10 first: %v", err)
	}
	if err := p.add(controlMsg{Step: hoAdoptPart, Checkpoint: 11, Task: task, Blob: blob[:10]}); err != nil {
		t.Fatal(err)
	}
	other := snapshot.TaskID{Vertex: "count-sum", Subtask: 0}
	if _, err := p.join(controlMsg{Step: hoAdopt, Checkpoint: 11, Task: other}); !errors.Is(err, errControlMsg) {
		t.Fatalf("adopt step for another subtask after parts: %v", err)
	}
}

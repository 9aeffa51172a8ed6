package state

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgedio/edged/codec"
)

// uncodable has a field no codec can reach: an unexported one.
type uncodable struct {
	key string
	n   int
}

// A memory backend whose state is snapshotted (RequireCodecs) refuses, when
// the state is created, a state whose types have no codec, as the bolt
// backend does: it could not write a single snapshot of it. Without
// RequireCodecs (a job that never snapshots) it takes it, as before.
func TestMemoryBackendRequiringCodecsRefusesStateWithoutOne(t *testing.T) {
	b, _ := newTestBackend()
	var kc KeyContext[string]
	if _, err := NewValue(b, &kc, ValueDescriptor[uncodable]{Name: "plain"}); err != nil {
		t.Fatalf("NewValue without RequireCodecs = %v, want nil", err)
	}

	b, _ = newTestBackend()
	b.RequireCodecs()
	_, err := NewValue(b, &kc, ValueDescriptor[uncodable]{Name: "last"})
	if !errors.Is(err, codec.ErrUnsupported) || !strings.Contains(err.Error(), `state "last"`) || !strings.Contains(err.Error(), "unexported") {
		t.Fatalf("NewValue = %v, want an error wrapping codec.ErrUnsupported naming state \"last\" and the unexported field", err)
	}
	if _, err := NewList(b, &kc, ListDescriptor[uncodable]{Name: "all"}); !errors.Is(err, codec.ErrUnsupported) {
		t.Errorf("NewList = %v, want codec.ErrUnsupported", err)
	}
	if _, err := NewValue(b, &kc, ValueDescriptor[int]{Name: "count"}); err != nil {
		t.Errorf("NewValue of int = %v, want nil", err)
	}
}

// An operator state store whose states are snapshotted (RequireCodecs)
// refuses, when the state is registered, one whose type has no codec;
// without it (a job that never snapshots) it takes it, as before.
func TestOperatorStoreRequiringCodecsRefusesStateWithoutOne(t *testing.T) {
	s := NewOperatorStore()
	if _, err := ListState[uncodable](s, "plain"); err != nil {
		t.Fatalf("ListState without RequireCodecs = %v, want nil", err)
	}
	s = NewOperatorStore()
	s.RequireCodecs()
	_, err := ListState[uncodable](s, "pending")
	if !errors.Is(err, codec.ErrUnsupported) || !strings.Contains(err.Error(), `operator state "pending"`) || !strings.Contains(err.Error(), "unexported") {
		t.Fatalf("ListState = %v, want an error wrapping codec.ErrUnsupported naming operator state \"pending\" and the unexported field", err)
	}
	if _, err := BroadcastState[uncodable, int](s, "rules"); !errors.Is(err, codec.ErrUnsupported) {
		t.Errorf("BroadcastState with an uncodable key = %v, want codec.ErrUnsupported", err)
	}
	if _, err := UnionListState[int](s, "offsets"); err != nil {
		t.Errorf("UnionListState of int = %v, want nil", err)
	}
}

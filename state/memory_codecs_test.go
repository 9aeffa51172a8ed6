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

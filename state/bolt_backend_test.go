package state

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/keygroup"
)

func TestBoltOptions(t *testing.T) {
	if err := DefaultBoltOptions().Validate(); err != nil {
		t.Fatal(err)
	}
	err := BoltOptions{Timeout: -1, InitialMmapSize: -1, BatchSize: -1}.Validate()
	for _, key := range []string{"timeout", "initial_mmap_size", "batch_size"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate does not report %s: %v", key, err)
		}
	}
	if got := (BoltOptions{}).withDefaults(); got != DefaultBoltOptions() {
		t.Fatalf("zero options become %+v", got)
	}
	path := filepath.Join(t.TempDir(), "x.db")
	if _, err := NewBoltBackend(path, testGroups, nil, BoltOptions{BatchSize: -1}); err == nil {
		t.Fatal("invalid options accepted")
	}
	if _, err := NewBoltBackend(path, keygroup.Range{Start: 5, End: 2}, nil, BoltOptions{}); err == nil {
		t.Fatal("invalid key groups accepted")
	}
}

// A second backend on the same file waits for the lock no longer than its
// Timeout.
func TestBoltLockTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	b, err := NewBoltBackend(path, testGroups, nil, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	_, err = NewBoltBackend(path, testGroups, nil, BoltOptions{Timeout: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("two backends on one file: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("waited %v", d)
	}
}

// boltWithAValue returns a bolt backend on path holding value state "v"
// of one key, flushed to its file.
func boltWithAValue(t *testing.T, path string) *BoltBackend {
	t.Helper()
	b, err := NewBoltBackend(path, testGroups, nil, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kc KeyContext[string]
	v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
	kc.Set("a", 10)
	v.Update(1)
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	return b
}

// The file is a working store: a new backend on it starts empty.
func TestBoltStartsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	if err := boltWithAValue(t, path).Close(); err != nil {
		t.Fatal(err)
	}
	b, err := NewBoltBackend(path, testGroups, nil, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var kc KeyContext[string]
	v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
	kc.Set("a", 10)
	if _, ok := v.Get(); ok || Len(b, "v") != 0 {
		t.Fatal("state of an earlier backend survived")
	}
}

// Close removes the file: nothing reads it again, and a path no subtask
// opens again (a lower parallelism, the memory backend, a finished job)
// would otherwise hold its disk space for good. Before, Close left it in
// place.
func TestBoltCloseRemovesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	b := boltWithAValue(t, path)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("open backend: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Close the file is still there: %v", err)
	}
	// The path is free for the next backend.
	b, err := NewBoltBackend(path, testGroups, nil, BoltOptions{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBoltClosed(t *testing.T) {
	b := newTestBolt(t, testGroups, nil, 0)
	var kc KeyContext[string]
	v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
	kc.Set("a", 10)
	v.Update(1)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := b.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush: %v", err)
	}
	if _, err := Snapshot(b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Snapshot: %v", err)
	}
	if _, err := NewValue(b, &kc, ValueDescriptor[int]{Name: "w"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewValue: %v", err)
	}
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, ErrClosed) {
			t.Fatalf("handle on a closed backend: recovered %v", err)
		}
	}()
	v.Get()
}

// Writes are buffered and committed in batches of BatchSize; each is
// visible to the next read either way.
func TestBoltBatches(t *testing.T) {
	b := newTestBolt(t, testGroups, nil, 100)
	var kc KeyContext[int]
	v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
	m := must(NewMap(b, &kc, MapDescriptor[int, int]{Name: "m"}))
	for k := range 99 {
		kc.Set(k, groupOf(k))
		v.Update(k)
		if x, ok := v.Get(); !ok || x != k {
			t.Fatalf("key %d reads %d, %v before the commit", k, x, ok)
		}
	}
	if b.buffered != 99 {
		t.Fatalf("%d writes buffered, want 99", b.buffered)
	}
	kc.Set(99, groupOf(99))
	v.Update(99) // the 100th write
	v.Get()      // begins with the commit
	if b.buffered != 0 {
		t.Fatalf("%d writes buffered after the batch filled", b.buffered)
	}
	// Much more than a batch, in a Map, read back.
	for k := range 50 {
		kc.Set(k, groupOf(k))
		for uk := range 40 {
			m.Put(uk, k*uk)
		}
		m.Remove(3)
	}
	for k := range 50 {
		kc.Set(k, groupOf(k))
		if m.Len() != 39 || m.Contains(3) {
			t.Fatalf("key %d: Len %d", k, m.Len())
		}
		if x, _ := m.Get(7); x != 7*k {
			t.Fatalf("key %d: m[7] = %d", k, x)
		}
	}
	if Len(b, "m") != 50 || Len(b, "v") != 100 {
		t.Fatalf("Len m %d, v %d", Len(b, "m"), Len(b, "v"))
	}
}

// A file an earlier run left damaged (a crash without fsync: a torn page,
// a cut file, garbage) is never read: the new backend starts a new file,
// empty, instead of panicking or faulting in bbolt.
func TestBoltIgnoresDamagedOldFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	b, err := NewBoltBackend(good, testGroups, nil, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(good) // before Close, which removes it
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	zeroed := slices.Clone(whole)
	clear(zeroed[:min(len(zeroed), 8192)])
	for name, content := range map[string][]byte{
		"zeroed meta pages": zeroed,
		"cut in half":       whole[:len(whole)/2],
		"garbage":           bytes.Repeat([]byte{0xa5}, 3*4096),
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".db")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := NewBoltBackend(path, testGroups, nil, BoltOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := len(b.tables); n != 0 {
			t.Fatalf("%s: %d tables in a new backend", name, n)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

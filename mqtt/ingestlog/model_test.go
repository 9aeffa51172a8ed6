package ingestlog

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var modelSeed = flag.Uint64("model.seed", 0, "seed of TestModel (0: random)")

// TestModel runs a seeded random schedule of appends, truncations, reads
// and reopens against an in-memory model: a slice of messages and a
// released offset.
func TestModel(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	dir := t.TempDir()
	opts := Options{SegmentBytes: 256 + rng.Int64N(2048)}
	open := func() *Log {
		l, err := Open(dir, opts, nil)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return l
	}
	l := open()
	defer func() { l.Close() }()

	var model []Message // by offset
	var released uint64
	randomMessage := func() Message {
		p := make([]byte, rng.IntN(int(opts.SegmentBytes)/2))
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return Message{Topic: string(rune('a' + rng.IntN(26))), Payload: p, QoS: byte(rng.IntN(3))}
	}
	check := func(step int) {
		st := l.Stats()
		if st.NextOffset != uint64(len(model)) || st.DurableOffset != st.NextOffset {
			t.Fatalf("step %d: stats %+v, model has %d records", step, st, len(model))
		}
		if st.FirstOffset > released {
			t.Fatalf("step %d: first offset %d beyond released %d", step, st.FirstOffset, released)
		}
		var want int64
		sizes := frameSizes(t, dir)
		for off := released; off < uint64(len(model)); off++ {
			m := model[off]
			// The frame, and perhaps a commit mark (an offset up to off).
			if sizes[off] < frameSize(&m) || sizes[off] > frameSize(&m)+markSize(off) {
				t.Fatalf("step %d: record %d takes %d bytes, its frame %d", step, off, sizes[off], frameSize(&m))
			}
			want += sizes[off]
		}
		if st.UnreleasedBytes != want {
			t.Fatalf("step %d: %d bytes unreleased, model says %d", step, st.UnreleasedBytes, want)
		}
		var disk int64
		names := segmentFiles(t, dir)
		for _, name := range names {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			disk += fi.Size()
		}
		if st.DiskBytes != disk || st.Segments != len(names) {
			t.Fatalf("step %d: stats say %d bytes in %d segments, disk has %d in %d", step,
				st.DiskBytes, st.Segments, disk, len(names))
		}
		if st.FirstOffset > 0 {
			if _, err := l.Reader(st.FirstOffset - 1); !errors.Is(err, ErrTruncated) {
				t.Fatalf("step %d: Reader before the first offset: %v", step, err)
			}
		}
		from := st.FirstOffset + rng.Uint64N(uint64(len(model))-st.FirstOffset+1)
		recs := readAll(t, l, from)
		if len(recs) != len(model)-int(from) {
			t.Fatalf("step %d: read %d records from %d, model has %d", step, len(recs), from, len(model))
		}
		for k, r := range recs {
			m := model[int(from)+k]
			if r.Offset != from+uint64(k) || r.Topic != m.Topic || !bytes.Equal(r.Payload, m.Payload) || r.QoS != m.QoS {
				t.Fatalf("step %d: record %d differs", step, from+uint64(k))
			}
		}
	}

	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 6:
			for range 1 + rng.IntN(8) {
				m := randomMessage()
				off, err := l.Append(context.Background(), m)
				if err != nil {
					t.Fatalf("step %d: Append: %v", step, err)
				}
				if off != uint64(len(model)) {
					t.Fatalf("step %d: Append returned %d, want %d", step, off, len(model))
				}
				model = append(model, m)
			}
		case op < 8:
			before := released + rng.Uint64N(uint64(len(model))-released+1)
			if err := l.Truncate(before); err != nil {
				t.Fatalf("step %d: Truncate(%d): %v", step, before, err)
			}
			released = before
			// Truncate deletes every segment whose records are all
			// released, except the active one.
			if names := segmentFiles(t, dir); len(names) > 1 {
				second, _ := parseSegmentName(names[1])
				if second <= released {
					t.Fatalf("step %d: segment %s kept though everything before %d is released", step, names[0], released)
				}
			}
		case op < 9:
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = open()
			// A reopened log counts everything on disk as unreleased.
			released = l.Stats().FirstOffset
		default:
			if err := l.Truncate(uint64(len(model)) + 1); !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("step %d: Truncate past the end: %v", step, err)
			}
		}
		check(step)
	}
}

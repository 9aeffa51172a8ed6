package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"path/filepath"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/keygroup"
)

// FuzzRestore feeds Restore, and the registrations that decode what it
// restored, arbitrary input: it must return errors, never panic. mode
// says what data is:
//   - even: a whole stream (with the offsets it declares, or else those
//     of the seed), so the checksums catch almost every change;
//   - odd: the body of a section of key group 3, framed with a correct
//     length and checksum behind the seed's header, so that the parser
//     and the decoders get past the checksums; with mode&2 the stream is
//     restored into a bolt backend, otherwise into a memory backend.
//
// Once restored, a registration must fail or the state must read and
// snapshot again without panicking.
func FuzzRestore(f *testing.F) {
	full := keygroup.Range{Start: 0, End: fixMaxPar}
	clk := clockwork.NewFakeClock()
	src := NewMemoryBackend(full, clk)
	fx := mustFixture(f, src)
	fx.fill(fixtureKeys(8), clk)
	seed, seedOffs := writeSnapshot(f, src)
	h, err := readHeader(bytes.NewReader(seed))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(byte(0), seed)
	f.Add(byte(0), seed[:len(seed)/2])
	for g, ext := range seedOffs {
		body := seed[ext.Offset+sectionHeadLen : ext.Offset+ext.Length-sectionTailLen]
		f.Add(byte(1), body)
		f.Add(byte(3), body)
		if g == 3 {
			f.Add(byte(1), body[:len(body)-1])
		}
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, mode byte, data []byte) {
		stream, offs := data, seedOffs
		if mode%2 == 0 {
			if o, err := ReadKeyGroupOffsets(bytes.NewReader(data), int64(len(data))); err == nil {
				offs = o
			}
		} else {
			sec := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
			sec = binary.BigEndian.AppendUint16(sec, 3)
			sec = append(sec, data...)
			sec = binary.BigEndian.AppendUint32(sec, crc32.Checksum(sec, castagnoli))
			stream = append(bytes.Clone(seed[:h.len]), sec...)
			offs = KeyGroupOffsets{3: {Offset: h.len, Length: int64(len(sec))}}
		}
		var b Backend = NewMemoryBackend(full, clk)
		if mode&3 == 3 {
			bb, err := NewBoltBackend(filepath.Join(dir, "fuzz.db"), full, clk, BoltOptions{InitialMmapSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer bb.Close()
			b = bb
		}
		err := Restore(b, bytes.NewReader(stream), offs, full)
		if err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrSnapshotVersion) && !errors.Is(err, ErrRestoreAfterRegister) {
				t.Fatalf("Restore: unexpected error %v", err)
			}
			return
		}
		rf, err := openFixture(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrIncompatibleState) {
				t.Fatalf("registration: unexpected error %v", err)
			}
			return
		}
		rf.observe(fixtureKeys(8))
		if s, err := Snapshot(b); err == nil {
			if _, err := s.WriteTo(io.Discard); err != nil {
				t.Fatal(err)
			}
		}
	})
}

package operators

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
)

// A LineFileSource's checkpoint holds its byte offset and, so that a
// restore can tell whether the file now at the path is the one that
// offset was taken in, the file's identity:
//
//	varint  offset          (a checkpoint of an earlier edged holds only this)
//	byte    1               (the format)
//	byte    flags           (bit 0: device and inode follow)
//	uvarint device, inode
//	uvarint head            (bytes the fingerprint covers: the offset, at most fingerprintSize)
//	uint64  fingerprint     (big endian, FNV-1a of the file's first head bytes)

// fileStateFormat is the format byte after the offset.
const fileStateFormat = 1

// fingerprintSize bounds how many of a file's first bytes a file source's
// checkpoint fingerprints: enough to tell a file truncated and written
// again past the offset (same inode, not shorter) from the one read.
const fingerprintSize = 1024

// fileID identifies a file on its host: a rename keeps its device and
// inode, a new file at the path has others.
type fileID struct{ dev, ino uint64 }

// fileState is a LineFileSource's checkpointed state.
type fileState struct {
	pos   int64
	id    fileID
	hasID bool   // id is known (a unix platform; not in an old checkpoint)
	head  int64  // bytes fp covers; 0: none
	fp    uint64 // fingerprint of the file's first head bytes
}

// fingerprint returns the fingerprint of a file's first bytes b.
func fingerprint(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// encode appends the state's encoding to b.
func (st fileState) encode(b []byte) []byte {
	b = binary.AppendVarint(b, st.pos)
	var flags byte
	if st.hasID {
		flags |= 1
	}
	b = append(b, fileStateFormat, flags)
	if st.hasID {
		b = binary.AppendUvarint(b, st.id.dev)
		b = binary.AppendUvarint(b, st.id.ino)
	}
	b = binary.AppendUvarint(b, uint64(st.head))
	return binary.BigEndian.AppendUint64(b, st.fp)
}

// decodeFileState decodes what encode wrote, or the offset alone that
// checkpoints of an earlier edged hold.
func decodeFileState(b []byte) (fileState, error) {
	var st fileState
	pos, n := binary.Varint(b)
	if n <= 0 {
		return st, fmt.Errorf("operators: line file source: corrupt offset %x", b)
	}
	st.pos, b = pos, b[n:]
	if len(b) == 0 {
		return st, nil
	}
	if len(b) < 2 || b[0] != fileStateFormat || b[1]&^1 != 0 {
		return st, fmt.Errorf("operators: line file source: unknown state format after the offset: %x", b)
	}
	st.hasID, b = b[1]&1 != 0, b[2:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	ok := true
	if st.hasID {
		var okDev, okIno bool
		st.id.dev, okDev = uvarint()
		st.id.ino, okIno = uvarint()
		ok = okDev && okIno
	}
	head, okHead := uvarint()
	if !ok || !okHead || head > fingerprintSize || int64(head) > max(st.pos, 0) || len(b) != 8 {
		return fileState{}, fmt.Errorf("operators: line file source: corrupt file identity in state %x", b)
	}
	st.head, st.fp = int64(head), binary.BigEndian.Uint64(b)
	return st, nil
}

// SnapshotState returns the file source's byte offset and the identity of
// the file it reads (device, inode, a fingerprint of its first bytes).
// Called on the subtask's goroutine.
func (s *LineFileSource[T]) SnapshotState(int64) ([]byte, error) {
	if s.want != nil || s.f == nil {
		// A restored position not yet applied keeps the identity it came
		// with; a source that reads no file has none.
		st := fileState{pos: s.pos}
		if s.want != nil {
			st = *s.want
			st.pos = s.pos
		}
		return st.encode(nil), nil
	}
	st := fileState{pos: s.pos, id: s.id, hasID: s.hasID}
	head, err := s.headBytes(min(s.pos, fingerprintSize))
	if err != nil {
		return nil, err
	}
	if head != nil {
		st.head, st.fp = int64(len(head)), fingerprint(head)
	}
	return st.encode(nil), nil
}

// RestoreState makes the file source go on from its snapshotted offset in
// the file it was taken in. Only subtask 0 reads the file, so the state of
// old subtask 0 is the one that counts whatever the parallelism. Whether
// the file at the path is still that file is checked before the first
// line is read (Poll).
func (s *LineFileSource[T]) RestoreState(states [][]byte, _ int) error {
	if len(states) == 0 {
		return nil
	}
	st, err := decodeFileState(states[0])
	if err != nil {
		return err
	}
	s.setPosition(st.pos, &st)
	return nil
}

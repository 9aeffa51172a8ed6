package snapshot

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"

	"github.com/edgedio/edged/keygroup"
)

// Kind tells a checkpoint from a savepoint.
type Kind uint8

const (
	// KindCheckpoint is a periodic checkpoint, owned by the system:
	// retention discards it.
	KindCheckpoint Kind = iota + 1
	// KindSavepoint is a savepoint, owned by the person who asked for it:
	// never discarded, self-contained and relocatable.
	KindSavepoint
)

// String returns "checkpoint" or "savepoint".
func (k Kind) String() string {
	switch k {
	case KindCheckpoint:
		return "checkpoint"
	case KindSavepoint:
		return "savepoint"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Handle describes what one operator subtask wrote for a snapshot: at most
// one state file in the snapshot's directory, plus opaque descriptors that
// only the operator and its state backend interpret.
type Handle struct {
	// File is the state file's name, relative to the snapshot directory
	// (no directories, so the snapshot can be moved); "" if the subtask
	// wrote no file.
	File string
	// Size is the file's length in bytes (0 without a file).
	Size int64
	// Checksum is the CRC32C (Castagnoli) of the file (0 without a file).
	Checksum uint32
	// KeyGroups locates the key groups inside File (offsets, as the state
	// backend wrote them).
	KeyGroups []byte
	// Sources holds source positions (an ingest-log offset, a file
	// offset).
	Sources []byte
	// Pending holds a sink's pre-committed two-phase-commit transactions,
	// to re-commit after a restore.
	Pending []byte
}

// Operator is the state of one operator in a snapshot.
type Operator struct {
	// UID is the operator's stable UID, by which a restore matches state
	// to operators.
	UID string
	// Parallelism is the operator's parallelism when the snapshot was
	// taken; subtask i owned keygroup.RangeFor(i, Parallelism,
	// Metadata.MaxParallelism).
	Parallelism int
	// Subtasks holds one Handle per subtask, indexed by subtask (a zero
	// Handle for a subtask that reported nothing).
	Subtasks []Handle
	// Settings is a digest of the settings the operator's state was shaped
	// by when the snapshot was taken (a window's aggregates, say); "" if
	// the operator declared none. A restore into an operator with other
	// settings is refused.
	Settings string
}

// Metadata describes one complete checkpoint or savepoint. It is stored in
// the snapshot directory's _metadata file, written after every state file,
// so a snapshot with valid metadata is complete.
type Metadata struct {
	// Job is the job's name.
	Job string
	// MaxParallelism is the job's number of key groups, fixed for its life.
	MaxParallelism int
	// Checkpoint is the snapshot's ID.
	Checkpoint ID
	// Kind is KindCheckpoint or KindSavepoint.
	Kind Kind
	// Timestamp is the trigger time in milliseconds since the Unix epoch.
	Timestamp int64
	// Operators holds every operator with state, sorted by UID.
	Operators []Operator
	// Finished is set on the final checkpoint of a job whose input ended:
	// every task had finished when it was taken. A job restored from it
	// runs nothing more; its sinks only commit what it holds.
	Finished bool

	// Committed is set, on loading, for a snapshot whose directory holds
	// CommittedFile (MarkCommitted; not stored in _metadata): every sink
	// committed it before the job stopped (a finished job's final
	// checkpoint, a stop-with-savepoint), so the output it holds was
	// delivered: a restore from it re-delivers none of it, and one from a
	// final checkpoint needs nothing done.
	Committed bool

	// Dir is the directory the metadata was loaded from (set by the Store,
	// not stored): state files are filepath.Join(Dir, Handle.File).
	Dir string
}

// Operator returns the state of the operator with the given UID.
func (m *Metadata) Operator(uid string) (*Operator, bool) {
	i, ok := slices.BinarySearchFunc(m.Operators, uid, func(o Operator, uid string) int {
		return strings.Compare(o.UID, uid)
	})
	if !ok {
		return nil, false
	}
	return &m.Operators[i], true
}

// Size returns the sum of the sizes of the snapshot's state files.
func (m *Metadata) Size() int64 {
	var n int64
	for _, o := range m.Operators {
		for _, h := range o.Subtasks {
			n += h.Size
		}
	}
	return n
}

// Validate reports the first reason m cannot be encoded or trusted: a key
// group setting keygroup.Validate refuses, operators not sorted by UID or
// repeated, a Subtasks length other than Parallelism, or a handle with an
// unsafe file name or a size without a file.
func (m *Metadata) Validate() error {
	if m.Kind != KindCheckpoint && m.Kind != KindSavepoint {
		return fmt.Errorf("%w: unknown kind %d", ErrCorrupt, uint8(m.Kind))
	}
	if err := keygroup.Validate(1, m.MaxParallelism); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	for i, o := range m.Operators {
		if o.UID == "" {
			return fmt.Errorf("%w: operator %d has an empty UID", ErrCorrupt, i)
		}
		if i > 0 && m.Operators[i-1].UID >= o.UID {
			return fmt.Errorf("%w: operators not sorted by UID at %q", ErrCorrupt, o.UID)
		}
		if err := keygroup.Validate(o.Parallelism, m.MaxParallelism); err != nil {
			return fmt.Errorf("%w: operator %q: %w", ErrCorrupt, o.UID, err)
		}
		if len(o.Subtasks) != o.Parallelism {
			return fmt.Errorf("%w: operator %q has %d subtask handles for parallelism %d",
				ErrCorrupt, o.UID, len(o.Subtasks), o.Parallelism)
		}
		for s, h := range o.Subtasks {
			if err := h.validate(); err != nil {
				return fmt.Errorf("%w: operator %q subtask %d: %w", ErrCorrupt, o.UID, s, err)
			}
		}
	}
	return nil
}

func (h Handle) validate() error {
	if h.File == "" {
		if h.Size != 0 || h.Checksum != 0 {
			return fmt.Errorf("size %d or checksum %08x without a file", h.Size, h.Checksum)
		}
		return nil
	}
	if h.Size < 0 {
		return fmt.Errorf("negative size %d", h.Size)
	}
	return validFileName(h.File)
}

// validFileName accepts the name of a file directly in a snapshot
// directory: no separators, not "." or "..", not the metadata file.
func validFileName(name string) error {
	switch {
	case name == "", name == ".", name == "..", name == metadataFile:
		return fmt.Errorf("%w: file name %q", ErrName, name)
	case len(name) > 255:
		return fmt.Errorf("%w: file name of %d bytes", ErrName, len(name))
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("%w: file name %q is not a plain name", ErrName, name)
	}
	return nil
}

// The metadata file format, version 3, is described in doc.go. Version 1
// lacks the trailing flags byte; it is still read (Finished false).
// Version 2 lacks the operators' settings after it; it is still read, and
// written when no operator has settings, so that such snapshots stay
// readable by the versions before.
const (
	metadataMagic   = "EDGDMETA"
	metadataVersion = 3
	// metadataFinished is the flags bit of Metadata.Finished.
	metadataFinished = 1 << 0
	headerLen        = len(metadataMagic) + 2 + 4
)

// castagnoli is the CRC32C table used for metadata and state files.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodeMetadata returns the metadata file contents for m (Dir is not
// stored). It fails if m does not Validate.
func EncodeMetadata(m *Metadata) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	version := uint16(2)
	for _, o := range m.Operators {
		if o.Settings != "" {
			version = metadataVersion
		}
	}
	b := make([]byte, headerLen, 256)
	copy(b, metadataMagic)
	binary.LittleEndian.PutUint16(b[len(metadataMagic):], version)
	b = appendString(b, m.Job)
	b = binary.AppendUvarint(b, uint64(m.MaxParallelism))
	b = binary.AppendUvarint(b, uint64(m.Checkpoint))
	b = append(b, byte(m.Kind))
	b = binary.AppendVarint(b, m.Timestamp)
	b = binary.AppendUvarint(b, uint64(len(m.Operators)))
	for _, o := range m.Operators {
		b = appendString(b, o.UID)
		b = binary.AppendUvarint(b, uint64(o.Parallelism))
		for _, h := range o.Subtasks {
			b = appendString(b, h.File)
			b = binary.AppendUvarint(b, uint64(h.Size))
			b = binary.LittleEndian.AppendUint32(b, h.Checksum)
			b = appendString(b, string(h.KeyGroups))
			b = appendString(b, string(h.Sources))
			b = appendString(b, string(h.Pending))
		}
	}
	var flags byte
	if m.Finished {
		flags |= metadataFinished
	}
	b = append(b, flags)
	if version >= 3 {
		for _, o := range m.Operators {
			b = appendString(b, o.Settings)
		}
	}
	body := len(b) - headerLen
	if uint64(body) > math.MaxUint32 {
		return nil, fmt.Errorf("%w: metadata body of %d bytes", ErrCorrupt, body)
	}
	binary.LittleEndian.PutUint32(b[len(metadataMagic)+2:], uint32(body))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeMetadata parses a metadata file. It never panics: bad input gives
// an error wrapping ErrBadMagic, ErrVersion, ErrChecksum or ErrCorrupt.
// Zero-length byte fields decode as nil.
func DecodeMetadata(b []byte) (*Metadata, error) {
	if len(b) < len(metadataMagic) || string(b[:len(metadataMagic)]) != metadataMagic {
		return nil, ErrBadMagic
	}
	if len(b) < headerLen {
		return nil, fmt.Errorf("%w: truncated header", ErrCorrupt)
	}
	version := binary.LittleEndian.Uint16(b[len(metadataMagic):])
	if version < 1 || version > metadataVersion {
		return nil, fmt.Errorf("%w: version %d, want 1 to %d", ErrVersion, version, metadataVersion)
	}
	bodyLen := uint64(binary.LittleEndian.Uint32(b[len(metadataMagic)+2:]))
	if uint64(len(b)) != uint64(headerLen)+bodyLen+4 {
		return nil, fmt.Errorf("%w: %d bytes for a body of %d", ErrCorrupt, len(b), bodyLen)
	}
	end := len(b) - 4
	if got, want := crc32.Checksum(b[:end], castagnoli), binary.LittleEndian.Uint32(b[end:]); got != want {
		return nil, fmt.Errorf("%w: metadata crc32c %08x, stored %08x", ErrChecksum, got, want)
	}
	d := decoder{b: b[headerLen:end]}
	m := &Metadata{}
	m.Job = d.string()
	m.MaxParallelism = d.int(keygroup.MaxMaxParallelism)
	m.Checkpoint = ID(d.uvarint())
	m.Kind = Kind(d.byte())
	m.Timestamp = d.varint()
	// Every operator takes at least two bytes, every subtask nine.
	nops := d.int(len(d.b) / 2)
	if d.err == nil && nops > 0 {
		m.Operators = make([]Operator, nops)
	}
	for i := 0; i < nops && d.err == nil; i++ {
		o := &m.Operators[i]
		o.UID = d.string()
		o.Parallelism = d.int(min(keygroup.MaxMaxParallelism, len(d.b)/9))
		if d.err != nil {
			break
		}
		o.Subtasks = make([]Handle, o.Parallelism)
		for s := range o.Subtasks {
			h := &o.Subtasks[s]
			h.File = d.string()
			h.Size = d.size()
			h.Checksum = d.uint32()
			h.KeyGroups = d.bytes()
			h.Sources = d.bytes()
			h.Pending = d.bytes()
		}
	}
	if version >= 2 {
		flags := d.byte()
		if d.err == nil && flags&^metadataFinished != 0 {
			return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
		}
		m.Finished = flags&metadataFinished != 0
	}
	if version >= 3 {
		for i := range m.Operators {
			m.Operators[i].Settings = d.string()
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.b))
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decoder reads body fields; the first error sticks and later reads return
// zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", ErrCorrupt, what)
		d.b = nil
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a uvarint that must not exceed limit.
func (d *decoder) int(limit int) int {
	v := d.uvarint()
	if v > uint64(limit) {
		d.fail(fmt.Sprintf("count %d (limit %d)", v, limit))
		return 0
	}
	return int(v)
}

// size reads a file size: a uvarint that must fit an int64 on every
// architecture (int is 32 bits on arm and 386).
func (d *decoder) size() int64 {
	v := d.uvarint()
	if v > math.MaxInt64 {
		d.fail(fmt.Sprintf("size %d", v))
		return 0
	}
	return int64(v)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uint32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 4 {
		d.fail("uint32")
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) raw() []byte {
	u := d.uvarint()
	if d.err != nil {
		return nil
	}
	if u > uint64(len(d.b)) {
		d.fail("length")
		return nil
	}
	n := int(u)
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw()) }

func (d *decoder) bytes() []byte {
	v := d.raw()
	if len(v) == 0 {
		return nil
	}
	return slices.Clone(v)
}

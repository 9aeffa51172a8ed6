package actors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/snapshot"
	"github.com/edgedio/edged/state"
)

// Control channels: the job master and each node's task host exchange
// their messages over the node's Network, on two channels per node whose
// edge numbers no job edge can have (a job's edges are indexed from 0).
// From and To of a control channel are node indexes in Cluster.Nodes; the
// master's end is node index MasterIndex.
const (
	// ControlEdgeUp carries a host's messages to the master.
	ControlEdgeUp = math.MaxInt32
	// ControlEdgeDown carries the master's messages to a host.
	ControlEdgeDown = math.MaxInt32 - 1
	// MasterIndex stands for the job master in a control channel's key.
	MasterIndex = math.MaxInt32
)

// ctlKind says what a control message carries.
type ctlKind uint8

const (
	// ctlRegister: host -> master, the host's node and plan fingerprint.
	ctlRegister ctlKind = iota + 1
	// ctlDeploy: master -> host, build and spawn the node's tasks.
	ctlDeploy
	// ctlDeployed: host -> master, the node's tasks are spawned.
	ctlDeployed
	// ctlStart: master -> host, start the sources.
	ctlStart
	// ctlTrigger: master -> host, checkpoint Checkpoint triggered (Flag:
	// stop the sources after it).
	ctlTrigger
	// ctlComplete: master -> host, checkpoint Checkpoint complete (Flag:
	// it ends the job, the tasks report they handled it).
	ctlComplete
	// ctlAbort: master -> host, checkpoint Checkpoint aborted.
	ctlAbort
	// ctlCancel: master -> host, the deployment is over.
	ctlCancel
	// ctlAck: host -> master, a task acknowledged a checkpoint.
	ctlAck
	// ctlDecline: host -> master, a task declined a checkpoint.
	ctlDecline
	// ctlFinished: host -> master, a task finished its input.
	ctlFinished
	// ctlFailed: host -> master, a task or the host failed.
	ctlFailed
	// ctlNotified: host -> master, a task handled the notification of the
	// checkpoint that ends the job.
	ctlNotified
	// ctlHandover: master -> host, checkpoint Checkpoint's barrier hands
	// the subtasks in Keys over (Runner.Move); the host answers
	// ctlPrepared once every task of it heard so.
	ctlHandover
	// ctlPrepared: host -> master, the host's tasks heard of handover
	// Checkpoint.
	ctlPrepared
	// ctlHandoverStep: master -> host, run handover step Step for
	// subtask Task (see hoStep); the host answers ctlStepDone.
	ctlHandoverStep
	// ctlStepDone: host -> master, handover step Step for subtask Task
	// ended: Value is its result, Err its failure.
	ctlStepDone
	// ctlOutputHeld: host -> master, task Task holds output only a
	// checkpoint commits (snapshot.OutputHeld).
	ctlOutputHeld

	maxCtlKind = ctlOutputHeld
)

// hoStep is a handover step a host runs for the job master
// (ctlHandoverStep).
type hoStep uint8

const (
	// hoRetire: retire subtask Task, handed over at checkpoint
	// Checkpoint's barrier; Value answers when it was handed over
	// (UnixNano).
	hoRetire hoStep = iota + 1
	// hoOpenFrom: open the channels from subtask Task, now on node To,
	// of generation Gen.
	hoOpenFrom
	// hoAdopt: build subtask Task with channels of generation Gen,
	// restore it from the savepoint whose metadata (the chain's
	// operators only) Blob encodes, fetching its state files, and spawn
	// it; Keys is where every subtask runs. Value answers its inputs.
	hoAdopt
	// hoRepoint: re-point the parked channels to subtask Task, now on
	// node To, with generation Gen. Value answers how many.
	hoRepoint
	// hoAdoptPart: Blob is the part at offset Value of the encoded
	// metadata of the hoAdopt step for subtask Task that follows, when
	// it does not fit in one control frame; the hoAdopt step's Blob is
	// then its last part.
	hoAdoptPart

	maxHoStep = hoAdoptPart
)

// isHandover reports whether messages of kind k carry the handover
// section.
func (k ctlKind) isHandover() bool { return k >= ctlHandover && k <= ctlStepDone }

// controlMsg is one message between the job master and a task host. Every
// message names its job and the epoch of its deployment: one of another
// epoch is dropped and counted.
type controlMsg struct {
	Kind  ctlKind
	Job   string
	Epoch uint64
	// Node is the sending host's node id (host -> master).
	Node string
	// Fingerprint is the host's plan fingerprint (register).
	Fingerprint string
	// Checkpoint is the checkpoint of a trigger, complete, abort, ack or
	// decline.
	Checkpoint int64
	// Flag is a trigger's stop or a complete's ack.
	Flag bool
	// Task is the task of an ack, a decline, finished or notified.
	Task snapshot.TaskID
	// State holds an ack's snapshot handles by operator UID.
	State map[string]snapshot.Handle
	// Alignment is an ack's alignment time.
	Alignment time.Duration
	// Err is a decline's reason or a failure.
	Err *wireError

	// The handover section (handover kinds only). Step is the step of a
	// ctlHandoverStep or ctlStepDone, Gen the channel generation, To a
	// node, Value a step's result, Blob encoded savepoint metadata, Keys
	// subtasks (the moved ones of ctlHandover, the placement of hoAdopt).
	Step  hoStep
	Gen   int
	To    string
	Value int64
	Blob  []byte
	Keys  []PlacedTask
}

// wireError is an error carried by a control message: its text, the
// sentinel it wrapped when it is one this package knows, and the fields
// of a TaskError.
type wireError struct {
	Sentinel uint8
	Msg      string
	// Task is set when the error was a *TaskError.
	Task                bool
	Operator, UID       string
	Subtask, Parallel   int
	Panic               bool
	TaskJob, TaskErrMsg string
}

// sentinels are the errors a wireError keeps across nodes, by index + 1.
var sentinels = []error{ErrInvalidJob, ErrNoCodec, ErrCheckpointFailure, ErrPlanMismatch, ErrControlFailed, ErrControlTimeout, ErrHandover,
	operators.ErrRescaleSource, state.ErrIncompatibleState, operators.ErrSourcePositionGone}

// RemoteError is an error that happened on another node and crossed it in
// a control message: its text, and the runtime's sentinel it wrapped, if
// any (errors.Is still matches it).
type RemoteError struct {
	// Node is the node it happened on.
	Node string
	// Msg is its text.
	Msg      string
	sentinel error
}

// Error returns the text with the node.
func (e *RemoteError) Error() string {
	if e.Node == "" {
		return e.Msg
	}
	return fmt.Sprintf("node %q: %s", e.Node, e.Msg)
}

// Unwrap returns the sentinel the original error wrapped, or nil.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// toWire flattens err for a control message.
func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	for i, s := range sentinels {
		if errors.Is(err, s) {
			w.Sentinel = uint8(i + 1)
			break
		}
	}
	var te *TaskError
	if errors.As(err, &te) {
		w.Task = true
		w.TaskJob, w.Operator, w.UID = te.Job, te.Operator, te.UID
		w.Subtask, w.Parallel, w.Panic = te.Subtask, te.Parallelism, te.Panic
		if te.Err != nil {
			w.TaskErrMsg = te.Err.Error()
		}
	}
	return w
}

// toError rebuilds the error of a control message from node.
func (w *wireError) toError(node string) error {
	if w == nil {
		return nil
	}
	var s error
	if w.Sentinel > 0 && int(w.Sentinel) <= len(sentinels) {
		s = sentinels[w.Sentinel-1]
	}
	if w.Task {
		return &TaskError{
			Job: w.TaskJob, Operator: w.Operator, UID: w.UID, Subtask: w.Subtask, Parallelism: w.Parallel, Panic: w.Panic,
			Err: &RemoteError{Node: node, Msg: w.TaskErrMsg, sentinel: s},
		}
	}
	return &RemoteError{Node: node, Msg: w.Msg, sentinel: s}
}

// Control message format, version 1:
//
//	magic    2 bytes "eC", version 1 byte, kind 1 byte
//	job, node, fingerprint            strings (uvarint length, bytes)
//	epoch                             uvarint
//	checkpoint                        zig-zag varint
//	flag                              1 byte 0 or 1
//	task vertex, task subtask         string, uvarint
//	alignment                         zig-zag varint (nanoseconds)
//	state                             uvarint count, then per operator in
//	                                  UID order: uid, file, size (uvarint),
//	                                  checksum (uvarint), key groups,
//	                                  sources, pending (byte strings)
//	error                             1 byte 0 (none) or 1, then sentinel
//	                                  byte, text, task byte, and for a task
//	                                  error job, operator, uid, subtask,
//	                                  parallelism, panic byte, cause text
//	handover section (handover kinds  step byte, gen uvarint, to string,
//	only)                             value zig-zag varint, blob byte
//	                                  string, keys uvarint count, then per
//	                                  key uid, subtask (uvarint), node
//
// The handover kinds came after version 1's first kinds; a decoder that
// does not know them refuses their kind, so the version stays 1.
const (
	ctlMagic0, ctlMagic1 = 'e', 'C'
	ctlVersion           = 1
	// maxCtlString bounds every string and byte string of a control
	// message.
	maxCtlString = 1 << 20
)

// errControlMsg is wrapped by every error decoding a control message.
var errControlMsg = errors.New("actors: corrupt control message")

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// appendControl appends m's encoding to dst.
func appendControl(dst []byte, m *controlMsg) ([]byte, error) {
	if m.Kind == 0 || m.Kind > maxCtlKind {
		return dst, fmt.Errorf("%w: kind %d", errControlMsg, m.Kind)
	}
	if m.Task.Subtask < 0 {
		return dst, fmt.Errorf("%w: subtask %d", errControlMsg, m.Task.Subtask)
	}
	dst = append(dst, ctlMagic0, ctlMagic1, ctlVersion, byte(m.Kind))
	dst = appendStr(dst, m.Job)
	dst = appendStr(dst, m.Node)
	dst = appendStr(dst, m.Fingerprint)
	dst = binary.AppendUvarint(dst, m.Epoch)
	dst = binary.AppendVarint(dst, m.Checkpoint)
	dst = appendBool(dst, m.Flag)
	dst = appendStr(dst, m.Task.Vertex)
	dst = binary.AppendUvarint(dst, uint64(m.Task.Subtask))
	dst = binary.AppendVarint(dst, int64(m.Alignment))
	uids := make([]string, 0, len(m.State))
	for uid := range m.State {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	dst = binary.AppendUvarint(dst, uint64(len(uids)))
	for _, uid := range uids {
		h := m.State[uid]
		if h.Size < 0 {
			return dst, fmt.Errorf("%w: handle size %d", errControlMsg, h.Size)
		}
		dst = appendStr(dst, uid)
		dst = appendStr(dst, h.File)
		dst = binary.AppendUvarint(dst, uint64(h.Size))
		dst = binary.AppendUvarint(dst, uint64(h.Checksum))
		dst = appendBytes(dst, h.KeyGroups)
		dst = appendBytes(dst, h.Sources)
		dst = appendBytes(dst, h.Pending)
	}
	w := m.Err
	dst = appendBool(dst, w != nil)
	if w != nil {
		if w.Subtask < 0 || w.Parallel < 0 {
			return dst, fmt.Errorf("%w: task error subtask %d/%d", errControlMsg, w.Subtask, w.Parallel)
		}
		dst = append(dst, w.Sentinel)
		dst = appendStr(dst, w.Msg)
		dst = appendBool(dst, w.Task)
		if w.Task {
			dst = appendStr(dst, w.TaskJob)
			dst = appendStr(dst, w.Operator)
			dst = appendStr(dst, w.UID)
			dst = binary.AppendUvarint(dst, uint64(w.Subtask))
			dst = binary.AppendUvarint(dst, uint64(w.Parallel))
			dst = appendBool(dst, w.Panic)
			dst = appendStr(dst, w.TaskErrMsg)
		}
	}
	if m.Kind.isHandover() {
		if m.Gen < 0 {
			return dst, fmt.Errorf("%w: generation %d", errControlMsg, m.Gen)
		}
		dst = append(dst, byte(m.Step))
		dst = binary.AppendUvarint(dst, uint64(m.Gen))
		dst = appendStr(dst, m.To)
		dst = binary.AppendVarint(dst, m.Value)
		dst = appendBytes(dst, m.Blob)
		dst = binary.AppendUvarint(dst, uint64(len(m.Keys)))
		for _, k := range m.Keys {
			if k.Subtask < 0 {
				return dst, fmt.Errorf("%w: subtask %d", errControlMsg, k.Subtask)
			}
			dst = appendStr(dst, k.UID)
			dst = binary.AppendUvarint(dst, uint64(k.Subtask))
			dst = appendStr(dst, k.Node)
		}
	}
	return dst, nil
}

// ctlReader reads a control message; the first error sticks.
type ctlReader struct {
	b   []byte
	err error
}

func (r *ctlReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", errControlMsg, what)
	}
}

func (r *ctlReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *ctlReader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *ctlReader) int(what string) int {
	v := r.uvarint(what)
	if v > math.MaxInt32 {
		r.fail(what + " out of range")
		return 0
	}
	return int(v)
}

func (r *ctlReader) bytes(what string) []byte {
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > maxCtlString || n > uint64(len(r.b)) {
		r.fail(what + " length")
		return nil
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	if n == 0 {
		return nil
	}
	return slices.Clone(b)
}

func (r *ctlReader) str(what string) string { return string(r.bytes(what)) }

func (r *ctlReader) bool(what string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) == 0 || r.b[0] > 1 {
		r.fail(what)
		return false
	}
	v := r.b[0] == 1
	r.b = r.b[1:]
	return v
}

func (r *ctlReader) byte(what string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// decodeControl decodes one control message from src, which must hold
// exactly the message. It never panics: bad input gives an error wrapping
// errControlMsg. The message shares nothing with src.
func decodeControl(src []byte) (controlMsg, error) {
	var m controlMsg
	if len(src) < 4 || src[0] != ctlMagic0 || src[1] != ctlMagic1 {
		return m, fmt.Errorf("%w: bad magic", errControlMsg)
	}
	if src[2] != ctlVersion {
		return m, fmt.Errorf("%w: version %d", errControlMsg, src[2])
	}
	m.Kind = ctlKind(src[3])
	if m.Kind == 0 || m.Kind > maxCtlKind {
		return controlMsg{}, fmt.Errorf("%w: kind %d", errControlMsg, src[3])
	}
	r := &ctlReader{b: src[4:]}
	m.Job = r.str("job")
	m.Node = r.str("node")
	m.Fingerprint = r.str("fingerprint")
	m.Epoch = r.uvarint("epoch")
	m.Checkpoint = r.varint("checkpoint")
	m.Flag = r.bool("flag")
	m.Task.Vertex = r.str("task")
	m.Task.Subtask = r.int("subtask")
	m.Alignment = time.Duration(r.varint("alignment"))
	n := r.uvarint("state count")
	if r.err == nil && n > uint64(len(r.b)) {
		r.fail("state count")
	}
	for range n {
		if r.err != nil {
			break
		}
		uid := r.str("uid")
		var h snapshot.Handle
		h.File = r.str("file")
		size := r.uvarint("size")
		if size > math.MaxInt64 {
			r.fail("size")
		}
		h.Size = int64(size)
		sum := r.uvarint("checksum")
		if sum > math.MaxUint32 {
			r.fail("checksum")
		}
		h.Checksum = uint32(sum)
		h.KeyGroups = r.bytes("key groups")
		h.Sources = r.bytes("sources")
		h.Pending = r.bytes("pending")
		if r.err == nil {
			if m.State == nil {
				m.State = make(map[string]snapshot.Handle)
			}
			if _, dup := m.State[uid]; dup {
				r.fail("duplicate operator " + uid)
			}
			m.State[uid] = h
		}
	}
	if r.bool("error") {
		w := &wireError{}
		w.Sentinel = r.byte("sentinel")
		w.Msg = r.str("error text")
		w.Task = r.bool("task error")
		if w.Task {
			w.TaskJob = r.str("task error job")
			w.Operator = r.str("task error operator")
			w.UID = r.str("task error uid")
			w.Subtask = r.int("task error subtask")
			w.Parallel = r.int("task error parallelism")
			w.Panic = r.bool("task error panic")
			w.TaskErrMsg = r.str("task error cause")
		}
		m.Err = w
	}
	if m.Kind.isHandover() {
		m.Step = hoStep(r.byte("step"))
		if r.err == nil && m.Step > maxHoStep {
			r.fail(fmt.Sprintf("step %d", m.Step))
		}
		m.Gen = r.int("generation")
		m.To = r.str("to")
		m.Value = r.varint("value")
		m.Blob = r.bytes("blob")
		n := r.uvarint("key count")
		if r.err == nil && n > uint64(len(r.b)) {
			r.fail("key count")
		}
		for range n {
			if r.err != nil {
				break
			}
			k := PlacedTask{UID: r.str("key uid"), Subtask: r.int("key subtask"), Node: r.str("key node")}
			m.Keys = append(m.Keys, k)
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail(fmt.Sprintf("%d bytes left over", len(r.b)))
	}
	if r.err != nil {
		return controlMsg{}, r.err
	}
	return m, nil
}

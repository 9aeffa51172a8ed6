package cluster

import (
	"fmt"
	"time"
)

// Input is what a channel machine steps on: Send, Receive, Processed, Tick
// or Disconnected.
type Input interface{ input() }

// Send asks a sender to send one message on its channel.
type Send struct {
	// Kind is any kind but KindAck.
	Kind Kind
	// Value is the watermark, barrier id or status (see Frame.Value).
	Value int64
	// Body is a batch's body. It is the caller's again once Step
	// returns: a Transmit that Step returns carries it, for the owner to
	// send before it returns to the caller; a batch that waits for credit
	// waits with a copy.
	Body []byte
	// Merge lets a batch join the batch before it while that one waits
	// for credit, both bodies in one frame, up to MaxMergeBytes; and lets
	// the sender of a saturated channel (half its credits or more in
	// flight) hold the batch until the next acknowledgement, for the
	// batches after it to join: under backpressure fewer and larger frames
	// cross, with fewer acknowledgements. Only for bodies whose concatenation the receiver
	// splits (the runtime's wire batches: see actors' decodeWire).
	Merge bool
}

// Receive hands a machine a frame from the peer: a data frame to a
// receiver, an ack to a sender.
type Receive struct{ Frame Frame }

// Processed tells a receiver that the task has processed every batch up to
// and including Seq.
type Processed struct{ Seq uint64 }

// Tick tells a machine the time: time enters the machines only this way.
type Tick struct{ Now time.Time }

// Disconnected tells a machine that the connection to its peer was lost.
type Disconnected struct{ Reason error }

func (Send) input()         {}
func (Receive) input()      {}
func (Processed) input()    {}
func (Tick) input()         {}
func (Disconnected) input() {}

// Action is what a machine asks its owner to do: Transmit, Deliver,
// Resume, Fail or Done, in the order returned.
type Action interface{ action() }

// Transmit sends Frame to the peer.
type Transmit struct {
	Frame Frame
	// Kept says Frame.Body is the sender's own copy of a batch that
	// waited for credit, which the owner recycles (putBuf) once it has
	// transmitted the frame: the transport copies what it sends.
	Kept bool
}

// Deliver hands Frame to the receiving task, in sequence.
type Deliver struct{ Frame Frame }

// Resume wakes a sender blocked on credit: half its credits are free.
type Resume struct{}

// Fail says the channel failed with Err (wrapping ErrChannelFailed): the
// job must recover. Nothing more is transmitted or delivered.
type Fail struct{ Err error }

// Done says the channel finished: the end of stream was processed and
// acknowledged.
type Done struct{}

func (Transmit) action() {}
func (Deliver) action()  {}
func (Resume) action()   {}
func (Fail) action()     {}
func (Done) action()     {}

// String renders the action for logs and test scripts.
func (a Transmit) String() string { return "transmit " + frameString(&a.Frame) }

// String renders the action for logs and test scripts.
func (a Deliver) String() string { return "deliver " + frameString(&a.Frame) }

// String renders the action for logs and test scripts.
func (Resume) String() string { return "resume" }

// String renders the action for logs and test scripts.
func (a Fail) String() string { return "fail: " + a.Err.Error() }

// String renders the action for logs and test scripts.
func (Done) String() string { return "done" }

func frameString(f *Frame) string {
	s := fmt.Sprintf("%s seq=%d", f.Kind, f.Seq)
	switch f.Kind {
	case KindBatch:
		s += fmt.Sprintf(" bytes=%d", len(f.Body))
	case KindWatermark, KindBarrier, KindStatus:
		s += fmt.Sprintf(" value=%d", f.Value)
	case KindAck:
		s += fmt.Sprintf(" received=%d", f.Value)
	}
	return s
}

// failure wraps cause as the failure of channel id.
func failure(id ChannelID, cause error, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %w: %s", ErrChannelFailed, id, cause, fmt.Sprintf(format, args...))
}

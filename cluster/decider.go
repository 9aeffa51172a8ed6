package cluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Decision is a placement the leader decided, with its epoch. Every node
// that accepts it runs the units it places on that node, and no others;
// epochs only grow, and one epoch never names two decisions.
type Decision struct {
	// Epoch orders decisions; a node accepts a decision only of an epoch
	// higher than any it accepted before.
	Epoch uint64 `json:"epoch"`
	// Leader is the node that decided it.
	Leader string `json:"leader"`
	// Members are the nodes the units were placed on, sorted by id.
	Members []Member `json:"members"`
	// Placement maps every unit to its node.
	Placement Placement `json:"placement"`
}

// Mine returns the units d places on node, sorted.
func (d *Decision) Mine(node string) []Unit {
	if d == nil {
		return nil
	}
	var out []Unit
	for u, n := range d.Placement {
		if n == node {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// DecisionKind names a message of the decision protocol.
type DecisionKind uint8

// The decision protocol's messages. A round is Paxos for one epoch: the
// leader asks a majority to promise the epoch (Prepare, Promise or
// Reject), decides (Decide, Accepted), and once every node it sees
// accepted, lets them take up the units they gained (Activate).
const (
	// MsgPrepare asks a node to promise epoch Epoch to the sender.
	MsgPrepare DecisionKind = iota + 1
	// MsgPromise promises Epoch; Decision carries the highest decision
	// the node accepted, if any.
	MsgPromise
	// MsgReject refuses a Prepare or a Decide: the node promised Epoch,
	// which is at least as high.
	MsgReject
	// MsgDecide carries the leader's Decision for Epoch.
	MsgDecide
	// MsgAccepted says the node accepted the decision of Epoch and has
	// given up every unit that decision does not place on it.
	MsgAccepted
	// MsgActivate lets nodes run the units Epoch's decision gave them.
	MsgActivate
	// MsgActive says the node activated the decision of Epoch.
	MsgActive
	// MsgPing asks a node for the epoch of the decision it accepted;
	// Epoch is the asker's, Sent the asker's clock, echoed back.
	MsgPing
	// MsgPong answers a ping: Epoch is the decision the node accepted (0
	// for none), Sent the ping's.
	MsgPong
)

// DecisionMsg is one message of the decision protocol.
type DecisionMsg struct {
	Kind     DecisionKind `json:"kind"`
	From     string       `json:"from"`
	Epoch    uint64       `json:"epoch"`
	Decision *Decision    `json:"decision,omitempty"`
	Sent     int64        `json:"sent,omitempty"`
}

// Encode returns the message's wire form.
func (m DecisionMsg) Encode() ([]byte, error) { return json.Marshal(m) }

// DecodeDecisionMsg parses a message's wire form.
func DecodeDecisionMsg(b []byte) (DecisionMsg, error) {
	var m DecisionMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return DecisionMsg{}, fmt.Errorf("%w: %v", ErrBadDecision, err)
	}
	if m.Kind < MsgPrepare || m.Kind > MsgPong || m.From == "" {
		return DecisionMsg{}, fmt.Errorf("%w: kind %d from %q", ErrBadDecision, m.Kind, m.From)
	}
	if m.Kind == MsgDecide && m.Decision == nil {
		return DecisionMsg{}, fmt.Errorf("%w: decide without a decision", ErrBadDecision)
	}
	return m, nil
}

// Envelope is a message to send to node To.
type Envelope struct {
	To  string
	Msg DecisionMsg
}

// DeciderConfig configures a Decider.
type DeciderConfig struct {
	// Self is this node's id.
	Self string
	// Size is the cluster's configured number of nodes; a node acts only
	// while it sees a majority of it.
	Size int
	// Units are what is placed.
	Units []Unit
	// Lease is how long a majority's word that no newer decision exists
	// lets a node keep running its units: a node runs units only while,
	// within the last Lease by its own clock, a majority of the cluster
	// answered its pings with no epoch above its own. The leader lets new
	// owners take units up only Lease after every node it sees accepted
	// the decision, by which time a node it cannot see (a partition, or
	// views that disagree) has stopped. Safety needs only clocks that run
	// at about the same rate, not synchronised ones, nor a failure
	// detector that is right.
	Lease time.Duration
	// Ping is how often a node asks the others for their epoch; a few
	// pings fit in a Lease.
	Ping time.Duration
	// Grace is how long the leader keeps a node's units on it after the
	// node left its view, in case it comes back at once (a false
	// suspicion); 0 moves them at once. Safety does not depend on it.
	Grace time.Duration
	// Resend is how often unanswered messages are sent again.
	Resend time.Duration
	// Promised is the highest epoch this node promised or accepted before
	// it restarted (see Decider.Promised); a restarted node never goes
	// back on a promise.
	Promised uint64
}

// Validate reports what is wrong with c.
func (c DeciderConfig) Validate() error {
	var errs []string
	if c.Self == "" {
		errs = append(errs, "self is empty")
	}
	if c.Size < 1 {
		errs = append(errs, fmt.Sprintf("size %d < 1", c.Size))
	}
	if c.Grace < 0 {
		errs = append(errs, "grace < 0")
	}
	if c.Lease <= 0 {
		errs = append(errs, "lease <= 0")
	}
	if c.Ping <= 0 || c.Ping >= c.Lease {
		errs = append(errs, "ping not in (0, lease)")
	}
	if c.Resend <= 0 {
		errs = append(errs, "resend <= 0")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", ErrBadDeciderConfig, errs)
	}
	return nil
}

// Decider is the pure state machine by which the leader decides each
// placement and its epoch, and by which every node learns which units it
// may run. Nodes never act on a placement they computed alone.
//
// Each decision takes one Paxos round for its epoch: the leader (the
// lowest id among the members it sees, if it sees a majority) proposes an
// epoch above every one it knows of, collects promises from a majority,
// and decides; two nodes that both believe they lead can never both get an
// epoch decided, and a new leader never reuses an epoch, because any two
// majorities share a node. Ownership is fenced three ways:
//
//   - a node that sees no majority runs nothing, at once;
//   - a node runs units only under a lease: within the last Lease, a
//     majority answered its pings with no epoch above its own; an answer
//     with a higher epoch ends its ownership at once;
//   - a unit moves in two steps: every node the leader sees first accepts
//     the new decision, giving up what it no longer owns; Lease after the
//     last acceptance, the leader lets the new owners activate what they
//     gained. The nodes that accepted include a member of every majority,
//     so by then any node the leader could not reach has lost its lease.
//
// So no unit is owned by two nodes at any moment, whatever the failure
// detectors say, as long as clocks run at about the same rate.
//
// A Decider reads no clock and starts nothing; it is stepped with views,
// messages and ticks, and returns the messages to send. Not safe for
// concurrent use.
type Decider struct {
	cfg DeciderConfig

	now  time.Time
	view map[string]Member // the members this node sees, itself included
	// lost is when each node that was in the view and left it left.
	lost map[string]time.Time

	promised uint64 // highest epoch promised or accepted
	// promisedTo is the node promised epoch promised, if it was promised
	// since this node started: a repeated Prepare from it is answered
	// with the promise again, not refused as if another node had it.
	promisedTo string
	accepted   *Decision
	active     bool          // the accepted decision is activated
	owned      map[Unit]bool // the units this node may run now
	rejected   uint64        // highest epoch a Reject told the leader about
	stale      int64         // messages of an old epoch ignored
	round      *round        // the leader's round in progress, or nil
	noLease    bool          // tests only: ownership without a lease
	retry      time.Time     // no new round before, after being outbid
	// confirmed is, per node, the latest send time of a ping it answered
	// with no epoch above the accepted one: the lease.
	confirmed map[string]time.Time
	pinged    time.Time
	// asked is when this node last told the leader, while holding a
	// decision it may not run, which decision that is.
	asked time.Time
}

// round is a leader's attempt to decide one epoch.
type round struct {
	epoch    uint64
	promises map[string]bool
	decision *Decision // nil until a majority promised
	accepted map[string]bool
	// acceptedAt is when every node in the view had accepted; the
	// activation waits a Lease past it.
	acceptedAt time.Time
	active     map[string]bool
	sent       time.Time
	done       bool // activation sent
}

// NewDecider returns a decider for a node that sees only itself.
func NewDecider(cfg DeciderConfig) (*Decider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Decider{
		cfg:       cfg,
		view:      map[string]Member{cfg.Self: {ID: cfg.Self, Capacity: 1}},
		lost:      map[string]time.Time{},
		promised:  cfg.Promised,
		owned:     map[Unit]bool{},
		confirmed: map[string]time.Time{},
	}
	return d, nil
}

// Promised returns the highest epoch this node promised or accepted; keep
// it across restarts (DeciderConfig.Promised).
func (d *Decider) Promised() uint64 { return d.promised }

// Accepted returns the decision this node accepted last, or nil.
func (d *Decider) Accepted() *Decision { return d.accepted }

// Active reports whether the accepted decision is activated.
func (d *Decider) Active() bool { return d.active }

// Stale returns the number of messages ignored for carrying an old epoch.
func (d *Decider) Stale() int64 { return d.stale }

// Owned returns the units this node may run now (as of the last step),
// sorted: none without a majority or without a lease; else those of its
// accepted decision, except, until the decision is activated, those it
// did not own before.
func (d *Decider) Owned() []Unit {
	if !d.quorum() || !d.leased() {
		return nil
	}
	return slices.Sorted(maps.Keys(d.owned))
}

// leased reports whether a majority, itself included, confirmed within
// the last Lease that no newer decision exists.
func (d *Decider) leased() bool {
	if d.noLease {
		return true
	}
	n := 1
	for id, at := range d.confirmed {
		if id != d.cfg.Self && d.now.Sub(at) < d.cfg.Lease {
			n++
		}
	}
	return HasQuorum(n, d.cfg.Size)
}

// Leader returns the leader this node sees, if it sees a majority.
func (d *Decider) Leader() (string, bool) {
	return Leader(slices.Collect(maps.Keys(d.view)), d.cfg.Size)
}

func (d *Decider) quorum() bool { return HasQuorum(len(d.view), d.cfg.Size) }

// View steps the decider with the members this node now sees (itself
// included whether listed or not) at time now.
func (d *Decider) View(now time.Time, members []Member) []Envelope {
	d.now = now
	next := map[string]Member{d.cfg.Self: {ID: d.cfg.Self, Capacity: 1}}
	if m, ok := d.view[d.cfg.Self]; ok {
		next[d.cfg.Self] = m
	}
	for _, m := range members {
		if m.Capacity <= 0 {
			m.Capacity = 1
		}
		next[m.ID] = m
	}
	for id := range d.view {
		if _, ok := next[id]; !ok {
			d.lost[id] = now
		}
	}
	for id := range next {
		delete(d.lost, id)
	}
	had := d.quorum()
	d.view = next
	var out []Envelope
	switch {
	case !d.quorum():
		// A minority runs nothing, and runs again only once the leader
		// activates a decision for it.
		clear(d.owned)
		d.active = false
	case !had:
		d.asked = time.Time{} // a majority again: ask at once
		out = d.ask()
	}
	return append(out, d.lead()...)
}

// ask tells the leader, once per Resend, which decision this node holds
// while it sees a majority but may not run that decision's units (it lost
// its majority and found it again, or missed the activation): the leader
// activates it again if the decision is still current. Asking until
// activated, not once, is what survives a lost message and a leader that
// dropped the round meanwhile.
func (d *Decider) ask() []Envelope {
	if d.active || d.accepted == nil || !d.quorum() || d.now.Sub(d.asked) < d.cfg.Resend {
		return nil
	}
	l, ok := d.Leader()
	if !ok || l == d.cfg.Self {
		return nil // the leader's own round activates it
	}
	d.asked = d.now
	return []Envelope{{To: l, Msg: DecisionMsg{Kind: MsgAccepted, From: d.cfg.Self, Epoch: d.accepted.Epoch}}}
}

// Tick steps the decider's time: pings go out, lost nodes' grace ends,
// activations come due, unanswered messages are sent again.
func (d *Decider) Tick(now time.Time) []Envelope {
	d.now = now
	var out []Envelope
	if now.Sub(d.pinged) >= d.cfg.Ping {
		d.pinged = now
		for _, id := range slices.Sorted(maps.Keys(d.view)) {
			if id != d.cfg.Self {
				out = append(out, Envelope{To: id, Msg: DecisionMsg{Kind: MsgPing, From: d.cfg.Self, Epoch: d.epoch(), Sent: now.UnixNano()}})
			}
		}
	}
	out = append(out, d.ask()...)
	return append(out, d.lead()...)
}

func (d *Decider) epoch() uint64 {
	if d.accepted == nil {
		return 0
	}
	return d.accepted.Epoch
}

// Step handles one message.
func (d *Decider) Step(now time.Time, m DecisionMsg) []Envelope {
	d.now = now
	var out []Envelope
	reply := func(k DecisionKind, epoch uint64, dec *Decision) {
		out = append(out, Envelope{To: m.From, Msg: DecisionMsg{Kind: k, From: d.cfg.Self, Epoch: epoch, Decision: dec}})
	}
	switch m.Kind {
	case MsgPrepare:
		if m.Epoch == d.promised && m.From == d.promisedTo {
			// A duplicate, or the leader missed the promise: the same
			// promise again (two proposers may pick one epoch; only
			// the one it was promised to gets it).
			reply(MsgPromise, m.Epoch, d.accepted)
			break
		}
		if m.Epoch <= d.promised {
			d.stale++
			reply(MsgReject, d.promised, nil)
			break
		}
		d.promised, d.promisedTo = m.Epoch, m.From
		reply(MsgPromise, m.Epoch, d.accepted)
	case MsgDecide:
		if m.Epoch < d.promised || (d.accepted != nil && m.Epoch <= d.accepted.Epoch) {
			d.stale++
			if d.accepted == nil || m.Epoch != d.accepted.Epoch {
				reply(MsgReject, d.promised, nil)
				break
			}
			// A resent Decide of the epoch already accepted: accept
			// again, the leader missed the answer.
			reply(MsgAccepted, m.Epoch, nil)
			break
		}
		d.accept(m.Decision)
		reply(MsgAccepted, m.Epoch, nil)
	case MsgActivate:
		if d.accepted == nil || m.Epoch != d.accepted.Epoch {
			d.stale++
			break
		}
		if !d.quorum() {
			break // asks again once it sees a majority (View)
		}
		if !d.active {
			d.active = true
			clear(d.owned)
			for _, u := range d.accepted.Mine(d.cfg.Self) {
				d.owned[u] = true
			}
		}
		reply(MsgActive, m.Epoch, nil)
	case MsgPing:
		reply(MsgPong, d.epoch(), nil)
		out[len(out)-1].Msg.Sent = m.Sent
		if r := d.round; r != nil && r.decision != nil && m.Epoch < r.epoch {
			// A node behind the leader's decision (it restarted, or
			// missed it): decide for it again.
			delete(r.accepted, m.From)
			delete(r.active, m.From)
			out = append(out, d.send(m.From, DecisionMsg{Kind: MsgDecide, From: d.cfg.Self, Epoch: r.epoch, Decision: r.decision})...)
		}
	case MsgPong:
		if m.Epoch > d.epoch() {
			// A newer decision exists: run nothing until it comes, and
			// as leader, decide above it.
			clear(d.owned)
			d.active = false
			d.rejected = max(d.rejected, m.Epoch)
			d.round = nil
			d.retry = d.now.Add(d.cfg.Resend)
			break
		}
		at := time.Unix(0, m.Sent)
		if at.After(d.confirmed[m.From]) {
			d.confirmed[m.From] = at
		}
	case MsgPromise, MsgReject, MsgAccepted, MsgActive:
		out = append(out, d.answer(m)...)
	}
	return out
}

// accept takes dec as this node's decision: it gives up every unit dec
// does not place here, and waits for activation to take up new ones.
func (d *Decider) accept(dec *Decision) {
	d.accepted = dec
	d.promised = max(d.promised, dec.Epoch)
	d.active = false
	mine := map[Unit]bool{}
	for _, u := range dec.Mine(d.cfg.Self) {
		mine[u] = true
	}
	for u := range d.owned {
		if !mine[u] {
			delete(d.owned, u)
		}
	}
}

// answer handles a reply to the leader's round.
func (d *Decider) answer(m DecisionMsg) []Envelope {
	r := d.round
	if m.Kind == MsgReject {
		d.rejected = max(d.rejected, m.Epoch)
		if r != nil && (m.Epoch > r.epoch || (m.Epoch == r.epoch && !r.done)) {
			// Outbid: propose higher, after a pause that lets the
			// other proposer finish. Also once the round's decision
			// is activated: a node that promised a higher epoch (to
			// a leader that gave up) can never accept this one.
			d.round = nil
			d.retry = d.now.Add(d.cfg.Resend)
		}
		return nil
	}
	if r == nil && m.Kind == MsgAccepted && d.current(m.Epoch) {
		// No round in progress (it finished, or was given up with
		// nothing left to change) and the node holds the decision this
		// leader decided and runs: activate it again, as a finished
		// round would.
		return d.send(m.From, DecisionMsg{Kind: MsgActivate, From: d.cfg.Self, Epoch: m.Epoch})
	}
	if r == nil || m.Epoch != r.epoch {
		d.stale++
		return nil
	}
	switch m.Kind {
	case MsgPromise:
		if r.decision != nil {
			return nil
		}
		r.promises[m.From] = true
		if !HasQuorum(len(r.promises), d.cfg.Size) {
			return nil
		}
		return d.decide(r)
	case MsgAccepted:
		if r.decision == nil {
			return nil
		}
		r.accepted[m.From] = true
		if r.done {
			// A node that missed the activation, or lost its majority
			// and found it again: activate it.
			delete(r.active, m.From)
			return d.send(m.From, DecisionMsg{Kind: MsgActivate, From: d.cfg.Self, Epoch: r.epoch})
		}
		d.allAccepted(r)
		return nil
	case MsgActive:
		r.active[m.From] = true
	}
	return nil
}

// current reports whether epoch is that of the decision this node decided
// as leader and runs.
func (d *Decider) current(epoch uint64) bool {
	a := d.accepted
	return a != nil && a.Epoch == epoch && a.Leader == d.cfg.Self && d.active
}

// members returns the nodes to place units on: the view, and the nodes
// lost for less than the grace, which keep their units until they have
// surely stopped.
func (d *Decider) members() []Member {
	ms := slices.Collect(maps.Values(d.view))
	for id, at := range d.lost {
		if d.now.Sub(at) < d.cfg.Grace {
			ms = append(ms, Member{ID: id, Capacity: 1})
		}
	}
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	return ms
}

// lead does the leader's part: start a round when the placement the
// leader wants differs from the one decided, and resend what is
// unanswered.
func (d *Decider) lead() []Envelope {
	leader, ok := d.Leader()
	if !ok || leader != d.cfg.Self {
		d.round = nil
		return nil
	}
	want := d.members()
	if r := d.round; r != nil {
		if r.epoch < d.epoch() {
			// This node accepted a newer decision (another leader's,
			// while this one could not see a majority): the round is
			// over; decide above it if the view asks for it.
			d.round = nil
		} else if r.decision != nil && !slices.Equal(r.decision.Members, want) {
			// The members changed under the round: decide again.
			d.round = nil
		} else if out := d.activate(r); out != nil {
			return out
		} else if d.now.Sub(r.sent) >= d.cfg.Resend {
			return d.resend(r)
		} else {
			return nil
		}
	}
	if d.current(d.epoch()) && slices.Equal(d.accepted.Members, want) && d.rejected <= d.epoch() {
		// Decided, activated, still what the view asks for, and no node
		// refused it for a higher promise.
		return nil
	}
	if d.now.Before(d.retry) {
		return nil
	}
	epoch := max(d.promised, d.rejected) + 1
	d.round = &round{epoch: epoch, promises: map[string]bool{}, accepted: map[string]bool{}, active: map[string]bool{}, sent: d.now}
	return d.broadcast(DecisionMsg{Kind: MsgPrepare, From: d.cfg.Self, Epoch: epoch})
}

// decide makes the round's decision, once a majority promised.
func (d *Decider) decide(r *round) []Envelope {
	ms := d.members()
	p, err := Place(ms, d.cfg.Units)
	if err != nil {
		d.round = nil
		return nil
	}
	r.decision = &Decision{Epoch: r.epoch, Leader: d.cfg.Self, Members: ms, Placement: p}
	r.sent = d.now
	return d.broadcast(DecisionMsg{Kind: MsgDecide, From: d.cfg.Self, Epoch: r.epoch, Decision: r.decision})
}

// allAccepted notes when every node the leader sees has accepted the
// round's decision (and so gave up what moved away).
func (d *Decider) allAccepted(r *round) {
	if !r.acceptedAt.IsZero() {
		return
	}
	for id := range d.view {
		if !r.accepted[id] {
			return
		}
	}
	r.acceptedAt = d.now
}

// activate lets the new owners take up their units, a Lease after every
// node the leader sees accepted the decision: by then a node the leader
// cannot see that still ran an older decision has lost its lease.
func (d *Decider) activate(r *round) []Envelope {
	if r.done || r.decision == nil {
		return nil
	}
	d.allAccepted(r)
	if r.acceptedAt.IsZero() || (!d.noLease && d.now.Sub(r.acceptedAt) < d.cfg.Lease) {
		return nil
	}
	r.done = true
	r.sent = d.now
	return d.broadcast(DecisionMsg{Kind: MsgActivate, From: d.cfg.Self, Epoch: r.epoch})
}

// resend repeats the round's current step to the nodes that did not
// answer it.
func (d *Decider) resend(r *round) []Envelope {
	r.sent = d.now
	var m DecisionMsg
	var answered map[string]bool
	switch {
	case r.done:
		// Activation is idempotent; repeat it for nodes that missed it.
		m, answered = DecisionMsg{Kind: MsgActivate, From: d.cfg.Self, Epoch: r.epoch}, r.active
	case r.decision != nil:
		m, answered = DecisionMsg{Kind: MsgDecide, From: d.cfg.Self, Epoch: r.epoch, Decision: r.decision}, r.accepted
	default:
		m, answered = DecisionMsg{Kind: MsgPrepare, From: d.cfg.Self, Epoch: r.epoch}, r.promises
	}
	var out []Envelope
	for _, id := range slices.Sorted(maps.Keys(d.view)) {
		if answered[id] {
			continue
		}
		out = append(out, d.send(id, m)...)
	}
	return out
}

// broadcast sends m to every node in the view; the leader's own copy is
// stepped at once.
func (d *Decider) broadcast(m DecisionMsg) []Envelope {
	var out []Envelope
	for _, id := range slices.Sorted(maps.Keys(d.view)) {
		out = append(out, d.send(id, m)...)
	}
	return out
}

func (d *Decider) send(to string, m DecisionMsg) []Envelope {
	if to != d.cfg.Self {
		return []Envelope{{To: to, Msg: m}}
	}
	var out []Envelope
	for _, e := range d.Step(d.now, m) {
		if e.To == d.cfg.Self {
			out = append(out, d.Step(d.now, e.Msg)...)
			continue
		}
		out = append(out, e)
	}
	return out
}

package operators

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jonboulle/clockwork"
)

// Defaults of GeneratorConfig.
const (
	// DefaultGeneratorKeys is the number of distinct sensors when
	// GeneratorConfig.Keys is 0.
	DefaultGeneratorKeys = 1000
	// DefaultGeneratorStart is the first event timestamp (unix seconds) when
	// GeneratorConfig.Start is 0.
	DefaultGeneratorStart int64 = 1547718199
)

// GeneratorConfig configures a Generator.
type GeneratorConfig struct {
	// Count is the total number of records over all subtasks; 0 means
	// unbounded.
	Count int64
	// Rate is the number of records per second over all subtasks, measured
	// in processing time; 0 means as fast as the pipeline takes them.
	Rate float64
	// Keys is the number of distinct sensors of SensorGenerator; default
	// DefaultGeneratorKeys (1000).
	Keys int
	// Start is the event timestamp, in unix seconds, of the first record of
	// SensorGenerator; default DefaultGeneratorStart (1547718199).
	Start int64
}

// withDefaults returns c with zero fields set to their defaults.
func (c GeneratorConfig) withDefaults() GeneratorConfig {
	if c.Keys == 0 {
		c.Keys = DefaultGeneratorKeys
	}
	if c.Start == 0 {
		c.Start = DefaultGeneratorStart
	}
	return c
}

// Validate reports every invalid field of c at once. Zero Keys and Start
// are valid: they mean the defaults.
func (c GeneratorConfig) Validate() error {
	var errs []error
	if c.Count < 0 {
		errs = append(errs, fmt.Errorf("generator.count (%d) must not be negative", c.Count))
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0 {
		errs = append(errs, fmt.Errorf("generator.rate (%v) must be a finite number >= 0", c.Rate))
	}
	if c.Keys < 0 {
		errs = append(errs, fmt.Errorf("generator.keys (%d) must not be negative", c.Keys))
	}
	return errors.Join(errs...)
}

// Generator is a deterministic, replayable Source. Record i (the global
// index) is gen(i). Subtask s of p emits the indices i ≡ s (mod p), i <
// Count, in increasing order, so the union over all subtasks is exactly
// [0, Count) whatever the parallelism.
//
// With a Rate, each subtask emits Rate/p records per second of ctx.Clock,
// starting at Open: its k-th record is due k·p/Rate seconds after Open. Poll
// emits the records due by now; when it has fallen behind (backpressure), it
// catches up as fast as the pipeline takes them.
//
// Like every operator, a Generator belongs to one subtask; its methods are
// called from that subtask's goroutine.
type Generator[T any] struct {
	cfg GeneratorConfig
	gen func(i int64) T

	clock  clockwork.Clock
	stride int64 // parallelism: distance between two indices of this subtask
	sub    int64 // subtask index
	next   int64 // next global index to emit
	posSet bool  // SetPosition was called before Open

	// Rate limiting; interval is 0 when unlimited.
	interval   float64   // nanoseconds between two records of this subtask
	schedStart time.Time // when the local record 0 of the schedule is due
	emitted    int64     // records emitted since schedStart

	// wait is the channel last returned by Available, closed by timer
	// (on another goroutine) when the next record is due.
	wait  chan struct{}
	timer clockwork.Timer
	ready chan struct{} // always closed
}

var _ Source[int64] = (*Generator[int64])(nil)

// NewGenerator returns a Generator that emits gen(i) for the indices of its
// subtask. gen must be deterministic and is called on the subtask's
// goroutine. The configuration is validated by Open.
func NewGenerator[T any](cfg GeneratorConfig, gen func(i int64) T) *Generator[T] {
	ready := make(chan struct{})
	close(ready)
	return &Generator[T]{cfg: cfg.withDefaults(), gen: gen, stride: 1, ready: ready}
}

// SensorGenerator returns a Generator of SensorReadings: record i has ID
// "sensor_<i mod Keys>", Timestamp Start + i/Keys and a Temperature in
// [20, 40) that is a hash of i with two decimals. The ID strings are built
// here, once, so emitting a record allocates nothing.
func SensorGenerator(cfg GeneratorConfig) *Generator[SensorReading] {
	cfg = cfg.withDefaults()
	ids := make([]string, max(cfg.Keys, 1)) // Keys < 0 is rejected by Open
	for k := range ids {
		ids[k] = "sensor_" + strconv.Itoa(k)
	}
	keys, start := int64(len(ids)), cfg.Start
	return NewGenerator(cfg, func(i int64) SensorReading {
		return SensorReading{
			ID:          ids[i%keys],
			Timestamp:   start + i/keys,
			Temperature: float64(2000+splitmix64(uint64(i))%2000) / 100,
		}
	})
}

// splitmix64 is the finaliser of the SplitMix64 generator: a fixed,
// well-mixed hash of x.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Open validates the configuration, picks this subtask's indices and starts
// the rate schedule at ctx.Clock's now.
func (g *Generator[T]) Open(ctx *Context) error {
	if err := g.cfg.Validate(); err != nil {
		return err
	}
	if g.gen == nil {
		return errors.New("generator: the record function is nil: give NewGenerator a func(i int64) T")
	}
	p := max(ctx.Parallelism, 1)
	if ctx.Subtask < 0 || ctx.Subtask >= p {
		return fmt.Errorf("generator: subtask %d out of range [0,%d)", ctx.Subtask, p)
	}
	g.sub, g.stride = int64(ctx.Subtask), int64(p)
	if g.posSet {
		g.next = g.align(g.next)
	} else {
		g.next = g.sub
	}
	g.clock = ctx.Clock
	if g.clock == nil {
		g.clock = clockwork.NewRealClock()
	}
	if g.cfg.Rate > 0 {
		g.interval = 1e9 * float64(p) / g.cfg.Rate
	}
	g.schedStart, g.emitted = g.clock.Now(), 0
	return nil
}

// Finish does nothing.
func (g *Generator[T]) Finish() error { return nil }

// Close stops the timer of a pending Available channel and closes that
// channel, so nothing waits on it forever.
func (g *Generator[T]) Close() error {
	g.cancelWait()
	return nil
}

// Position returns the global index of the next record this subtask will
// emit (Count or more when it is done). Before Open it returns what
// SetPosition set, or 0. A checkpoint stores it; a restore passes it to
// SetPosition.
func (g *Generator[T]) Position() int64 { return g.next }

// SetPosition makes i the next global index to emit, rounded up to the
// next index of this subtask (i ≡ subtask mod parallelism), so a position
// taken from the same subtask at the same parallelism is kept exactly.
// Called before Open (a restore) or between Polls; a negative i means 0.
// After Open it also restarts the rate schedule at the clock's now.
func (g *Generator[T]) SetPosition(i int64) {
	if g.clock == nil { // not open yet: Open aligns it
		g.next, g.posSet = max(i, 0), true
		return
	}
	g.next = g.align(i)
	g.schedStart, g.emitted = g.clock.Now(), 0
	g.cancelWait()
}

// align returns the least index >= i (and >= 0) of this subtask.
func (g *Generator[T]) align(i int64) int64 {
	if i <= g.sub {
		return g.sub
	}
	return i + (g.sub-i%g.stride+g.stride)%g.stride
}

// done reports whether this subtask has emitted all its records.
func (g *Generator[T]) done() bool {
	return g.cfg.Count > 0 && g.next >= g.cfg.Count
}

// Poll emits up to limit records: all it may emit without a rate, else those
// due by ctx.Clock's now.
func (g *Generator[T]) Poll(out Collector[T], limit int) (Status, error) {
	if g.done() {
		return EndOfInput, nil
	}
	n := int64(max(limit, 1))
	more := true // more may be emitted at once after this Poll
	if g.interval > 0 {
		due := g.dueBy(g.clock.Now()) - g.emitted
		if due <= 0 {
			return NothingAvailable, nil
		}
		more = due > n
		n = min(n, due)
	}
	if c := g.cfg.Count; c > 0 {
		// Records left for this subtask: indices next, next+stride, ... < c.
		n = min(n, (c-g.next+g.stride-1)/g.stride)
	}
	i, stride := g.next, g.stride
	for range n {
		out.Collect(g.gen(i))
		i += stride
	}
	g.next = i
	g.emitted += n
	switch {
	case g.done():
		return EndOfInput, nil
	case more:
		return MoreAvailable, nil
	default:
		return NothingAvailable, nil
	}
}

// Available returns a channel that is closed when the next record is due.
// Without a rate, or when a record is due already, the channel is closed.
func (g *Generator[T]) Available() <-chan struct{} {
	if g.interval == 0 || g.done() {
		return g.ready
	}
	if g.wait != nil {
		select {
		case <-g.wait: // fired; arm a new one below
			g.wait, g.timer = nil, nil
		default:
			// Still pending: it was armed for an earlier or the same
			// record, so it fires no later than needed.
			return g.wait
		}
	}
	d := g.dueAt(g.emitted).Sub(g.clock.Now())
	if d <= 0 {
		return g.ready
	}
	ch := make(chan struct{})
	g.wait = ch
	g.timer = g.clock.AfterFunc(d, func() { close(ch) })
	return ch
}

// cancelWait stops a pending Available timer and closes its channel, which
// at worst wakes a waiter early.
func (g *Generator[T]) cancelWait() {
	if g.timer != nil && g.timer.Stop() {
		close(g.wait)
	}
	g.wait, g.timer = nil, nil
}

// maxOffset bounds schedule offsets so that float to Duration conversion
// cannot overflow (about 146 years).
const maxOffset = float64(1 << 62)

// dueAt returns when the local record k of the schedule is due.
func (g *Generator[T]) dueAt(k int64) time.Time {
	off := math.Ceil(float64(k) * g.interval)
	if off >= maxOffset {
		off = maxOffset
	}
	return g.schedStart.Add(time.Duration(off))
}

// dueBy returns how many records of the schedule are due at now: the
// number of k >= 0 with dueAt(k) <= now. It agrees with dueAt exactly.
func (g *Generator[T]) dueBy(now time.Time) int64 {
	elapsed := now.Sub(g.schedStart)
	if elapsed < 0 {
		return 0
	}
	if float64(elapsed) >= maxOffset {
		return math.MaxInt64 / 2 // everything is due
	}
	k := int64(float64(elapsed) / g.interval) // estimate of the last due k
	for k > 0 && g.dueAt(k).After(now) {
		k--
	}
	for !g.dueAt(k + 1).After(now) {
		k++
	}
	return k + 1
}

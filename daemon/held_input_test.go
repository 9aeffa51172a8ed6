package daemon

import (
	"math"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/pipeline"
)

// heldGenerator is a generator holding its input at position holdAt, and
// its end of input, until released is closed: the input does not end
// before the steps a test takes on the running job have run, however
// slowly the machine runs it. A held source has nothing available;
// barriers still pass.
type heldGenerator[T any] struct {
	*operators.Generator[T]
	holdAt   int64
	released <-chan struct{}
	held     bool
}

func (g *heldGenerator[T]) free() bool {
	select {
	case <-g.released:
		return true
	default:
		return false
	}
}

func (g *heldGenerator[T]) Poll(out operators.Collector[T], limit int) (operators.Status, error) {
	g.held = false
	if !g.free() {
		left := g.holdAt - g.Position()
		if left <= 0 {
			g.held = true
			return operators.NothingAvailable, nil
		}
		limit = int(min(int64(limit), left))
	}
	st, err := g.Generator.Poll(out, limit)
	if st == operators.EndOfInput && err == nil && !g.free() {
		// Emitted its last records: the end waits for the release too.
		g.held = true
		return operators.NothingAvailable, nil
	}
	return st, err
}

func (g *heldGenerator[T]) Available() <-chan struct{} {
	if g.held {
		return g.released
	}
	return g.Generator.Available()
}

// holdGeneratorEnds makes every generator source of the pipeline job g
// (a node's graphHook) a heldGenerator that emits all its records and
// ends its input only once released is closed.
func holdGeneratorEnds(g *actors.Job, released <-chan struct{}) {
	for _, v := range g.Vertices {
		if !v.IsSource() {
			continue
		}
		newSource := v.NewSource
		v.NewSource = func(ctx *operators.Context) (operators.Operator, error) {
			src, err := newSource(ctx)
			if gen, ok := src.(*operators.Generator[pipeline.Row]); ok && err == nil {
				return &heldGenerator[pipeline.Row]{Generator: gen, holdAt: math.MaxInt64, released: released}, nil
			}
			return src, err
		}
	}
}

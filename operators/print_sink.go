package operators

import (
	"errors"
	"fmt"
	"io"
	"strconv"
)

// printFlushSize is the number of buffered bytes at which a PrintSink
// writes to its writer.
const printFlushSize = 4096

// PrintSink writes one line per record, format(v) followed by "\n", to a
// writer, like Flink's print sink: when the operator's parallelism is
// greater than 1, each line starts with the 1-based subtask number and
// "> " ("2> sensor_1,1547718199,35.8"); with parallelism 1 it has no
// prefix.
//
// Lines are buffered and written when about 4 KiB have accumulated, when
// the task has no more input waiting (Flush), on Finish and on Close. Every Write carries whole lines, so the subtasks of
// one print operator may share a writer such as os.Stdout without tearing
// lines apart; a shared writer must be safe for concurrent Writes. A write
// error fails the task.
type PrintSink[T any] struct {
	w      io.Writer
	format func(T) string
	prefix string
	buf    []byte // whole lines not yet written
}

var (
	_ Sink[string] = (*PrintSink[string])(nil)
	_ Flusher      = (*PrintSink[string])(nil)
)

// NewPrintSink returns a sink that writes format(v) for each record v to w.
// format is called on the subtask's goroutine.
func NewPrintSink[T any](w io.Writer, format func(T) string) *PrintSink[T] {
	return &PrintSink[T]{w: w, format: format}
}

// Open chooses the line prefix from the subtask and parallelism.
func (p *PrintSink[T]) Open(ctx *Context) error {
	switch {
	case p.w == nil:
		return errors.New("print sink: the writer is nil: give NewPrintSink an io.Writer such as os.Stdout")
	case p.format == nil:
		return errors.New("print sink: the format function is nil: give NewPrintSink a func(T) string")
	}
	if ctx.Parallelism > 1 {
		p.prefix = strconv.Itoa(ctx.Subtask+1) + "> "
	}
	p.buf = make([]byte, 0, 2*printFlushSize)
	return nil
}

// Collect buffers the line of v, writing the buffer once it is full.
func (p *PrintSink[T]) Collect(v T) {
	p.buf = append(p.buf, p.prefix...)
	p.buf = append(p.buf, p.format(v)...)
	p.buf = append(p.buf, '\n')
	if len(p.buf) >= printFlushSize {
		if err := p.flush(); err != nil {
			Fail(err)
		}
	}
}

// Flush writes the buffered lines.
func (p *PrintSink[T]) Flush() error { return p.flush() }

// Finish writes the buffered lines.
func (p *PrintSink[T]) Finish() error { return p.flush() }

// Close writes the buffered lines.
func (p *PrintSink[T]) Close() error { return p.flush() }

func (p *PrintSink[T]) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	_, err := p.w.Write(p.buf)
	p.buf = p.buf[:0]
	if err != nil {
		return fmt.Errorf("print sink: %w", err)
	}
	return nil
}

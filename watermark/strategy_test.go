package watermark

import (
	"errors"
	"strings"
	"testing"
	"time"
)

type reading struct{ at int64 }

func readingTime(r reading) int64 { return r.at }

func TestStrategyValidate(t *testing.T) {
	bounded := ForBoundedOutOfOrderness(5*time.Second, readingTime)
	tests := []struct {
		name string
		s    Strategy[reading]
		// want holds one substring per expected problem; none means valid.
		want []string
	}{
		{name: "bounded", s: bounded},
		{name: "monotonous", s: ForMonotonous(readingTime)},
		{name: "custom", s: ForGenerator(readingTime, NewMonotonous)},
		{name: "zero delay", s: ForBoundedOutOfOrderness(0, readingTime)},
		{name: "idleness", s: bounded.WithIdleness(time.Minute)},
		{name: "no idleness", s: bounded.WithIdleness(0)},
		{name: "interval", s: bounded.WithInterval(time.Second)},
		{name: "default interval", s: bounded.WithInterval(0)},
		{name: "1ms interval", s: bounded.WithInterval(time.Millisecond)},
		{name: "literal with defaults", s: Strategy[reading]{Timestamp: readingTime, NewGenerator: NewMonotonous}},
		{name: "nil timestamp", s: ForMonotonous[reading](nil), want: []string{"timestamp must be set"}},
		{name: "nil generator", s: ForGenerator(readingTime, nil), want: []string{"generator must be set"}},
		{
			name: "negative delay",
			s:    ForBoundedOutOfOrderness(-time.Second, readingTime),
			want: []string{"max_out_of_orderness (-1s) must not be negative"},
		},
		{
			name: "negative idle timeout",
			s:    bounded.WithIdleness(-time.Second),
			want: []string{"idle_timeout (-1s) must not be negative"},
		},
		{
			name: "negative interval",
			s:    bounded.WithInterval(-time.Millisecond),
			want: []string{"interval (-1ms) must be 0 (default 200ms) or at least 1ms"},
		},
		{
			name: "sub-millisecond interval",
			s:    bounded.WithInterval(time.Microsecond),
			want: []string{"interval (1µs)"},
		},
		{
			name: "zero value",
			s:    Strategy[reading]{},
			want: []string{"timestamp must be set", "generator must be set"},
		},
		{
			name: "everything wrong at once",
			s:    ForBoundedOutOfOrderness[reading](-time.Second, nil).WithIdleness(-time.Second).WithInterval(-time.Second),
			want: []string{"timestamp", "max_out_of_orderness", "idle_timeout", "interval"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %q", tt.want)
			}
			if !errors.Is(err, ErrInvalidStrategy) {
				t.Errorf("Validate() = %v, does not wrap ErrInvalidStrategy", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("Validate() reported %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestStrategyConstructors(t *testing.T) {
	s := ForBoundedOutOfOrderness(3*time.Millisecond, readingTime)
	if s.Interval != DefaultInterval || s.IdleTimeout != 0 {
		t.Errorf("defaults: interval %s idle %s, want %s and 0", s.Interval, s.IdleTimeout, DefaultInterval)
	}
	if got := s.Timestamp(reading{at: 42}); got != 42 {
		t.Errorf("Timestamp = %d, want 42", got)
	}
	g := s.NewGenerator()
	g.OnEvent(100)
	if wm, ok := g.OnPeriodicEmit(); !ok || wm != 96 {
		t.Errorf("bounded(3ms) after 100: %d %t, want 96 true", wm, ok)
	}
	if s.NewGenerator() == g {
		t.Error("NewGenerator returned the same generator twice")
	}

	m := ForMonotonous(readingTime).NewGenerator()
	m.OnEvent(100)
	if wm, ok := m.OnPeriodicEmit(); !ok || wm != 99 {
		t.Errorf("monotonous after 100: %d %t, want 99 true", wm, ok)
	}

	// With methods return copies.
	w := s.WithIdleness(time.Second).WithInterval(time.Second)
	if s.IdleTimeout != 0 || s.Interval != DefaultInterval {
		t.Errorf("With methods changed the receiver: %+v", s)
	}
	if w.IdleTimeout != time.Second || w.Interval != time.Second {
		t.Errorf("With methods: idle %s interval %s, want 1s and 1s", w.IdleTimeout, w.Interval)
	}
}

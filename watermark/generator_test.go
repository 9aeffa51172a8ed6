package watermark

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/script"
)

// TestGeneratorScripts runs testdata/generator_*.txt. Commands:
//
//	bounded delay=D     a NewBoundedOutOfOrderness(D) generator
//	monotonous          a NewMonotonous generator
//	event ts=T[,T...]   OnEvent for each timestamp (min and max allowed)
//	emit                OnPeriodicEmit
func TestGeneratorScripts(t *testing.T) {
	script.Run(t, "testdata/generator_*.txt", func(*testing.T) func(*script.Command) (string, error) {
		var g Generator
		return func(c *script.Command) (string, error) {
			if g == nil && c.Name != "bounded" && c.Name != "monotonous" {
				return "", errors.New("no generator: start with bounded or monotonous")
			}
			switch c.Name {
			case "bounded":
				d, err := c.Duration("delay")
				if err != nil {
					return "", err
				}
				g = NewBoundedOutOfOrderness(d)
				return "ok", nil
			case "monotonous":
				g = NewMonotonous()
				return "ok", nil
			case "event":
				ts, err := times(c, "ts")
				if err != nil {
					return "", err
				}
				for _, t := range ts {
					g.OnEvent(t)
				}
				return "ok", nil
			case "emit":
				wm, ok := g.OnPeriodicEmit()
				if !ok {
					return fmt.Sprintf("nothing (last %s)", fmtTime(wm)), nil
				}
				return "wm=" + fmtTime(wm), nil
			}
			return "", fmt.Errorf("unknown command %q", c.Name)
		}
	})
}

func TestNewBoundedOutOfOrdernessPanicsOnNegative(t *testing.T) {
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "-1ms") {
			t.Fatalf("recovered %v, want a panic naming -1ms", r)
		}
	}()
	NewBoundedOutOfOrderness(-time.Millisecond)
}

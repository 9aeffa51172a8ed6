package watermark

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestGeneratorScripts runs testdata/generator_*.txt. Commands:
//
//	bounded delay=D     a NewBoundedOutOfOrderness(D) generator
//	monotonous          a NewMonotonous generator
//	event ts=T[,T...]   OnEvent for each timestamp (min and max allowed)
//	emit                OnPeriodicEmit
func TestGeneratorScripts(t *testing.T) {
	runScripts(t, "generator_*.txt", func() func(*command) (string, error) {
		var g Generator
		return func(c *command) (string, error) {
			if g == nil && c.name != "bounded" && c.name != "monotonous" {
				return "", errors.New("no generator: start with bounded or monotonous")
			}
			switch c.name {
			case "bounded":
				if err := c.checkArgs("delay"); err != nil {
					return "", err
				}
				d, err := c.duration("delay")
				if err != nil {
					return "", err
				}
				g = NewBoundedOutOfOrderness(d)
				return "ok", nil
			case "monotonous":
				if err := c.checkArgs(); err != nil {
					return "", err
				}
				g = NewMonotonous()
				return "ok", nil
			case "event":
				if err := c.checkArgs("ts"); err != nil {
					return "", err
				}
				ts, err := c.times("ts")
				if err != nil {
					return "", err
				}
				for _, t := range ts {
					g.OnEvent(t)
				}
				return "ok", nil
			case "emit":
				if err := c.checkArgs(); err != nil {
					return "", err
				}
				wm, ok := g.OnPeriodicEmit()
				if !ok {
					return fmt.Sprintf("nothing (last %s)", fmtTime(wm)), nil
				}
				return "wm=" + fmtTime(wm), nil
			}
			return "", fmt.Errorf("unknown command %q", c.name)
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

package watermark

import (
	"errors"
	"fmt"
	"testing"

	"github.com/edgedio/edged/internal/script"
)

// TestIdleDetectorScripts runs testdata/idle_*.txt. Commands:
//
//	detector timeout=D  a NewIdleDetector(D)
//	event now=MS        OnEvent at processing time MS
//	check now=MS        Check at processing time MS
func TestIdleDetectorScripts(t *testing.T) {
	script.Run(t, "testdata/idle_*.txt", func(*testing.T) func(*script.Command) (string, error) {
		var d *IdleDetector
		return func(c *script.Command) (string, error) {
			if d == nil && c.Name != "detector" {
				return "", errors.New("no detector: start with detector")
			}
			switch c.Name {
			case "detector":
				timeout, err := c.Duration("timeout")
				if err != nil {
					return "", err
				}
				d = NewIdleDetector(timeout)
				return fmt.Sprintf("idle=%t", d.Idle()), nil
			case "event":
				now, err := times(c, "now")
				if err != nil {
					return "", err
				}
				if len(now) != 1 {
					return "", c.Errorf("needs one now=")
				}
				changed := d.OnEvent(now[0])
				return fmt.Sprintf("changed=%t idle=%t", changed, d.Idle()), nil
			case "check":
				now, err := times(c, "now")
				if err != nil {
					return "", err
				}
				if len(now) != 1 {
					return "", c.Errorf("needs one now=")
				}
				idle, changed := d.Check(now[0])
				if idle != d.Idle() {
					return "", fmt.Errorf("Check said idle=%t but Idle is %t", idle, d.Idle())
				}
				return fmt.Sprintf("idle=%t changed=%t", idle, changed), nil
			}
			return "", fmt.Errorf("unknown command %q", c.Name)
		}
	})
}

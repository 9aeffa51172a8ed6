package watermark

import (
	"errors"
	"fmt"
	"testing"
)

// TestIdleDetectorScripts runs testdata/idle_*.txt. Commands:
//
//	detector timeout=D  a NewIdleDetector(D)
//	event now=MS        OnEvent at processing time MS
//	check now=MS        Check at processing time MS
func TestIdleDetectorScripts(t *testing.T) {
	runScripts(t, "idle_*.txt", func() func(*command) (string, error) {
		var d *IdleDetector
		return func(c *command) (string, error) {
			if d == nil && c.name != "detector" {
				return "", errors.New("no detector: start with detector")
			}
			switch c.name {
			case "detector":
				if err := c.checkArgs("timeout"); err != nil {
					return "", err
				}
				timeout, err := c.duration("timeout")
				if err != nil {
					return "", err
				}
				d = NewIdleDetector(timeout)
				return fmt.Sprintf("idle=%t", d.Idle()), nil
			case "event":
				if err := c.checkArgs("now"); err != nil {
					return "", err
				}
				now, err := c.times("now")
				if err != nil || len(now) != 1 {
					return "", fmt.Errorf("event needs one now= (%v)", err)
				}
				changed := d.OnEvent(now[0])
				return fmt.Sprintf("changed=%t idle=%t", changed, d.Idle()), nil
			case "check":
				if err := c.checkArgs("now"); err != nil {
					return "", err
				}
				now, err := c.times("now")
				if err != nil || len(now) != 1 {
					return "", fmt.Errorf("check needs one now= (%v)", err)
				}
				idle, changed := d.Check(now[0])
				if idle != d.Idle() {
					return "", fmt.Errorf("Check said idle=%t but Idle is %t", idle, d.Idle())
				}
				return fmt.Sprintf("idle=%t changed=%t", idle, changed), nil
			}
			return "", fmt.Errorf("unknown command %q", c.name)
		}
	})
}

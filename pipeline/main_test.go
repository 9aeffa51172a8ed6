package pipeline

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgedio/edged/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// A paho client disconnected while it waits to reconnect ends its
		// reconnect goroutine only after that wait (1 s at first), longer
		// than goleak's own retries: a CI run failed on it. Wait for the
		// goroutines to end, bounded.
		var err error
		testutil.Within(10*time.Second, func() bool { err = goleak.Find(); return err == nil })
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

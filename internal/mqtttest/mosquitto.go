package mqtttest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgedio/edged/internal/testutil"
)

// StartMosquitto starts a Mosquitto broker for tb on a free 127.0.0.1 port,
// without persistence, with conf appended to its config (one directive per
// line), and returns its address and pid; the broker is killed when tb
// ends. tb skips when mosquitto is not installed (scripts/test.sh
// installs it where it can).
func StartMosquitto(tb testing.TB, conf string) (addr string, pid int) {
	tb.Helper()
	bin := MosquittoBin(tb)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	path := filepath.Join(tb.TempDir(), "mosquitto.conf")
	body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n%s", port, conf)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start mosquitto: %v", err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	testutil.Eventually(tb, 10*time.Second, "mosquitto listening on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr, cmd.Process.Pid
}

// MosquittoBin returns the path of the mosquitto binary (on PATH, or
// Debian's /usr/sbin/mosquitto, which a user's PATH may lack); tb skips
// when mosquitto is not installed.
func MosquittoBin(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr != nil {
			tb.Skip("mosquitto is not installed")
		}
		bin = "/usr/sbin/mosquitto"
	}
	return bin
}

package watermark

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripts in testdata/*.txt are datadriven tests in the style of etcd
// raft: each case is a command line, a "----" line and the expected output,
// ending at a blank line. Lines starting with # and blank lines between
// cases are kept as they are. Run
//
//	go test ./watermark/ -run Script -update
//
// to rewrite the expected output with what the machines print.
var update = flag.Bool("update", false, "rewrite the expected output of testdata/*.txt")

// scriptCase is one command of a script and its expected output.
type scriptCase struct {
	pre  []string // comment and blank lines before the command
	cmd  string
	line int
	want string
}

// command is a parsed command line: a name and key=value arguments.
type command struct {
	pos  string
	name string
	args map[string]string
}

// parseScript splits a script into cases; trailing comment lines are
// returned separately.
func parseScript(t *testing.T, path, text string) (cases []scriptCase, trailer []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		c := scriptCase{pre: pre, cmd: l, line: i + 1}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command not followed by ----", path, i+1)
		}
		i += 2
		var out []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		c.want = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases, pre
}

// runScripts runs every testdata file matching pattern, each with a fresh
// handler from newHandler; a handler returns the output of one command.
func runScripts(t *testing.T, pattern string, newHandler func() func(*command) (string, error)) {
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts match testdata/%s", pattern)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cases, trailer := parseScript(t, path, string(data))
			handle := newHandler()
			var b strings.Builder
			for i, c := range cases {
				pos := fmt.Sprintf("%s:%d", path, c.line)
				cmd, err := parseCommand(pos, c.cmd)
				if err != nil {
					t.Fatal(err)
				}
				got, err := handle(cmd)
				if err != nil {
					t.Fatalf("%s: %s: %v", pos, c.cmd, err)
				}
				got = strings.TrimRight(got, "\n")
				if !*update && got != c.want {
					t.Errorf("%s: %s\nwant:\n%s\ngot:\n%s", pos, c.cmd, c.want, got)
				}
				for _, l := range c.pre {
					b.WriteString(l + "\n")
				}
				b.WriteString(c.cmd + "\n----\n" + got + "\n")
				if i < len(cases)-1 || len(trailer) > 0 {
					b.WriteString("\n")
				}
			}
			for _, l := range trailer {
				b.WriteString(l + "\n")
			}
			if *update && b.String() != string(data) {
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("rewrote %s", path)
			}
		})
	}
}

// parseCommand splits "name k=v k=v".
func parseCommand(pos, line string) (*command, error) {
	fields := strings.Fields(line)
	cmd := &command{pos: pos, name: fields[0], args: map[string]string{}}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%s: argument %q is not key=value", pos, f)
		}
		if _, dup := cmd.args[k]; dup {
			return nil, fmt.Errorf("%s: argument %q repeated", pos, k)
		}
		cmd.args[k] = v
	}
	return cmd, nil
}

// arg returns argument key, or an error if it is missing.
func (c *command) arg(key string) (string, error) {
	v, ok := c.args[key]
	if !ok {
		return "", fmt.Errorf("%s needs %s=", c.name, key)
	}
	return v, nil
}

// int returns argument key as an int.
func (c *command) int(key string) (int, error) {
	v, err := c.arg(key)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// duration returns argument key as a time.Duration.
func (c *command) duration(key string) (time.Duration, error) {
	v, err := c.arg(key)
	if err != nil {
		return 0, err
	}
	return time.ParseDuration(v)
}

// times returns argument key as a comma-separated list of event times,
// where "min" and "max" stand for MinWatermark and MaxWatermark.
func (c *command) times(key string) ([]int64, error) {
	v, err := c.arg(key)
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, s := range strings.Split(v, ",") {
		ts, err := parseTime(s)
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", key, v, err)
		}
		out = append(out, ts)
	}
	return out, nil
}

// checkArgs fails on arguments the command does not know.
func (c *command) checkArgs(known ...string) error {
	for k := range c.args {
		found := false
		for _, n := range known {
			found = found || k == n
		}
		if !found {
			return fmt.Errorf("%s: unknown argument %q", c.name, k)
		}
	}
	return nil
}

func parseTime(s string) (int64, error) {
	switch s {
	case "min":
		return MinWatermark, nil
	case "max":
		return MaxWatermark, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// fmtTime prints an event time, with min and max for the sentinels.
func fmtTime(ts int64) string {
	switch ts {
	case MinWatermark:
		return "min"
	case MaxWatermark:
		return "max"
	}
	return strconv.FormatInt(ts, 10)
}

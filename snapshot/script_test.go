package snapshot

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

// The scripts in testdata/<machine>/*.txt are datadriven tests in the style
// of etcd raft: each case is a command line, a "----" line and the expected
// output, ending at a blank line. Lines starting with # and blank lines
// between cases are kept as they are. Run
//
//	go test ./snapshot/ -run Script -update
//
// to rewrite the expected output with what the machines print.
var update = flag.Bool("update", false, "rewrite the expected output of testdata scripts")

// scriptCase is one command of a script and its expected output.
type scriptCase struct {
	pre  []string // comment and blank lines before the command
	cmd  string
	line int
	want string
}

// command is a parsed command line: a name and key=value arguments.
type command struct {
	name string
	args map[string]string
	used map[string]bool
}

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

// runScripts runs every script in testdata/dir, each with a fresh handler
// from newHandler; a handler returns the output of one command.
func runScripts(t *testing.T, dir string, newHandler func(t *testing.T) func(*command) (string, error)) {
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts in testdata/%s", dir)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cases, trailer := parseScript(t, path, string(data))
			handle := newHandler(t)
			var b strings.Builder
			for i, c := range cases {
				pos := fmt.Sprintf("%s:%d", path, c.line)
				cmd, err := parseCommand(c.cmd)
				if err != nil {
					t.Fatalf("%s: %v", pos, err)
				}
				got, err := handle(cmd)
				if err == nil {
					err = cmd.unused()
				}
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
				b.WriteString(c.cmd + "\n----\n")
				if got != "" {
					b.WriteString(got + "\n")
				}
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
func parseCommand(line string) (*command, error) {
	fields := strings.Fields(line)
	cmd := &command{name: fields[0], args: map[string]string{}, used: map[string]bool{}}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("argument %q is not key=value", f)
		}
		if _, dup := cmd.args[k]; dup {
			return nil, fmt.Errorf("argument %q repeated", k)
		}
		cmd.args[k] = v
	}
	return cmd, nil
}

// unused fails on arguments the handler did not read.
func (c *command) unused() error {
	for k := range c.args {
		if !c.used[k] {
			return fmt.Errorf("%s: unknown argument %q", c.name, k)
		}
	}
	return nil
}

// lookup returns argument key and whether it was given.
func (c *command) lookup(key string) (string, bool) {
	c.used[key] = true
	v, ok := c.args[key]
	return v, ok
}

// str returns argument key, or def if it is missing.
func (c *command) str(key, def string) string {
	if v, ok := c.lookup(key); ok {
		return v
	}
	return def
}

// int returns argument key as an int, or def if it is missing.
func (c *command) int(key string, def int) (int, error) {
	v, ok := c.lookup(key)
	if !ok {
		return def, nil
	}
	return strconv.Atoi(v)
}

// duration returns argument key as a time.Duration, or def.
func (c *command) duration(key string, def time.Duration) (time.Duration, error) {
	v, ok := c.lookup(key)
	if !ok {
		return def, nil
	}
	return time.ParseDuration(v)
}

// bool returns argument key as a bool, or false.
func (c *command) bool(key string) (bool, error) {
	v, ok := c.lookup(key)
	if !ok {
		return false, nil
	}
	return strconv.ParseBool(v)
}

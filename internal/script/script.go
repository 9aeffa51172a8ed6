package script

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the expected output of datadriven test scripts")

// Run runs the scripts named by pattern, each as a subtest named after its
// file, with a fresh handler from newHandler. pattern is a directory, whose
// *.txt files are run, or a filepath.Glob pattern; relative paths are from
// the package directory, as usual in tests. The handler returns the output
// of one command; an error from it, or an argument it did not read, fails
// the script at that command.
//
// With -update, Run writes the handlers' outputs into the scripts instead
// of comparing them.
func Run(t *testing.T, pattern string, newHandler func(t *testing.T) func(*Command) (string, error)) {
	t.Helper()
	if fi, err := os.Stat(pattern); err == nil && fi.IsDir() {
		pattern = filepath.Join(pattern, "*.txt")
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts match %s", pattern)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got, diffs, err := runFile(path, string(data), newHandler(t))
			if !*update {
				for _, d := range diffs {
					t.Error(d)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if *update && got != string(data) {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("rewrote %s", path)
			}
		})
	}
}

// testCase is one command of a script and its expected output.
type testCase struct {
	pre  []string // comment and blank lines before the command
	cmd  string
	line int
	want string
}

// parse splits a script into cases; comment lines after the last case are
// returned separately.
func parse(path, text string) (cases []testCase, trailer []string, err error) {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		c := testCase{pre: pre, cmd: l, line: i + 1}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			return nil, nil, fmt.Errorf("%s:%d: command not followed by ----", path, i+1)
		}
		i += 2
		var out []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		c.want = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases, pre, nil
}

// runFile runs the script text, read from path, through handle. It returns
// the script with the handler's outputs as expected outputs, one message
// per output that differs from the expected one, and an error if a command
// could not run; the rewritten script is then incomplete.
func runFile(path, text string, handle func(*Command) (string, error)) (string, []string, error) {
	cases, trailer, err := parse(path, text)
	if err != nil {
		return "", nil, err
	}
	var b strings.Builder
	var diffs []string
	for i, c := range cases {
		pos := fmt.Sprintf("%s:%d", path, c.line)
		cmd, err := parseCommand(pos, c.cmd)
		if err != nil {
			return "", diffs, err
		}
		got, err := handle(cmd)
		if err == nil {
			err = cmd.unused()
		}
		if err != nil {
			var ce *cmdError
			if !errors.As(err, &ce) {
				err = fmt.Errorf("%s: %s: %w", pos, c.cmd, err)
			}
			return "", diffs, err
		}
		got = strings.TrimRight(got, "\n")
		if got != c.want {
			diffs = append(diffs, fmt.Sprintf("%s: %s\nwant:\n%s\ngot:\n%s", pos, c.cmd, c.want, got))
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
	return b.String(), diffs, nil
}

// Command is one parsed command line of a script: "name key=value ...".
type Command struct {
	Name string
	Args map[string]string

	pos  string // file:line of the command
	used map[string]bool
}

func parseCommand(pos, line string) (*Command, error) {
	fields := strings.Fields(line)
	c := &Command{Name: fields[0], Args: map[string]string{}, pos: pos, used: map[string]bool{}}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, c.Errorf("argument %q is not key=value", f)
		}
		if _, dup := c.Args[k]; dup {
			return nil, c.Errorf("argument %q repeated", k)
		}
		c.Args[k] = v
	}
	return c, nil
}

// cmdError is an error that already names the script file, line and command.
type cmdError struct {
	pos, name string
	err       error
}

func (e *cmdError) Error() string { return e.pos + ": " + e.name + ": " + e.err.Error() }
func (e *cmdError) Unwrap() error { return e.err }

// Errorf returns an error naming the script file and line and the command,
// followed by the formatted message; %w works as in fmt.Errorf.
func (c *Command) Errorf(format string, args ...any) error {
	return &cmdError{pos: c.pos, name: c.Name, err: fmt.Errorf(format, args...)}
}

// unused fails on arguments the handler did not read.
func (c *Command) unused() error {
	var keys []string
	for k := range c.Args {
		if !c.used[k] {
			keys = append(keys, strconv.Quote(k))
		}
	}
	switch len(keys) {
	case 0:
		return nil
	case 1:
		return c.Errorf("unknown argument %s", keys[0])
	}
	sort.Strings(keys)
	return c.Errorf("unknown arguments %s", strings.Join(keys, ", "))
}

// Has reports whether argument key was given. It does not count as reading
// the argument.
func (c *Command) Has(key string) bool {
	_, ok := c.Args[key]
	return ok
}

// Lookup returns argument key and whether it was given, and marks it read.
func (c *Command) Lookup(key string) (string, bool) {
	c.used[key] = true
	v, ok := c.Args[key]
	return v, ok
}

// String returns argument key, or an error if it is missing.
func (c *Command) String(key string) (string, error) {
	return required(c, key, func(s string) (string, error) { return s, nil })
}

// StringOr returns argument key, or def if it is missing.
func (c *Command) StringOr(key, def string) string {
	if v, ok := c.Lookup(key); ok {
		return v
	}
	return def
}

// Int returns argument key as an int.
func (c *Command) Int(key string) (int, error) { return required(c, key, strconv.Atoi) }

// IntOr returns argument key as an int, or def if it is missing.
func (c *Command) IntOr(key string, def int) (int, error) {
	return optional(c, key, def, strconv.Atoi)
}

// Int64 returns argument key as an int64.
func (c *Command) Int64(key string) (int64, error) { return required(c, key, parseInt64) }

// Int64Or returns argument key as an int64, or def if it is missing.
func (c *Command) Int64Or(key string, def int64) (int64, error) {
	return optional(c, key, def, parseInt64)
}

// Duration returns argument key as a time.Duration ("1.5s").
func (c *Command) Duration(key string) (time.Duration, error) {
	return required(c, key, time.ParseDuration)
}

// DurationOr returns argument key as a time.Duration, or def if it is
// missing.
func (c *Command) DurationOr(key string, def time.Duration) (time.Duration, error) {
	return optional(c, key, def, time.ParseDuration)
}

// Bool returns argument key as a bool, as strconv.ParseBool reads it.
func (c *Command) Bool(key string) (bool, error) { return required(c, key, strconv.ParseBool) }

// BoolOr returns argument key as a bool, or def if it is missing.
func (c *Command) BoolOr(key string, def bool) (bool, error) {
	return optional(c, key, def, strconv.ParseBool)
}

func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

func required[T any](c *Command, key string, parse func(string) (T, error)) (T, error) {
	if v, ok := c.Lookup(key); ok {
		return convert(c, key, v, parse)
	}
	var zero T
	return zero, c.Errorf("needs %s=", key)
}

func optional[T any](c *Command, key string, def T, parse func(string) (T, error)) (T, error) {
	if v, ok := c.Lookup(key); ok {
		return convert(c, key, v, parse)
	}
	return def, nil
}

func convert[T any](c *Command, key, v string, parse func(string) (T, error)) (T, error) {
	x, err := parse(v)
	if err != nil {
		var zero T
		return zero, c.Errorf("%s=%s: %w", key, v, err)
	}
	return x, nil
}

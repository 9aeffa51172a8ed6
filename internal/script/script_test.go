package script

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// calc is the handler of testdata/calc.txt. Commands:
//
//	add a=N [b=N]             a+b
//	big n=N [m=N]             n+m in int64
//	wait d=D [unit=ms|s]      d in the unit, then the total waited so far
//	say [text=S] [loud=B]     text, upper-cased if loud
func calc(*testing.T) func(*Command) (string, error) {
	var waited time.Duration
	return func(c *Command) (string, error) {
		switch c.Name {
		case "add":
			a, err := c.Int("a")
			if err != nil {
				return "", err
			}
			b, err := c.IntOr("b", 0)
			if err != nil {
				return "", err
			}
			return fmt.Sprint(a + b), nil
		case "big":
			n, err := c.Int64("n")
			if err != nil {
				return "", err
			}
			m, err := c.Int64Or("m", 0)
			if err != nil {
				return "", err
			}
			return fmt.Sprint(n + m), nil
		case "wait":
			d, err := c.Duration("d")
			if err != nil {
				return "", err
			}
			units := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second}
			unit := c.StringOr("unit", "ms")
			if units[unit] == 0 {
				return "", c.Errorf("unit=%s is not ms or s", unit)
			}
			waited += d
			return fmt.Sprintf("%d%s\nwait=%s", d/units[unit], unit, waited), nil
		case "say":
			text := c.StringOr("text", "")
			loud, err := c.BoolOr("loud", false)
			if err != nil {
				return "", err
			}
			if loud {
				text = strings.ToUpper(text)
			}
			return text, nil
		case "need":
			if _, err := c.Bool("b"); err != nil {
				return "", err
			}
			_, err := c.String("s")
			return "", err
		}
		return "", errors.New("unknown command")
	}
}

func TestRunDir(t *testing.T) { Run(t, "testdata", calc) }

func TestRunGlob(t *testing.T) { Run(t, "testdata/calc*.txt", calc) }

func TestRoundTrip(t *testing.T) {
	data, err := os.ReadFile("testdata/calc.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, diffs, err := runFile("calc.txt", string(data), calc(t))
	if err != nil || len(diffs) > 0 || got != string(data) {
		t.Fatalf("runFile: err %v, diffs %q, rewrote:\n%s", err, diffs, got)
	}

	// Wrong expected outputs are reported and rewritten.
	wrong := strings.Replace(string(data), "\n3\n", "\n4\n", 1)
	wrong = strings.Replace(wrong, "----\nHELLO\n", "----\n", 1)
	got, diffs, err = runFile("calc.txt", wrong, calc(t))
	if err != nil || got != string(data) {
		t.Fatalf("runFile: err %v, rewrote:\n%s", err, got)
	}
	want := []string{
		"calc.txt:3: add a=1 b=2\nwant:\n4\ngot:\n3",
		"calc.txt:29: say text=hello loud=true\nwant:\n\ngot:\nHELLO",
	}
	if fmt.Sprint(diffs) != fmt.Sprint(want) {
		t.Errorf("diffs:\n%q\nwant:\n%q", diffs, want)
	}
}

func TestUpdate(t *testing.T) {
	data, err := os.ReadFile("testdata/calc.txt")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "calc.txt")
	wrong := strings.Replace(string(data), "\n3\n", "\nthree\nlines\nhere\n", 1)
	if err := os.WriteFile(path, []byte(wrong), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(u bool) { *update = u }(*update)
	*update = true
	Run(t, filepath.Dir(path), calc)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(data) {
		t.Errorf("-update wrote:\n%s\nwant:\n%s", got, data)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct{ script, want string }{
		{"add a=1", "x.txt:1: command not followed by ----"},
		{"# c\nadd a=1\n----\n1\n\nadd a=1\n", "x.txt:6: command not followed by ----"},
		{"add a\n----\n", `x.txt:1: add: argument "a" is not key=value`},
		{"add a=1 a=2\n----\n", `x.txt:1: add: argument "a" repeated`},
		{"add a=1\n----\n1\n\nadd b=2\n----\n", "x.txt:5: add: needs a="},
		{"add a=x\n----\n", `x.txt:1: add: a=x: strconv.Atoi: parsing "x": invalid syntax`},
		{"add a=1 b=2.5\n----\n", `x.txt:1: add: b=2.5: strconv.Atoi: parsing "2.5": invalid syntax`},
		{"big n=1e3\n----\n", `x.txt:1: big: n=1e3: strconv.ParseInt: parsing "1e3": invalid syntax`},
		{"wait d=5\n----\n", `x.txt:1: wait: d=5: time: missing unit in duration "5"`},
		{"wait d=1s unit=h\n----\n", "x.txt:1: wait: unit=h is not ms or s"},
		{"say loud=yes\n----\n", `x.txt:1: say: loud=yes: strconv.ParseBool: parsing "yes": invalid syntax`},
		{"need b=true\n----\n", "x.txt:1: need: needs s="},
		{"need s=1\n----\n", "x.txt:1: need: needs b="},
		{"add a=1 c=2\n----\n", `x.txt:1: add: unknown argument "c"`},
		{"add a=1 z=2 c=3\n----\n", `x.txt:1: add: unknown arguments "c", "z"`},
		{"mul a=1 b=2\n----\n", "x.txt:1: mul a=1 b=2: unknown command"},
	} {
		_, _, err := runFile("x.txt", tc.script, calc(t))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: got error %v, want %s", tc.script, err, tc.want)
		}
	}

	// Errorf keeps what it wraps.
	c, err := parseCommand("x.txt:7", "open path=/nowhere")
	if err != nil {
		t.Fatal(err)
	}
	err = c.Errorf("cannot: %w", fs.ErrNotExist)
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != "x.txt:7: open: cannot: file does not exist" {
		t.Errorf("Errorf: %v", err)
	}
	if !c.Has("path") || c.Has("mode") || c.unused() == nil {
		t.Errorf("Has counted as a read, or missed an argument")
	}
	if v, ok := c.Lookup("path"); !ok || v != "/nowhere" || c.unused() != nil {
		t.Errorf("Lookup: %q %t, unused %v", v, ok, c.unused())
	}
}

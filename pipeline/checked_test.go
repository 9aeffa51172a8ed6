package pipeline

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

// The checked integer operators agree with math/big: a result within
// int64 is the exact one, any other is ErrIntOverflow. The operands are
// the int64 edges and seeded random values.
func TestCheckedIntMatchesBig(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	edges := []int64{0, 1, -1, 2, -2, math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, math.MinInt64 + 1,
		math.MaxInt32, math.MinInt32, 1 << 32, -(1 << 32), 3037000499, 3037000500, -3037000500}
	vals := append([]int64(nil), edges...)
	for range 200 {
		vals = append(vals, int64(rng.Uint64())>>rng.IntN(64))
	}
	minI, maxI := big.NewInt(math.MinInt64), big.NewInt(math.MaxInt64)
	for _, op := range []string{"+", "-", "*"} {
		fn := checkedInt(op)
		for _, a := range vals {
			for _, b := range vals {
				want := new(big.Int)
				switch op {
				case "+":
					want.Add(big.NewInt(a), big.NewInt(b))
				case "-":
					want.Sub(big.NewInt(a), big.NewInt(b))
				case "*":
					want.Mul(big.NewInt(a), big.NewInt(b))
				}
				got, err := fn(a, int(b))
				fits := want.Cmp(minI) >= 0 && want.Cmp(maxI) <= 0
				switch {
				case fits && (err != nil || got != want.Int64()):
					t.Fatalf("%d %s %d = %v, %v; want %s", a, op, b, got, err, want)
				case !fits && !errors.Is(err, ErrIntOverflow):
					t.Fatalf("%d %s %d = %v, %v; want ErrIntOverflow (%s)", a, op, b, got, err, want)
				}
			}
		}
	}
	for _, a := range vals {
		got, err := checkedNeg(a)
		if a == math.MinInt64 {
			if !errors.Is(err, ErrIntOverflow) {
				t.Fatalf("-(%d) = %v, %v; want ErrIntOverflow", a, got, err)
			}
		} else if err != nil || got != -a {
			t.Fatalf("-(%d) = %v, %v", a, got, err)
		}
	}
}

// runCompute runs the CSV pipeline of csvPipeline (id, ts in seconds,
// temp) on data with the config lines more.
func runCompute(t *testing.T, data string, more ...string) (string, *Job) {
	t.Helper()
	return run(t, csvPipeline(t, data, more...))
}

// An integer expression that leaves int64 and a float expression whose
// result (or a step of it) is ±Inf or NaN send the record to the
// dead-letter output with a reason naming the field and the expression;
// the job goes on, and the records whose result is in range are results.
// Before, the integer wrapped around and the float was written as null.
func TestExpressionOverflowIsDeadLetter(t *testing.T) {
	// ts is read in seconds and is in ms in expressions. Each case has
	// two good rows and a bad one between them.
	for _, c := range []struct {
		name, cfg, good, bad, reason string
	}{
		{"float overflow", "    compute: {c: temp * 1e300}\n", "s1,1,21.5", "s9,1,1e10", "not a finite number"},
		{"float division by zero", "    compute: {c: 1 / (temp - 20.5)}\n", "s1,1,21.5", "s9,1,20.5", "not a finite number"},
		{"int division by zero", "    compute: {c: 7 / (ts - 1000)}\n", "s1,2,21.5", "s9,1,20.5", "not a finite number"},
		{"float from a string", "    compute: {c: float(id) + temp}\n", "1.5,1,21.5", "Inf,1,20.5", "not a finite number"},
		{"int add", "    compute: {c: ts + 9223372036854775000}\n", "s1,0,21.5", "s9,1,20.5", "integer overflow"},
		{"int sub", "    compute: {c: -9223372036854775000 - ts}\n", "s1,0,21.5", "s9,1,20.5", "integer overflow"},
		{"int mul", "    compute: {c: ts * 1000000}\n", "s1,1547718199,21.5", "s9,1547718199000,20.5", "integer overflow"},
		{"int neg", "    compute: {c: -(ts - 9223372036854775807 - 1)}\n", "s1,1,21.5", "s9,0,20.5", "integer overflow"},
		{"int abs", "    compute: {c: abs(ts - 9223372036854775807 - 1)}\n", "s1,1,21.5", "s9,0,20.5", "integer overflow"},
		{"int of a float", "    compute: {c: int(temp)}\n", "s1,1,21.5", "s9,1,1e19", "integer overflow"},
		{"filter", "    filter: temp * 1e300 > 0\n", "s1,1,21.5", "s9,1,1e10", "not a finite number"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, job := runCompute(t, c.good+"\n"+c.bad+"\n"+c.good+"\n", c.cfg)
			if job.DeadLetters() != 1 {
				t.Fatalf("dead letters = %d, want 1\n%s", job.DeadLetters(), out)
			}
			d := job.RecentDeadLetters()[0]
			what := "compute c: "
			if strings.HasPrefix(c.cfg, "    filter") {
				what = "filter: "
			}
			if !strings.Contains(d.Err, c.reason) || !strings.HasPrefix(d.Err, what) {
				t.Fatalf("dead letter %+v: want an error starting %q that says %q", d, what, c.reason)
			}
			var rows int
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, DeadLetterPrefix) {
					continue
				}
				rows++
				if strings.Contains(l, "null") {
					t.Errorf("row with a null: %s", l)
				}
			}
			if rows != 2 {
				t.Fatalf("%d rows, want 2:\n%s", rows, out)
			}
		})
	}
}

// An operation of constants out of range is refused when the config
// loads, naming the key: no record could make it valid. One in range is
// left for expr to fold.
func TestConstantOverflowIsConfigError(t *testing.T) {
	for src, want := range map[string]string{
		"9223372036854775807 + 1":      "integer overflow: 9223372036854775807 + 1",
		"ts + 4611686018427387904 * 2": "integer overflow: 4611686018427387904 * 2",
		"-(-9223372036854775807 - 1)":  "integer overflow: -(-9223372036854775808)",
		"temp / 0":                     "", // not constant: a dead letter per record
		"7 / 0":                        "not a finite number: 7 / 0 is +Inf",
		"1e308 * 10 + temp":            "not a finite number: 1e+308 * 10 is +Inf",
		"ts + 1000 * 60 * 60 * 24":     "",
	} {
		_, err := Parse([]byte(`
pipelines:
  - name: c
    source: {file: {path: in.csv, format: csv, fields: {id: string, ts: time, temp: float}}}
    compute: {c: "` + src + `"}
    sinks: [{stdout: {}}]
`))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", src, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), "pipelines[0].compute.c: ") || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want compute.c: …%s", src, err, want)
		}
	}
}

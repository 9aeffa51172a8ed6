package pipeline

import (
	"encoding/csv"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// Quoted CSV columns are read as RFC 4180 says, in the columns the
// decoder reads and in those it skips before them; a quote in an
// unquoted column, a quoted column without its closing quote or with
// text after it are malformed, with a reason naming the column.
func TestCSVQuoting(t *testing.T) {
	d, s := csvTestDecoder(t) // id (0), ts (1, s), temp (3)
	for _, c := range []struct{ in, want string }{
		{`"a,b",1547718199,x,35.8`, `{"id":"a,b","ts":1547718199000,"temp":35.8}`},
		{`"say ""hi""",1547718199,x,35.8`, `{"id":"say \"hi\"","ts":1547718199000,"temp":35.8}`},
		{`a,1547718199,"x,y",35.8`, `{"id":"a","ts":1547718199000,"temp":35.8}`}, // a skipped column
		{` "  x " , 1547718199 ,"skip, ""it""" , "35.8"`, `{"id":"  x ","ts":1547718199000,"temp":35.8}`},
		{`"",1547718199,,35.8,"not read`, `{"id":"","ts":1547718199000,"temp":35.8}`}, // past the last column read
		{`"a` + "\t" + `b",1,"","-2e3"` + "\r\n", `{"id":"a` + `\t` + `b","ts":1000,"temp":-2000}`},
	} {
		var r Row
		if err := d.Decode(c.in, &r); err != nil {
			t.Errorf("Decode(%q): %v", c.in, err)
			continue
		}
		if got := string(r.AppendJSON(nil, s)); got != c.want {
			t.Errorf("Decode(%q) = %s, want %s", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, reason string }{
		{`"abc,1547718199,x,35.8`, `column 0: no closing quote`},
		{`"ab"c,1547718199,x,35.8`, `column 0: text after the closing quote`},
		{`a"b,1547718199,x,35.8`, `column 0: a quote in an unquoted column`},
		{`a,1547718199,x"y,35.8`, `column 2: a quote in an unquoted column`},
		{`a,1547718199,x,35.8"`, `column 3: a quote in an unquoted column`},
		{`a,1547718199,x,"35.8`, `column 3: no closing quote`},
	} {
		var r Row
		err := d.Decode(c.in, &r)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("Decode(%q) = %v, want ErrMalformed saying %q", c.in, err, c.reason)
		}
	}
}

// A line encoding/csv reads as one record of at least 4 fields decodes
// to the same text in every column (trimmed when it was not quoted):
// random lines of a few characters, by seed.
func TestCSVQuotingAgreesWithEncodingCSV(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	s := &Schema{}
	var specs []FieldSpec
	for i, n := range []string{"c0", "c1", "c2", "c3"} {
		f, _ := s.add(n, String)
		specs = append(specs, FieldSpec{Field: f, Column: i})
	}
	d, err := NewCSVDecoder(specs, ',')
	if err != nil {
		t.Fatal(err)
	}
	alphabet := []string{"a", "b", " ", ",", `"`, `""`, `","`}
	var agreed int
	for range 20000 {
		var b strings.Builder
		for range 3 + rng.IntN(10) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		line := b.String()
		rd := csv.NewReader(strings.NewReader(line))
		rd.FieldsPerRecord = -1
		rd.TrimLeadingSpace = true
		recs, err := rd.ReadAll()
		if err != nil || len(recs) != 1 || len(recs[0]) < 4 {
			continue
		}
		var r Row
		if err := d.Decode(line, &r); err != nil {
			t.Fatalf("Decode(%q): %v; encoding/csv reads %q", line, err, recs[0])
		}
		for i := range 4 {
			got, want := r.Str(specs[i].Field.Slot), recs[0][i]
			if got != want && got != strings.TrimSpace(want) {
				t.Fatalf("Decode(%q) column %d = %q; encoding/csv reads %q", line, i, got, want)
			}
		}
		agreed++
	}
	if agreed < 100 {
		t.Fatalf("only %d lines compared", agreed)
	}
}

// In a pipeline a quoted column is one value and a line with a stray
// quote is a dead letter saying why; a quote as the delimiter is a
// config error.
func TestCSVQuotedColumnsInPipeline(t *testing.T) {
	out, job := run(t, csvPipeline(t, "\"s,1\",1547718199,20.5\ns\"2,1547718199,21.5\n\"s3\",1547718199,\"22.5\"\n"))
	if job.DeadLetters() != 1 {
		t.Fatalf("dead letters = %d, want 1\n%s", job.DeadLetters(), out)
	}
	if d := job.RecentDeadLetters()[0]; !strings.Contains(d.Err, "column 0: a quote in an unquoted column") || d.Payload != `s"2,1547718199,21.5` {
		t.Fatalf("dead letter %+v", d)
	}
	for _, row := range []string{`{"id":"s,1","ts":1547718199000,"temp":20.5}`, `{"id":"s3","ts":1547718199000,"temp":22.5}`} {
		if !strings.Contains(out, row) {
			t.Fatalf("no row %s in\n%s", row, out)
		}
	}
	_, err := Parse([]byte(`
pipelines:
  - name: q
    source: {file: {path: in.csv, format: csv, delimiter: '"', fields: {id: string}}}
    sinks: [{stdout: {}}]
`))
	if err == nil || !strings.Contains(err.Error(), `pipelines[0].source.file.delimiter: "\"" must not be a quote`) || strings.Contains(err.Error(), "fields") {
		t.Fatalf("error %v, want the delimiter refused", err)
	}
}

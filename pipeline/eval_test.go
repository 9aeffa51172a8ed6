package pipeline

import "testing"

// BenchmarkEval measures one filter expression on a row: expr-lang boxes
// the field values it reads.
func BenchmarkEval(b *testing.B) {
	var p problems
	s := GeneratorSchema()
	prog, ok := compileExpr(&p, "filter", s, "temp > 38 && id != 'x'", true)
	if !ok {
		b.Fatal(p)
	}
	ev := newEvaluator(s)
	var r Row
	r.SetStr(0, "sensor_1")
	r.SetFloat(0, 39.5)
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := ev.test(&prog, &r); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

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
	r.SetFloat(s.Field(1).Slot, 39.5)
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := ev.test(&prog, &r); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkEvalArithmetic measures computed fields with float and
// integer arithmetic, each operation checked for overflow.
func BenchmarkEvalArithmetic(b *testing.B) {
	s := GeneratorSchema()
	for _, src := range []string{"temp * 1.8 + 32", "ts + 1000 * 60"} {
		b.Run(src, func(b *testing.B) {
			var p problems
			prog, ok := compileExpr(&p, "compute", s, src, false)
			if !ok {
				b.Fatal(p)
			}
			ev := newEvaluator(s)
			var r Row
			r.SetStr(s.Field(0).Slot, "sensor_1")
			r.SetFloat(s.Field(1).Slot, 39.5)
			r.SetInt(s.Field(2).Slot, 1547718199000)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ev.run(&prog, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

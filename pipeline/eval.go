package pipeline

import (
	"fmt"
	"math"

	"github.com/expr-lang/expr/vm"
)

// evaluator runs a plan's compiled programs on rows. It belongs to one
// subtask (created in Open): it reuses one environment map and one VM, so
// evaluating builds no map; boxing the field values an expression reads
// still allocates.
type evaluator struct {
	env map[string]any
	vm  vm.VM
}

func newEvaluator(s *Schema) *evaluator {
	return &evaluator{env: exprEnv(s)}
}

// run evaluates p on r. Its arithmetic is checked (checkedOptions); a
// float result that is ±Inf or NaN all the same (float("Inf")) is an
// error too.
func (e *evaluator) run(p *program, r *Row) (any, error) {
	for _, f := range p.reads {
		e.env[f.Name] = r.Value(f)
	}
	out, err := e.vm.Run(p.prog, e.env)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", p.src, err)
	}
	if x, ok := out.(float64); ok && (math.IsInf(x, 0) || math.IsNaN(x)) {
		return nil, fmt.Errorf("%q: %w: it gave %s", p.src, ErrNotFinite, fmtFloat(x))
	}
	return out, nil
}

// test evaluates a boolean program.
func (e *evaluator) test(p *program, r *Row) (bool, error) {
	v, err := e.run(p, r)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%q gave %T, want bool", p.src, v)
	}
	return b, nil
}

// compute evaluates c and stores the result in its field of r.
func (e *evaluator) compute(c *computed, r *Row) error {
	f := c.field
	v, err := e.run(&c.program, r)
	if err != nil {
		return fmt.Errorf("compute %s: %w", f.Name, err)
	}
	switch x := v.(type) {
	case float64:
		if f.Type == Float {
			r.SetFloat(f.Slot, x)
			return nil
		}
	case int:
		switch f.Type {
		case Int:
			r.SetInt(f.Slot, int64(x))
			return nil
		case Float:
			r.SetFloat(f.Slot, float64(x))
			return nil
		}
	case int64:
		if f.Type == Int {
			r.SetInt(f.Slot, x)
			return nil
		}
	case bool:
		if f.Type == Bool {
			r.SetBool(f.Slot, x)
			return nil
		}
	case string:
		if f.Type == String {
			r.SetStr(f.Slot, x)
			return nil
		}
	}
	return fmt.Errorf("compute %s: %q gave %T, want %s", f.Name, c.src, v, f.Type)
}

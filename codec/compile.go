package codec

import (
	"errors"
	"fmt"
	"reflect"
	"time"
)

// compiler builds the plans of one type and the types inside it. It lives
// for one call of cachedPlan.
type compiler struct {
	// seen holds the plans begun so far, so that a recursive type (a
	// struct with a pointer to itself) refers to its own plan.
	seen map[reflect.Type]*plan
}

func newCompiler() *compiler {
	return &compiler{seen: make(map[reflect.Type]*plan)}
}

// compile returns the plan of t. A plan returned while t is still being
// compiled is filled in before any value is encoded with it.
func (c *compiler) compile(t reflect.Type) (*plan, error) {
	if pl, ok := c.seen[t]; ok {
		return pl, nil
	}
	if r, ok := plans.Load(t); ok {
		r := r.(planResult)
		return r.pl, r.err
	}
	pl := &plan{size: t.Size()}
	c.seen[t] = pl
	if err := c.fill(pl, t); err != nil {
		return nil, err
	}
	return pl, nil
}

// fill compiles t into pl.
func (c *compiler) fill(pl *plan, t reflect.Type) error {
	if t == reflect.TypeFor[time.Time]() {
		pl.enc, pl.dec, pl.minSize = encTime, decTime, 1
		return nil
	}
	if m, ok := marshalerOf(t); ok {
		pl.enc, pl.dec, pl.minSize = m.enc, m.dec, 1
		return nil
	}
	if op, min, ok := scalarOp(t.Kind()); ok {
		pl.op, pl.minSize = op, min
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		return c.fillStruct(pl, t)
	case reflect.Array:
		return c.fillArray(pl, t)
	case reflect.Slice:
		return c.fillSlice(pl, t)
	case reflect.Pointer:
		return c.fillPointer(pl, t)
	case reflect.Map:
		return c.fillMap(pl, t)
	}
	return fmt.Errorf("%w: %v is a %v", ErrUnsupported, t, t.Kind())
}

// fillStruct compiles the struct type t, inlining the fields of nested
// structs so that encoding a struct is one loop over scalars.
func (c *compiler) fillStruct(pl *plan, t reflect.Type) error {
	pl.isStrct = true
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Name == "_" || sf.Tag.Get("codec") == "-" {
			continue
		}
		if !sf.IsExported() {
			return fmt.Errorf("%w: field %s of %v is unexported (tag it `codec:\"-\"` to skip it)",
				ErrUnsupported, sf.Name, t)
		}
		fp, err := c.compile(sf.Type)
		if err != nil {
			return fmt.Errorf("field %s: %w", sf.Name, err)
		}
		pl.minSize += fp.minSize
		if !fp.isStrct {
			pl.fields = append(pl.fields, field{name: sf.Name, off: sf.Offset, pl: fp})
			continue
		}
		for _, sub := range fp.fields {
			pl.fields = append(pl.fields, field{
				name: sf.Name + "." + sub.name,
				off:  sf.Offset + sub.off,
				pl:   sub.pl,
			})
		}
	}
	pl.enc, pl.dec = pl.encStruct, pl.decStruct
	pl.flat = flatFields(pl)
	if pl.flat != nil {
		var size uintptr
		for _, f := range pl.fields {
			size += f.pl.size
		}
		// No padding, no skipped field: decoding every field writes
		// every byte of the value.
		pl.flatWhole = size == t.Size()
	}
	return nil
}

// wrapField names the field an encoding error came from. Depth errors are
// left alone: they come from a thousand levels down and would otherwise
// carry a thousand names.
func wrapField(name string, err error) error {
	if errors.Is(err, errEncodeDepth) {
		return err
	}
	return fmt.Errorf("field %s: %w", name, err)
}

// Package nan tells whether values of a comparable type can be unequal
// to themselves (a float NaN, or an array, struct or interface holding
// one): keyed state finds a key by ==, which never holds for such a
// value. Checking each value (v != v) costs a call through the type's
// equality in generic code; a type without a float in it needs no check.
package nan

import "reflect"

// Possible reports whether a value of type K can be unequal to itself.
func Possible[K any]() bool {
	return possible(reflect.TypeFor[K](), 0)
}

func possible(t reflect.Type, depth int) bool {
	if depth > 32 { // deeper than any key type: assume it can
		return true
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.Interface:
		return true
	case reflect.Array:
		return possible(t.Elem(), depth+1)
	case reflect.Struct:
		for i := range t.NumField() {
			if possible(t.Field(i).Type, depth+1) {
				return true
			}
		}
	}
	return false
}

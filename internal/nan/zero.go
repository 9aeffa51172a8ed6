package nan

import (
	"reflect"
	"unsafe"
)

// ZeroCanonicalizer returns a function that turns every negative zero in a
// value of type K (a float, a complex part, or one inside an array or
// struct) into positive zero, or nil when K holds no float. -0 == +0, so
// keyed state that finds a key by == (the memory backend's maps) takes
// them for one key, while an encoding (a key's hash, the bolt backend's
// keys) tells them apart: keys are made canonical first so that both
// agree.
func ZeroCanonicalizer[K any]() func(*K) {
	var fs []floatAt
	collectFloats(reflect.TypeFor[K](), 0, &fs, 0)
	if len(fs) == 0 {
		return nil
	}
	return func(k *K) {
		base := unsafe.Pointer(k)
		for _, f := range fs {
			p := unsafe.Add(base, f.off)
			if f.size == 4 {
				if x := (*float32)(p); *x == 0 {
					*x = 0
				}
			} else if x := (*float64)(p); *x == 0 {
				*x = 0
			}
		}
	}
}

// floatAt is a float32 (size 4) or float64 (size 8) at offset off.
type floatAt struct {
	off  uintptr
	size int
}

func collectFloats(t reflect.Type, off uintptr, fs *[]floatAt, depth int) {
	if depth > 32 {
		return
	}
	switch t.Kind() {
	case reflect.Float32:
		*fs = append(*fs, floatAt{off, 4})
	case reflect.Float64:
		*fs = append(*fs, floatAt{off, 8})
	case reflect.Complex64:
		*fs = append(*fs, floatAt{off, 4}, floatAt{off + 4, 4})
	case reflect.Complex128:
		*fs = append(*fs, floatAt{off, 8}, floatAt{off + 8, 8})
	case reflect.Array:
		for i := range t.Len() {
			collectFloats(t.Elem(), off+uintptr(i)*t.Elem().Size(), fs, depth+1)
		}
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			collectFloats(f.Type, off+f.Offset, fs, depth+1)
		}
	}
}

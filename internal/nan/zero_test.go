package nan

import (
	"math"
	"testing"
)

func TestZeroCanonicalizer(t *testing.T) {
	negz := math.Copysign(0, -1)
	if ZeroCanonicalizer[string]() != nil || ZeroCanonicalizer[struct{ A [3]int }]() != nil {
		t.Fatal("a type without floats needs no canonicalizer")
	}
	f := ZeroCanonicalizer[float64]()
	x := negz
	f(&x)
	if math.Signbit(x) {
		t.Errorf("float64 -0 stays negative")
	}
	type k struct {
		S string
		A [2]float32
		C complex128
		N struct{ F float64 }
	}
	v := k{"s", [2]float32{float32(negz), -1.5}, complex(negz, negz), struct{ F float64 }{negz}}
	ZeroCanonicalizer[k]()(&v)
	if math.Signbit(float64(v.A[0])) || v.A[1] != -1.5 || math.Signbit(real(v.C)) || math.Signbit(imag(v.C)) || math.Signbit(v.N.F) || v.S != "s" {
		t.Errorf("after canonicalizing: %+v", v)
	}
	nan := math.NaN()
	y := nan
	f(&y)
	if !math.IsNaN(y) {
		t.Errorf("NaN changed to %v", y)
	}
}

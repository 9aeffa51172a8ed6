package nan

import "testing"

func TestPossible(t *testing.T) {
	type pair struct {
		A string
		B [2]float32
	}
	type plain struct {
		A string
		B [2]int
		C *float64 // a pointer compares by address
	}
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"string", Possible[string](), false},
		{"int64", Possible[int64](), false},
		{"float64", Possible[float64](), true},
		{"complex64", Possible[complex64](), true},
		{"any", Possible[any](), true},
		{"[3]float64", Possible[[3]float64](), true},
		{"struct with a float array", Possible[pair](), true},
		{"struct without a float", Possible[plain](), false},
	} {
		if c.got != c.want {
			t.Errorf("Possible[%s]() = %v, want %v", c.name, c.got, c.want)
		}
	}
}

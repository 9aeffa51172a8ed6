package keygroup

import (
	"testing"
)

// The string vectors pin the hash: XXH64 with seed 0 (the empty string's
// value is the published XXH64 test vector). Changing the hash would move
// every key to another key group and break every stored checkpoint.
func TestHashVectors(t *testing.T) {
	for _, tc := range []struct {
		key       string
		hash      uint64
		group128  int
		group4096 int
	}{
		{"", 0xef46db3751d8e999, 25, 2457},
		{"sensor_1", 0xca17f587479b7bc9, 73, 3017},
		{"sensor_2", 0x9132b5d4ac41a995, 21, 2453},
		{"sensor_10", 0xfb32eb1600c50f11, 17, 3857},
		{"sensor_999", 0xb22ce36685097542, 66, 1346},
	} {
		h := HashString(tc.key)
		if h != tc.hash {
			t.Errorf("HashString(%q) = %#x, want %#x", tc.key, h, tc.hash)
		}
		if g := Of(h, 128); g != tc.group128 {
			t.Errorf("Of(%q, 128) = %d, want %d", tc.key, g, tc.group128)
		}
		if g := Of(h, 4096); g != tc.group4096 {
			t.Errorf("Of(%q, 4096) = %d, want %d", tc.key, g, tc.group4096)
		}
		if HashBytes([]byte(tc.key)) != h {
			t.Errorf("HashBytes(%q) differs from HashString", tc.key)
		}
	}
	for _, tc := range []struct {
		key   uint64
		hash  uint64
		group int
	}{
		{0, 0, 0},
		{1, 0x5692161d100b05e5, 101},
		{42, 0xa759ea27d4727622, 34},
		{1 << 40, 0xab4daf7c2673f8, 120},
	} {
		h := HashUint64(tc.key)
		if h != tc.hash || Of(h, 128) != tc.group {
			t.Errorf("HashUint64(%d) = %#x (group %d), want %#x (group %d)", tc.key, h, Of(h, 128), tc.hash, tc.group)
		}
	}
	if HashFloat64(0) != HashFloat64(-0.0*-1) {
		t.Error("0 and -0 hash differently")
	}
}

func TestSubtaskAndRangeVectors(t *testing.T) {
	for _, tc := range []struct {
		maxP, p int
		want    []Range
	}{
		{128, 1, []Range{{0, 128}}},
		{128, 2, []Range{{0, 64}, {64, 128}}},
		{128, 3, []Range{{0, 43}, {43, 86}, {86, 128}}},
		{128, 5, []Range{{0, 26}, {26, 52}, {52, 77}, {77, 103}, {103, 128}}},
		{10, 4, []Range{{0, 3}, {3, 5}, {5, 8}, {8, 10}}},
		{4, 4, []Range{{0, 1}, {1, 2}, {2, 3}, {3, 4}}},
	} {
		for i, want := range tc.want {
			if got := RangeFor(i, tc.p, tc.maxP); got != want {
				t.Errorf("RangeFor(%d, p=%d, max=%d) = %v, want %v", i, tc.p, tc.maxP, got, want)
			}
		}
	}
	// Subtask vectors: group*parallelism/maxParallelism.
	for _, tc := range []struct{ g, p, maxP, want int }{
		{0, 2, 128, 0}, {63, 2, 128, 0}, {64, 2, 128, 1}, {127, 2, 128, 1},
		{42, 3, 128, 0}, {43, 3, 128, 1}, {85, 3, 128, 1}, {86, 3, 128, 2},
	} {
		if got := Subtask(tc.g, tc.p, tc.maxP); got != tc.want {
			t.Errorf("Subtask(%d, %d, %d) = %d, want %d", tc.g, tc.p, tc.maxP, got, tc.want)
		}
	}
}

// Every key group belongs to exactly the subtask whose range contains it,
// and the ranges are contiguous and cover [0, maxP).
func TestRangesPartitionKeyGroups(t *testing.T) {
	for _, maxP := range []int{1, 2, 7, 128, 1000} {
		for p := 1; p <= maxP && p <= 40; p++ {
			next := 0
			for i := range p {
				r := RangeFor(i, p, maxP)
				if r.Start != next {
					t.Fatalf("max=%d p=%d: range %d starts at %d, want %d", maxP, p, i, r.Start, next)
				}
				if r.Len() < 1 {
					t.Fatalf("max=%d p=%d: range %d is empty", maxP, p, i)
				}
				for g := r.Start; g < r.End; g++ {
					if s := Subtask(g, p, maxP); s != i {
						t.Fatalf("max=%d p=%d: group %d in range of %d but Subtask says %d", maxP, p, g, i, s)
					}
				}
				next = r.End
			}
			if next != maxP {
				t.Fatalf("max=%d p=%d: ranges end at %d", maxP, p, next)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(2, 128); err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][2]int{{0, 128}, {129, 128}, {1, 0}, {1, MaxMaxParallelism + 1}} {
		if Validate(tc[0], tc[1]) == nil {
			t.Errorf("Validate(%d, %d) accepted", tc[0], tc[1])
		}
	}
}

package state

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/edgedio/edged/keygroup"
)

func TestRedistributeList(t *testing.T) {
	cases := []struct {
		name string
		old  [][]int
		n    int
		want [][]int
	}{
		{"2->1", [][]int{{1, 2}, {3}}, 1, [][]int{{1, 2, 3}}},
		{"2->3", [][]int{{1, 2, 3, 4}, {5, 6, 7}}, 3, [][]int{{1, 2, 3}, {4, 5}, {6, 7}}},
		{"3->2", [][]int{{1}, {2, 3}, {4, 5}}, 2, [][]int{{1, 2, 3}, {4, 5}}},
		{"1->4", [][]int{{1, 2, 3, 4, 5, 6}}, 4, [][]int{{1, 2}, {3, 4}, {5}, {6}}},
		{"1->4 short", [][]int{{1, 2}}, 4, [][]int{{1}, {2}, nil, nil}},
		{"empty lists", [][]int{{}, nil}, 3, [][]int{nil, nil, nil}},
		{"no old subtasks", nil, 2, [][]int{nil, nil}},
		{"2->2 rebalances", [][]int{{1, 2, 3, 4}, {}}, 2, [][]int{{1, 2}, {3, 4}}},
	}
	for _, c := range cases {
		got := RedistributeList(c.old, c.n)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	// Results do not alias the input or each other.
	old := [][]int{{1, 2}, {3, 4}}
	got := RedistributeList(old, 1)
	got[0][0] = 100
	if old[0][0] != 1 {
		t.Error("result aliases the input")
	}
}

func TestRedistributeUnion(t *testing.T) {
	cases := []struct {
		name string
		old  [][]string
		n    int
		want [][]string
	}{
		{"2->1", [][]string{{"a"}, {"b", "c"}}, 1, [][]string{{"a", "b", "c"}}},
		{"2->3", [][]string{{"a"}, {"b"}}, 3, [][]string{{"a", "b"}, {"a", "b"}, {"a", "b"}}},
		{"3->2", [][]string{{"a"}, nil, {"c"}}, 2, [][]string{{"a", "c"}, {"a", "c"}}},
		{"1->4", [][]string{{"a"}}, 4, [][]string{{"a"}, {"a"}, {"a"}, {"a"}}},
		{"empty lists", [][]string{nil, {}}, 2, [][]string{nil, nil}},
	}
	for _, c := range cases {
		got := RedistributeUnion(c.old, c.n)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	got := RedistributeUnion([][]int{{1}}, 2)
	got[0][0] = 100
	if got[1][0] != 1 {
		t.Error("new subtasks share a list")
	}
}

func TestRedistributeBroadcast(t *testing.T) {
	m := map[string]int{"a": 1, "b": 2}
	cases := []struct {
		name    string
		old     []map[string]int
		n       int
		want    []map[string]int
		wantErr bool
	}{
		{"2->1", []map[string]int{m, maps.Clone(m)}, 1, []map[string]int{m}, false},
		{"2->3", []map[string]int{m, maps.Clone(m)}, 3, []map[string]int{m, m, m}, false},
		{"3->2", []map[string]int{m, maps.Clone(m), maps.Clone(m)}, 2, []map[string]int{m, m}, false},
		{"1->4", []map[string]int{m}, 4, []map[string]int{m, m, m, m}, false},
		{"empty maps", []map[string]int{{}, nil}, 2, []map[string]int{{}, {}}, false},
		{"no old subtasks", nil, 1, []map[string]int{{}}, false},
		{"value differs", []map[string]int{m, {"a": 1, "b": 3}}, 2, nil, true},
		{"key differs", []map[string]int{m, {"a": 1, "c": 2}}, 2, nil, true},
		{"size differs", []map[string]int{m, {"a": 1}}, 2, nil, true},
	}
	for _, c := range cases {
		got, err := RedistributeBroadcast(c.old, c.n)
		if (err != nil) != c.wantErr {
			t.Errorf("%s: err %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	got, _ := RedistributeBroadcast([]map[string]int{m}, 2)
	got[0]["a"] = 100
	if m["a"] != 1 || got[1]["a"] != 1 {
		t.Error("results share maps")
	}
}

func TestRedistributePanicsOnZeroParallelism(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	RedistributeList([][]int{{1}}, 0)
}

func TestKeyedRestoreSources(t *testing.T) {
	cases := []struct {
		maxP, oldP, newP int
		want             [][]int
	}{
		{128, 2, 3, [][]int{{0}, {0, 1}, {1}}},
		{128, 3, 2, [][]int{{0, 1}, {1, 2}}},
		{128, 2, 1, [][]int{{0, 1}}},
		{128, 1, 4, [][]int{{0}, {0}, {0}, {0}}},
		{128, 4, 4, [][]int{{0}, {1}, {2}, {3}}},
		{10, 3, 4, [][]int{{0}, {0, 1}, {1, 2}, {2}}},
		{4, 4, 1, [][]int{{0, 1, 2, 3}}},
	}
	for _, c := range cases {
		if got := KeyedRestoreSources(c.maxP, c.oldP, c.newP); !reflect.DeepEqual(got, c.want) {
			t.Errorf("maxP %d, %d->%d: got %v, want %v", c.maxP, c.oldP, c.newP, got, c.want)
		}
	}
	// Cross-check against the definition: ranges that intersect.
	for _, maxP := range []int{1, 7, 128} {
		for oldP := 1; oldP <= min(maxP, 9); oldP++ {
			for newP := 1; newP <= min(maxP, 9); newP++ {
				got := KeyedRestoreSources(maxP, oldP, newP)
				for i := range newP {
					r := keygroup.RangeFor(i, newP, maxP)
					var want []int
					for j := range oldP {
						o := keygroup.RangeFor(j, oldP, maxP)
						if o.Start < r.End && r.Start < o.End {
							want = append(want, j)
						}
					}
					if !slices.Equal(got[i], want) {
						t.Fatalf("maxP %d, %d->%d, new %d: got %v, want %v", maxP, oldP, newP, i, got[i], want)
					}
				}
			}
		}
	}
}

func ExampleKeyedRestoreSources() {
	fmt.Println(KeyedRestoreSources(128, 2, 3))
	// Output: [[0] [0 1] [1]]
}

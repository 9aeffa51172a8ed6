package codec

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
)

// TestConcurrentUse compiles and uses codecs from many goroutines at once;
// run it with -race.
func TestConcurrentUse(t *testing.T) {
	type fresh struct {
		A []string
		M map[string]*location
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			c := For[fresh]()
			for i := range 200 {
				v := fresh{A: []string{fmt.Sprint(g, i)}, M: map[string]*location{"k": {Lat: float64(i)}}}
				b, err := c.Append(nil, v)
				if err != nil {
					errs <- err
					return
				}
				got, _, err := c.Decode(b)
				if err != nil || !reflect.DeepEqual(got, v) {
					errs <- fmt.Errorf("goroutine %d record %d: got %+v, %v", g, i, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

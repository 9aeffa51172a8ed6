package codec_test

import (
	"fmt"

	"github.com/edgedio/edged/codec"
)

type Reading struct {
	ID          string
	Timestamp   int64
	Temperature float64
}

func ExampleFor() {
	c := codec.For[Reading]()
	buf, err := c.Append(nil, Reading{ID: "s1", Timestamp: 3, Temperature: 0.5})
	if err != nil {
		panic(err)
	}
	fmt.Printf("% x\n", buf)
	r, n, err := c.Decode(buf)
	fmt.Println(r, n, err)
	// Output:
	// 02 73 31 06 00 00 00 00 00 00 e0 3f
	// {s1 3 0.5} 12 <nil>
}

func ExampleAppendBatch() {
	c := codec.For[Reading]()
	buf, err := codec.AppendBatch(c, nil, []Reading{{ID: "a"}, {ID: "b", Timestamp: -1}})
	if err != nil {
		panic(err)
	}
	rs, err := codec.DecodeBatch(c, nil, buf)
	fmt.Println(len(buf), rs, err)
	// Output:
	// 23 [{a 0 0} {b -1 0}] <nil>
}

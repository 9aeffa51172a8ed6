package codec

import (
	"fmt"
	"testing"
)

// benchReading is the record every contender encodes.
var benchReading = SensorReading{ID: "sensor-0042", Timestamp: 1_700_000_000_123_456_789, Temperature: 21.375}

// BenchmarkCodec round-trips one SensorReading per iteration (Append into a
// reused buffer, then Decode) with each contender, so the ratios compare
// within one run.
func BenchmarkCodec(b *testing.B) {
	b.Run("codec=compiled", func(b *testing.B) { benchRoundTrip(b, For[SensorReading](), benchReading) })
	b.Run("codec=binary", func(b *testing.B) { benchRoundTrip(b, Binary[binReading](), binReading(benchReading)) })
	b.Run("codec=cbor", func(b *testing.B) { benchRoundTrip(b, CBOR[SensorReading](), benchReading) })
	b.Run("codec=gob", func(b *testing.B) { benchRoundTrip(b, Gob[SensorReading](), benchReading) })
	b.Run("codec=json", func(b *testing.B) { benchRoundTrip(b, JSON[SensorReading](), benchReading) })
}

// benchRoundTrip encodes and decodes v with c once per iteration and
// reports records/s and the encoded size.
func benchRoundTrip[T any](b *testing.B, c Codec[T], v T) {
	buf, err := c.Append(nil, v)
	if err != nil {
		b.Fatal(err)
	}
	size := len(buf)
	b.ReportAllocs()
	for b.Loop() {
		buf, err = c.Append(buf[:0], v)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err = c.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(size), "B/record")
}

// BenchmarkBatch round-trips batches of SensorReadings through AppendBatch
// and DecodeBatch with the compiled codec, reusing both buffers.
func BenchmarkBatch(b *testing.B) {
	c := For[SensorReading]()
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			in := make([]SensorReading, n)
			for i := range in {
				in[i] = benchReading
				in[i].Timestamp += int64(i)
			}
			var buf []byte
			var out []SensorReading
			var err error
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = AppendBatch(c, buf[:0], in); err != nil {
					b.Fatal(err)
				}
				if out, err = DecodeBatch(c, out, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkBatchDict encodes and decodes, separately, batches of 512
// SensorReadings of 1,000 sensors with a channel's numbering of strings
// (AppendBatchDict, Decoder.AppendNDict), as a cross-node channel does
// once the numbering holds every sensor.
func BenchmarkBatchDict(b *testing.B) {
	c := For[SensorReading]()
	const n = 512
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("sensor-%04d", i)
	}
	in := make([]SensorReading, n)
	var e DictEncoder
	var dd DictDecoder
	d := NewDecoder(c)
	var buf []byte
	var out []SensorReading
	batch := func(k int) {
		for i := range in {
			in[i] = SensorReading{ID: ids[(k*n+i*7)%len(ids)], Timestamp: 1_700_000_000_000 + int64(k*n+i)/4, Temperature: 20 + float64(i%50)/8}
		}
	}
	// Number every sensor first, on both ends.
	for k := range 4 {
		batch(k)
		var err error
		if buf, err = AppendBatchDict(c, &e, buf[:0], in); err != nil {
			b.Fatal(err)
		}
		if out, _, err = d.AppendNDict(out[:0], buf[2:], n, &dd); err != nil {
			b.Fatalf("%v %d", err, len(buf))
		}
	}
	batch(5)
	buf, err := AppendBatchDict(c, &e, buf[:0], in)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("op=encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = AppendBatchDict(c, &e, buf[:0], in); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
		b.ReportMetric(float64(len(buf))/n, "B/record")
	})
	body := buf[2:] // the count, 512, is a two-byte uvarint
	b.Run("op=decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if out, _, err = d.AppendNDict(out[:0], body, n, &dd); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
	})
}

package operators

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrMalformed is wrapped by the errors of parsers that reject a line, such
// as ParseSensorReading.
var ErrMalformed = errors.New("operators: malformed record")

// SensorReading is one temperature measurement of one sensor, the record of
// the examples and benchmarks. Its text form is "id,timestamp,temperature",
// e.g. "sensor_1,1547718199,35.8".
type SensorReading struct {
	// ID names the sensor, e.g. "sensor_1".
	ID string
	// Timestamp is the event time in unix seconds.
	Timestamp int64
	// Temperature is the measured value in degrees Celsius.
	Temperature float64
}

// ParseSensorReading parses a line of the form "sensor_1,1547718199,35.8".
// Spaces around the line and around each field are ignored. The ID must not
// be empty, the timestamp is a base-10 integer and the temperature a finite
// float. Errors wrap ErrMalformed. The ID of the result is a substring of
// line; ParseSensorReading allocates nothing when the line is valid.
func ParseSensorReading(line string) (SensorReading, error) {
	id, rest, ok := strings.Cut(line, ",")
	ts, temp, ok2 := strings.Cut(rest, ",")
	if !ok || !ok2 || strings.IndexByte(temp, ',') >= 0 {
		return SensorReading{}, fmt.Errorf("%w: %q: want 3 comma-separated fields", ErrMalformed, line)
	}
	id = strings.TrimSpace(id)
	if id == "" {
		return SensorReading{}, fmt.Errorf("%w: %q: empty sensor id", ErrMalformed, line)
	}
	t, err := strconv.ParseInt(strings.TrimSpace(ts), 10, 64)
	if err != nil {
		return SensorReading{}, fmt.Errorf("%w: %q: timestamp: %w", ErrMalformed, line, err)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(temp), 64)
	if err != nil {
		return SensorReading{}, fmt.Errorf("%w: %q: temperature: %w", ErrMalformed, line, err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return SensorReading{}, fmt.Errorf("%w: %q: temperature is not finite", ErrMalformed, line)
	}
	return SensorReading{ID: id, Timestamp: t, Temperature: f}, nil
}

// String formats r as the line ParseSensorReading reads, with the shortest
// decimal temperature that parses back to the same value:
// "sensor_1,1547718199,35.8".
func (r SensorReading) String() string {
	var buf [64]byte
	b := append(buf[:0], r.ID...)
	b = append(b, ',')
	b = strconv.AppendInt(b, r.Timestamp, 10)
	b = append(b, ',')
	b = strconv.AppendFloat(b, r.Temperature, 'f', -1, 64)
	return string(b)
}

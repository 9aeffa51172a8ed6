package operators

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSensorReading(t *testing.T) {
	tests := []struct {
		line string
		want SensorReading
	}{
		{"sensor_1,1547718199,35.8", SensorReading{"sensor_1", 1547718199, 35.8}},
		{"  sensor_7 , 12 ,  -3.25  ", SensorReading{"sensor_7", 12, -3.25}},
		{"s,0,0", SensorReading{"s", 0, 0}},
		{"s,-5,1e3", SensorReading{"s", -5, 1000}},
		{"s,+5,20\r", SensorReading{"s", 5, 20}},
	}
	for _, tt := range tests {
		got, err := ParseSensorReading(tt.line)
		if err != nil {
			t.Errorf("ParseSensorReading(%q): %v", tt.line, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseSensorReading(%q) = %+v, want %+v", tt.line, got, tt.want)
		}
	}
}

func TestParseSensorReadingMalformed(t *testing.T) {
	tests := []struct {
		line string
		hint string // part of the error text
	}{
		{"", "want 3 comma-separated fields"},
		{"sensor_1", "want 3 comma-separated fields"},
		{"sensor_1,1547718199", "want 3 comma-separated fields"},
		{"sensor_1,1547718199,35.8,1", "want 3 comma-separated fields"},
		{" ,1547718199,35.8", "empty sensor id"},
		{"sensor_1,,35.8", "timestamp"},
		{"sensor_1,1547718199.5,35.8", "timestamp"},
		{"sensor_1,99999999999999999999,35.8", "timestamp"},
		{"sensor_1,1547718199,", "temperature"},
		{"sensor_1,1547718199,hot", "temperature"},
		{"sensor_1,1547718199,NaN", "not finite"},
		{"sensor_1,1547718199,-Inf", "not finite"},
		{"sensor_1,1547718199,1e999", "temperature"},
	}
	for _, tt := range tests {
		_, err := ParseSensorReading(tt.line)
		if err == nil {
			t.Errorf("ParseSensorReading(%q) succeeded, want an error", tt.line)
			continue
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseSensorReading(%q) = %v, does not wrap ErrMalformed", tt.line, err)
		}
		if msg := err.Error(); !strings.Contains(msg, tt.hint) {
			t.Errorf("ParseSensorReading(%q) = %q, want it to mention %q", tt.line, msg, tt.hint)
		}
	}
}

func TestSensorReadingString(t *testing.T) {
	tenth, fifth := 0.1, 0.2 // variables: constants would add exactly
	tests := []struct {
		r    SensorReading
		want string
	}{
		{SensorReading{"sensor_1", 1547718199, 35.8}, "sensor_1,1547718199,35.8"},
		{SensorReading{"s", -1, 20}, "s,-1,20"},
		{SensorReading{"s", 0, tenth + fifth}, "s,0,0.30000000000000004"},
		{SensorReading{"s", 0, 1e21}, "s,0,1000000000000000000000"},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.r, got, tt.want)
		}
		back, err := ParseSensorReading(tt.r.String())
		if err != nil || back != tt.r {
			t.Errorf("ParseSensorReading(%q) = %+v, %v; want %+v", tt.r.String(), back, err, tt.r)
		}
	}
}

func FuzzParseSensorReading(f *testing.F) {
	for _, s := range []string{
		"sensor_1,1547718199,35.8", " a , 1 , 2 ", "a,b", "a,1,2,3", ",1,2",
		"a,1,NaN", "a,1,-0", "a,1,1e-320", "a\n,1,2", "a,0x10,2", "a,1,0x1p-2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseSensorReading(line)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		back, err := ParseSensorReading(r.String())
		if err != nil {
			t.Fatalf("ParseSensorReading(%q) parsed %+v, but its String %q fails: %v", line, r, r.String(), err)
		}
		if back != r {
			t.Fatalf("round trip of %q: %+v, then %q gives %+v", line, r, r.String(), back)
		}
	})
}

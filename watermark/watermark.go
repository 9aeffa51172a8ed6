package watermark

import "math"

const (
	// MinWatermark is the watermark before any: no record is late yet.
	MinWatermark int64 = math.MinInt64
	// MaxWatermark is the final watermark. A bounded source emits it when
	// its input ends, so every event-time window and timer downstream fires;
	// a channel that delivered it has ended and never holds a merged
	// watermark back.
	MaxWatermark int64 = math.MaxInt64
)

// subSat returns a-b for b >= 0, saturating at MinWatermark instead of
// wrapping around.
func subSat(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}

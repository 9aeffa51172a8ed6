package daemon

import (
	"testing"

	"github.com/edgedio/edged/mqtt"
	"github.com/edgedio/edged/pipeline"
)

// The embedded broker's packet bound is the largest max_message_bytes of
// the pipelines reading it (the default for one that sets none); the
// pipelines reading an external broker do not count.
func TestEmbeddedMaxMessage(t *testing.T) {
	src := func(broker string, v int64) pipeline.PipelineConfig {
		var pc pipeline.PipelineConfig
		pc.Source.MQTT = &pipeline.MQTTSourceConfig{Broker: broker, MaxMessageBytes: v}
		return pc
	}
	for _, c := range []struct {
		pcs  []pipeline.PipelineConfig
		want int64
	}{
		{nil, mqtt.DefaultMaxMessageBytes},
		{[]pipeline.PipelineConfig{src("", 1024)}, 1024},
		{[]pipeline.PipelineConfig{src("", 1024), src("", 0)}, mqtt.DefaultMaxMessageBytes},
		{[]pipeline.PipelineConfig{src("", 1024), src("", 32<<20)}, 32 << 20},
		{[]pipeline.PipelineConfig{src("", 1024), src("tcp://h:1883", 32<<20)}, 1024},
	} {
		if got := (&pipeline.Config{Pipelines: c.pcs}).EmbeddedMaxMessageBytes(); got != c.want {
			t.Errorf("%d pipelines: %d, want %d", len(c.pcs), got, c.want)
		}
	}
}

package pipeline

import (
	"testing"

	"github.com/edgedio/edged/actors"
	"github.com/edgedio/edged/mqtt"
)

// An MQTT source at parallelism 2 sends its messages to the decoding
// subtasks in batches capped by their payload bytes (SourceBatchBytes),
// so that a channel between them holds credits × (64 KiB + one message)
// rather than credits × batch_size messages however large they are.
func TestMQTTSourceBatchesCappedInBytes(t *testing.T) {
	cfg, err := Parse([]byte(`
pipelines:
  - name: s
    parallelism: 2
    source:
      mqtt:
        topics: [s/#]
        format: json
        fields: {id: {type: string, path: $.id}, v: {type: float, path: $.v}}
    key: id
    window: {type: tumbling, size: 1s, aggregates: [{name: n, fn: count}]}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	g := jobGraph(t, cfg.Pipelines[0], Inputs{})
	var src *actors.Vertex
	for _, v := range g.Vertices {
		if v.UID == "s/source" {
			src = v
		}
	}
	if src == nil {
		t.Fatal("no source vertex")
	}
	crosses := false
	for _, ed := range g.Edges {
		crosses = crosses || (ed.From == src && ed.To.Parallelism == 2 && ed.Partition == actors.Rebalance)
	}
	if !crosses {
		t.Fatal("the source does not send to two decoding subtasks round robin: the case this test is about is not built")
	}
	size, ok := src.RecordBytes.(func(mqtt.Message) int)
	if !ok || src.BatchBytes != SourceBatchBytes {
		t.Fatalf("source sizes its messages with %T, batches capped at %d bytes: want a func(mqtt.Message) int and %d", src.RecordBytes, src.BatchBytes, SourceBatchBytes)
	}
	if n := size(mqtt.Message{Topic: "s/a", Payload: make([]byte, 1<<20)}); n < 1<<20 {
		t.Fatalf("a message of 1 MiB weighs %d bytes", n)
	}
}

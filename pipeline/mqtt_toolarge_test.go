package pipeline

import (
	"context"
	"strings"
	"testing"

	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt/ingestlog"
)

// A dead-letter record in the ingest log (a message too large to keep,
// ingestlog.Message.TooLarge) reaches the pipeline's dead-letter output
// with its reason and the payload bytes kept, and is counted once; it is
// never decoded as a reading.
func TestTooLargeMessageIsADeadLetter(t *testing.T) {
	cfg, err := Parse([]byte(`
pipelines:
  - name: big
    source:
      mqtt:
        topics: [s/#]
        max_message_bytes: 4096
        format: csv
        fields: {id: string, temp: float}
    sinks: [{stdout: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.Pipelines[0]
	if pc.Source.MQTT.MaxMessageBytes != 4096 {
		t.Fatalf("max_message_bytes %d, want 4096", pc.Source.MQTT.MaxMessageBytes)
	}
	log, err := ingestlog.Open(t.TempDir(), ingestlog.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	for _, m := range []ingestlog.Message{
		{Topic: "s/a", Payload: []byte("a,1.5"), QoS: 1},
		// Its first bytes alone would decode as a reading.
		{Topic: "s/b", Payload: []byte("b,2.5"), QoS: 1, PacketID: 9, TooLarge: 9000},
		{Topic: "s/c", Payload: []byte("c,3.5"), QoS: 1},
	} {
		if _, err := log.Append(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	out := &testutil.Buffer{}
	job, stop := runMQTTJob(t, pc, log, "", 0, out)
	testutil.Eventually(t, testutil.DefaultTimeout, "the dead letter counted", func() bool { return job.DeadLetters() >= 1 })
	stop()
	s := out.String() // what the print sink flushed
	if strings.Contains(s, `"id":"b"`) {
		t.Fatalf("the dead letter was decoded as a reading:\n%s", s)
	}
	if job.DeadLetters() != 1 {
		t.Fatalf("dead letters %d, want 1; output:\n%s", job.DeadLetters(), s)
	}
	d := job.RecentDeadLetters()[0]
	if !strings.Contains(d.Err, "message too large: 9000 bytes on topic \"s/b\"") || d.Payload != "b,2.5" {
		t.Fatalf("dead letter %+v", d)
	}
}

// max_message_bytes above what an ingest-log record holds is refused,
// naming the key.
func TestMaxMessageBytesValidation(t *testing.T) {
	for _, v := range []string{"-1", "10", "67108811"} {
		_, err := Parse([]byte(`
pipelines:
  - name: big
    source:
      mqtt:
        topics: [s/#]
        max_message_bytes: ` + v + `
        format: csv
        fields: {id: string, temp: float}
    sinks: [{stdout: {}}]
`))
		if err == nil || !strings.Contains(err.Error(), "source.mqtt.max_message_bytes") {
			t.Errorf("max_message_bytes %s: %v", v, err)
		}
	}
}

package pipeline

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/edgedio/edged/mqtt"
)

// SettingsDigest returns the SHA-256, in hex, of what of p must be the
// same on every node of a cluster that runs it: everything that shapes
// its processing and results. That is its name and parallelism; the
// source's kind, the generator's settings, the decoding (format,
// delimiter, fields), the MQTT topics and max_message_bytes (what goes to
// the dead letters); event time; key; filter; compute; window and its
// aggregates; alerts; silent; the sinks in order, with the MQTT sinks'
// topic templates, QoS and batching; and whether checkpoints are on, their
// interval and mode (a sink's exactly-once publication depends on them).
//
// Node-local settings are left out, so nodes that differ only in them
// have the same digest: directories (checkpoint.dir, state_dir, a file
// source's path and a file sink's dir), the external MQTT broker, its
// client id, client, QoS, max_pending, redelivery_window and ack_delay,
// an MQTT sink's max_held,
// the checkpoint tuning the job master applies (timeout, max_concurrent,
// min_pause, tolerable_failures, prefer_checkpoint_for_recovery), the
// checkpoints retained on disk, the restart strategy and the state
// backend. Defaults are applied first, so a setting left out and the same
// value written out give the same digest.
//
// The daemon sets it as the job's settings digest
// (stream.WithSettingsDigest), which the plan fingerprint covers: a node
// whose digest differs from the job master's is refused
// (actors.ErrPlanMismatch).
func (p PipelineConfig) SettingsDigest() string {
	b, err := json.Marshal(p.shared())
	if err != nil {
		// Only plain values: cannot happen.
		panic("pipeline: settings digest: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// sharedSettings is what SettingsDigest hashes. Its JSON form is the
// digest's input: renaming or reordering its fields changes every digest
// (which only matters between nodes of different versions).
type sharedSettings struct {
	Version      int
	Name         string
	Parallelism  int
	Generator    *GeneratorSourceConfig `json:",omitempty"`
	File         *sharedDecoding        `json:",omitempty"`
	MQTT         *sharedMQTTSource      `json:",omitempty"`
	EventTime    *EventTimeConfig       `json:",omitempty"`
	Key          string
	Filter       string
	Compute      Exprs
	Window       *WindowConfig `json:",omitempty"`
	Alerts       []AlertConfig
	Silent       *SilentConfig `json:",omitempty"`
	Sinks        []sharedSink
	Checkpoints  bool
	CkptInterval time.Duration
	CkptMode     string
}

type sharedDecoding struct {
	Format    string
	Delimiter string
	Fields    Fields
}

type sharedMQTTSource struct {
	sharedDecoding
	Topics          []string
	MaxMessageBytes int64
}

type sharedSink struct {
	Stdout bool
	File   bool
	MQTT   *MQTTSinkConfig `json:",omitempty"`
}

func (p PipelineConfig) shared() sharedSettings {
	s := sharedSettings{
		Version: 1, Name: p.Name, Parallelism: max(p.Parallelism, 1),
		EventTime: p.EventTime, Key: p.Key, Filter: p.Filter, Compute: nilIfEmpty(p.Compute),
		Window: p.Window, Alerts: nilIfEmpty(p.Alerts), Silent: p.Silent,
		Checkpoints: p.Checkpoint.Dir != "",
	}
	if et := p.EventTime; et != nil {
		// max_ahead's default depends on the source; 0s is no bound.
		e := *et
		d := time.Duration(0)
		switch {
		case e.MaxAhead != nil:
			d = *e.MaxAhead
		case p.Source.Generator == nil:
			d = DefaultMaxAhead
		}
		e.MaxAhead = &d
		s.EventTime = &e
	}
	if s.Checkpoints {
		s.CkptInterval, s.CkptMode = p.Checkpoint.Interval, p.Checkpoint.Mode.String()
	}
	if s.Silent != nil {
		silent := *s.Silent
		silent.Name = cmp.Or(silent.Name, "silent")
		s.Silent = &silent
	}
	decoding := func(format, delim string, fields Fields) sharedDecoding {
		if format == "csv" {
			delim = cmp.Or(delim, ",")
		}
		return sharedDecoding{Format: format, Delimiter: delim, Fields: nilIfEmpty(fields)}
	}
	switch src := p.Source; {
	case src.Generator != nil:
		s.Generator = src.Generator
	case src.File != nil:
		d := decoding(src.File.Format, src.File.Delimiter, src.File.Fields)
		s.File = &d
	case src.MQTT != nil:
		s.MQTT = &sharedMQTTSource{
			sharedDecoding:  decoding(src.MQTT.Format, src.MQTT.Delimiter, src.MQTT.Fields),
			Topics:          nilIfEmpty(src.MQTT.Topics),
			MaxMessageBytes: cmp.Or(src.MQTT.MaxMessageBytes, mqtt.DefaultMaxMessageBytes),
		}
	}
	for _, sc := range p.Sinks {
		k := sharedSink{Stdout: sc.Stdout != nil, File: sc.File != nil}
		if sc.MQTT != nil {
			m := *sc.MQTT
			m.Batch = max(m.Batch, 1)
			if m.Batch > 1 {
				m.BatchBytes = cmp.Or(m.BatchBytes, mqtt.DefaultBatchBytes)
			} else {
				m.BatchBytes = 0
			}
			k.MQTT = &m
		}
		s.Sinks = append(s.Sinks, k)
	}
	return s
}

// PipelinesDigest returns the SHA-256, in hex, of the settings digests of
// pcs by name, in any order: nodes that run the same pipelines, whatever
// their node-local settings, have the same one.
func PipelinesDigest(pcs []PipelineConfig) string {
	byName := make(map[string]string, len(pcs))
	for _, pc := range pcs {
		byName[pc.Name] = pc.SettingsDigest()
	}
	b, err := json.Marshal(byName) // map keys are sorted
	if err != nil {
		panic("pipeline: pipelines digest: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// nilIfEmpty returns nil for an empty s, so that `[]` and a key left out
// give the same digest.
func nilIfEmpty[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

package mqtt

import (
	"errors"
	"fmt"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgedio/edged/mqtt/ingestlog"
)

// ingestTarget is an ingest log a message goes to, with its route key: 0 for
// the broker's own log, i+1 for the i-th route.
type ingestTarget struct {
	key int
	log *ingestlog.Log
}

// targets returns the logs a message on topic is appended to.
func (b *Broker) targets(topic string) []ingestTarget {
	var out []ingestTarget
	if b.log != nil && b.matches(topic) {
		out = append(out, ingestTarget{0, b.log})
	}
	for i, r := range b.routes {
		if r.matches(topic) {
			out = append(out, ingestTarget{i + 1, r.log})
		}
	}
	return out
}

// routeLog returns the log of route key, or nil.
func (b *Broker) routeLog(key int) *ingestlog.Log {
	if key == 0 {
		return b.log
	}
	if key-1 < len(b.routes) {
		return b.routes[key-1].log
	}
	return nil
}

// publishQoS2 appends a QoS 2 message of a persistent session exactly
// once. The first PUBLISH of a packet id records a receipt durably (the
// tag is the record's unique receive time), then appends and journals
// that it did (made durable before the log's next append); mochi sends
// the PUBREC. A PUBLISH of a packet id with a receipt (a resend after a
// reconnect or a crash) appends only where the message is not yet, found
// by a scan of the log if unsure, and is answered with PUBREC here,
// without routing it to subscribers again.
func (h *ingestHook) publishQoS2(cl *mochi.Client, pk packets.Packet, msg ingestlog.Message) (packets.Packet, error) {
	b, st := h.b, h.b.store
	rc, dup := st.receipt(cl.ID, pk.PacketID)
	if !dup {
		targets := b.targets(pk.TopicName)
		if len(targets) == 0 {
			return pk, nil
		}
		routes := make([]receiptRoute, len(targets))
		for i, t := range targets {
			routes[i] = receiptRoute{Key: t.key, From: t.log.Stats().NextOffset}
		}
		tag := st.nextTag(msg.Received.UnixNano())
		if err := st.record(&sessionRec{T: "i", Client: cl.ID, PacketID: pk.PacketID, Tag: tag,
			Topic: pk.TopicName, Routes: routes}, true); err != nil {
			return pk, h.fail(cl, pk, err)
		}
		for _, r := range routes {
			st.routeDone(cl.ID, pk.PacketID, r.Key, true, false)
		}
		if b.qos2Stage != nil {
			if err := b.qos2Stage("receipt", cl.ID, pk.PacketID); err != nil {
				return pk, h.fail(cl, pk, err)
			}
		}
		rc = qos2Receipt{tag: tag, topic: pk.TopicName, routes: routes}
		for i := range rc.routes {
			rc.routes[i].Known = true
		}
	}
	msg.Received = time.Unix(0, rc.tag)
	for _, r := range rc.routes {
		if r.Known && r.Done {
			continue
		}
		l := b.routeLog(r.Key)
		if l == nil {
			continue // the route is gone (the node's pipelines changed)
		}
		if !r.Known {
			found, err := findTagged(l, r.From, rc.tag, rc.topic)
			if err != nil {
				return pk, h.fail(cl, pk, err)
			}
			if found {
				st.routeDone(cl.ID, pk.PacketID, r.Key, true, true)
				continue
			}
		}
		// Unsure from here until the append returns: a failed append may
		// still have reached the disk.
		st.routeDone(cl.ID, pk.PacketID, r.Key, false, false)
		if err := st.syncAppended(); err != nil {
			return pk, h.fail(cl, pk, err)
		}
		m := fit(l, msg)
		off, err := l.Append(b.ctx, m)
		if errors.Is(err, ingestlog.ErrShed) {
			// The log of a pipeline that does not run is full: the
			// message is not stored there (counted by the log).
			st.routeDone(cl.ID, pk.PacketID, r.Key, true, true)
			continue
		}
		if err != nil {
			return pk, h.fail(cl, pk, err)
		}
		b.appended(l, m, pk.PacketID, off)
		if b.qos2Stage != nil {
			if err := b.qos2Stage("appended", cl.ID, pk.PacketID); err != nil {
				return pk, h.fail(cl, pk, err)
			}
		}
		st.routeDone(cl.ID, pk.PacketID, r.Key, true, true)
	}
	if !dup {
		return pk, nil
	}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID,
		Created: time.Now().Unix()}
	if cl.State.Inflight.Set(ack) {
		cl.State.Inflight.DecreaseReceiveQuota()
	}
	if err := cl.WritePacket(ack); err != nil {
		cl.Stop(err)
	}
	return pk, packets.ErrRejectPacket
}

// OnPacketRead refuses a PUBLISH to a topic name no client may publish
// to (see refuseTopic), and an MQTT 5 PUBLISH whose topic alias is 0 or above
// topicAliasMaximum (see refuseAlias; mochi refuses it too, but its
// DISCONNECT would wait behind the acknowledgements held for an fsync,
// and be dropped by the close). It forgets a QoS 2 receipt on PUBREL,
// durably, before mochi sends the PUBCOMP: after it the device may reuse
// the packet id.
func (h *ingestHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName != "" && !mochi.IsValidFilter(pk.TopicName, true) {
		// mochi drops such a PUBLISH without an acknowledgement and
		// without closing the connection: the device would wait for
		// its PUBACK forever.
		h.refuseTopic(cl, pk)
		return pk, packets.ErrRejectPacket
	}
	if pk.FixedHeader.Type == packets.Publish && pk.Properties.TopicAliasFlag {
		// Rejected here, the packet ends mochi's read loop with an error,
		// so mochi publishes the device's will, as MQTT 5 says for a
		// connection the server closes (rejected in OnPublish, the packet
		// would end nothing and the will would be forgotten; an error other
		// than a rejection, mochi ignores).
		switch alias := pk.Properties.TopicAlias; {
		case alias == 0 || alias > topicAliasMaximum:
			h.refuseAlias(cl, pk, "out of range")
			return pk, packets.ErrRejectPacket
		case pk.TopicName == "" && cl.State.TopicAliases.Inbound.Set(alias, "") == "":
			// Set with no topic returns the alias's topic, or records ""
			// for an alias never set: the connection ends either way.
			h.refuseAlias(cl, pk, "unknown")
			return pk, packets.ErrRejectPacket
		}
	}
	st := h.b.store
	if pk.FixedHeader.Type != packets.Pubrel || st == nil {
		return pk, nil
	}
	if _, ok := st.receipt(cl.ID, pk.PacketID); !ok {
		return pk, nil
	}
	if err := st.record(&sessionRec{T: "x", Client: cl.ID, PacketID: pk.PacketID}, true); err != nil {
		h.b.logger.Error("mqtt broker: releasing a QoS 2 packet id failed; disconnecting client", "client", cl.ID, "err", err)
		return pk, packets.ErrRejectPacket // no PUBCOMP: the device resends the PUBREL
	}
	if h.b.qos2Stage != nil {
		if err := h.b.qos2Stage("released", cl.ID, pk.PacketID); err != nil {
			cl.Stop(err)
			return pk, packets.ErrRejectPacket
		}
	}
	return pk, nil
}

// resolveReceipts settles, at Start, the receipts whose append a crash
// may have interrupted: each is looked for in its logs from the offset
// recorded before the append.
func (b *Broker) resolveReceipts() error {
	for client, rcs := range b.store.receiptsToResolve() {
		for pid, rc := range rcs {
			for _, r := range rc.routes {
				if r.Known {
					continue
				}
				l := b.routeLog(r.Key)
				if l == nil {
					continue
				}
				found, err := findTagged(l, r.From, rc.tag, rc.topic)
				if err != nil {
					return fmt.Errorf("mqtt: broker: settle QoS 2 receipt of %q: %w", client, err)
				}
				b.store.routeDone(client, pid, r.Key, true, found)
			}
		}
	}
	return nil
}

// findTagged reports whether l holds, at or after offset from, a record
// on topic received at tag ns. If the log was truncated past from, it
// looks from the first offset left. A record released by a completed
// checkpoint is not found; the receipts do not depend on that, since a
// receipt's "in the log" record ("ia") is durable before the log gets any
// later record, and so before a checkpoint can release this one.
func findTagged(l *ingestlog.Log, from uint64, tag int64, topic string) (bool, error) {
	if from > l.Stats().NextOffset {
		// The log ends before the offset recorded before the append: the
		// crash lost everything from there on (appends are written in
		// batches, acknowledged only once fsynced), this record with it.
		return false, nil
	}
	r, err := l.Reader(from)
	if errors.Is(err, ingestlog.ErrTruncated) {
		r, err = l.Reader(l.Stats().FirstOffset)
	}
	if err != nil {
		return false, err
	}
	defer r.Close()
	for {
		rec, ok, err := r.TryNext()
		if err != nil || !ok {
			return false, err
		}
		if !rec.Note && rec.Received.UnixNano() == tag && rec.Topic == topic {
			return true, nil
		}
	}
}

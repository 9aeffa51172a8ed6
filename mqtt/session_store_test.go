package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func openStore(t *testing.T, dir string, compact int64) *sessionStore {
	t.Helper()
	s, err := openSessionStore(dir, 0, compact, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The store replays what was synced, gives a delivery that had no packet
// id one at open, forgets what was acknowledged, and a clean session
// (client deleted) takes its messages and receipts with it.
func TestSessionStoreReplay(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 1<<20)
	for _, c := range []string{"a", "b"} {
		if err := s.record(&sessionRec{T: "c", Client: c, Version: 4}, true); err != nil {
			t.Fatal(err)
		}
	}
	var ids []uint64
	for i := range 3 {
		id, err := s.addMessage(context.Background(), sessionMsgData{Topic: "r", Payload: fmt.Appendf(nil, "m%d", i), Qos: 1},
			[]sessionTo{{Client: "a", Qos: 1}, {Client: "b", Qos: 1}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	s.assign("a", 10, ids[0], "r", []byte("m0"))
	s.assign("a", 11, ids[1], "r", []byte("m1"))
	s.record(&sessionRec{T: "d", Client: "a", PacketID: 10}, false)
	s.record(&sessionRec{T: "i", Client: "b", PacketID: 5, Tag: 42, Topic: "t", Routes: []receiptRoute{{Key: 0, From: 3}}}, true)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, 1<<20)
	st := s.Stats()
	if st.Sessions != 2 || st.Messages != 3 || st.Receipts != 1 {
		t.Fatalf("stats after reopen %+v", st)
	}
	if !s.outbound("a", 11) || s.outbound("a", 10) {
		t.Fatal("a's packet ids not restored: 11 in flight, 10 acknowledged")
	}
	for _, id := range ids {
		if d := s.msgs[id].pending["b"]; d == nil || d.pid == 0 {
			t.Fatalf("message %d: b has no packet id after open", id)
		}
	}
	if rc, ok := s.receipt("b", 5); !ok || rc.tag != 42 || rc.routes[0].From != 3 {
		t.Fatalf("receipt %+v %v", rc, ok)
	}
	s.record(&sessionRec{T: "cd", Client: "b"}, true)
	if st := s.Stats(); st.Sessions != 1 || st.Messages != 2 || st.Receipts != 0 {
		t.Fatalf("stats after b's session ended %+v", st)
	}
	s.close()
}

// A torn end (a crash mid-write) is cut off; a damaged record followed
// by good ones is an error.
func TestSessionStoreTornAndDamaged(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 1<<20)
	for i := range 3 {
		s.record(&sessionRec{T: "c", Client: fmt.Sprint(i)}, true)
	}
	s.close()
	path := filepath.Join(dir, sessionFile)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, good[:len(good)-3], 0o644)
	s = openStore(t, dir, 1<<20)
	if st := s.Stats(); st.Sessions != 2 || st.TornBytes == 0 {
		t.Fatalf("torn end: stats %+v", st)
	}
	s.close()

	bad := append([]byte(nil), good...)
	bad[sessionFrameHeader+2] ^= 0xff // first record's body
	os.WriteFile(path, bad, 0o644)
	if _, err := openSessionStore(dir, 0, 1<<20, slog.New(slog.DiscardHandler)); !errors.Is(err, ErrCorruptSession) {
		t.Fatalf("damaged first record: %v, want ErrCorruptSession", err)
	}
}

// The journal is rewritten when it grows past its bound, keeping the
// state.
func TestSessionStoreCompacts(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 4096)
	s.record(&sessionRec{T: "c", Client: "a"}, true)
	for i := range 500 {
		id, err := s.addMessage(context.Background(), sessionMsgData{Topic: "r", Payload: fmt.Appendf(nil, "m%d", i), Qos: 1},
			[]sessionTo{{Client: "a", Qos: 1}})
		if err != nil {
			t.Fatal(err)
		}
		pid := uint16(i%100 + 1)
		s.assign("a", pid, id, "r", fmt.Appendf(nil, "m%d", i))
		if i < 499 {
			s.record(&sessionRec{T: "d", Client: "a", PacketID: pid}, false)
		}
	}
	s.sync()
	st := s.Stats()
	if st.Compactions < 2 || st.Messages != 1 {
		t.Fatalf("stats %+v: want compactions and 1 message left", st)
	}
	s.close()
	fi, _ := os.Stat(filepath.Join(dir, sessionFile))
	if fi.Size() > 8192 {
		t.Fatalf("journal %d bytes after compaction", fi.Size())
	}
	s = openStore(t, dir, 4096)
	if st := s.Stats(); st.Messages != 1 || !s.outbound("a", 100) {
		t.Fatalf("after reopen: %+v", st)
	}
	s.close()
}

// A receipt whose message is known to be in a log keeps that across
// replay and compaction (every open compacts), and syncAppended makes the
// record durable; a receipt of another route stays to be resolved.
func TestSessionStoreReceiptAppended(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 1<<20)
	s.record(&sessionRec{T: "c", Client: "a"}, true)
	s.record(&sessionRec{T: "i", Client: "a", PacketID: 7, Tag: 1, Topic: "t",
		Routes: []receiptRoute{{Key: 0, From: 3}, {Key: 1, From: 9}}}, true)
	s.routeDone("a", 7, 0, true, true)
	if err := s.syncAppended(); err != nil {
		t.Fatal(err)
	}
	s.crash() // nothing unsynced may be needed
	for range 2 {
		s = openStore(t, dir, 1<<20)
		res := s.receiptsToResolve()
		rc, ok := res["a"][7]
		if !ok || len(rc.routes) != 2 {
			t.Fatalf("receipts to resolve %+v: want a/7 with its two routes", res)
		}
		if r := rc.routes[0]; !r.Known || !r.Done {
			t.Errorf("route 0 %+v: want known to be in the log", r)
		}
		if r := rc.routes[1]; r.Known {
			t.Errorf("route 1 %+v: want still to be resolved", r)
		}
		s.close()
	}
}

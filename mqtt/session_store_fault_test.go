package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// faultFS is the operating system's file system with failures injected
// by operation: "write", "sync" (of the journal), "write.tmp", "sync.tmp"
// (of a rewrite's new file), "rename", "syncdir". A failed write writes
// half its bytes first, as a full card or a crash leaves a torn end.
type faultFS struct {
	osFS
	mu    sync.Mutex // guards fail, every, calls, hits
	fail  map[string]error
	every map[string]int // op fails at every n-th call (ENOSPC)
	calls map[string]int
	hits  map[string]int
	// hold, when set, blocks every journal fsync until it is closed.
	hold chan struct{}
}

func newFaultFS() *faultFS {
	return &faultFS{fail: map[string]error{}, every: map[string]int{}, calls: map[string]int{}, hits: map[string]int{}}
}

func (fs *faultFS) set(op string, err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err == nil {
		delete(fs.fail, op)
	} else {
		fs.fail[op] = err
	}
}

// err returns the failure injected for op, counting it.
func (fs *faultFS) err(op string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	err := fs.fail[op]
	fs.calls[op]++
	if n := fs.every[op]; err == nil && n > 0 && fs.calls[op]%n == 0 {
		err = syscall.ENOSPC
	}
	if err != nil {
		fs.hits[op]++
	}
	return err
}

func (fs *faultFS) hit(op string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.hits[op]
}

func (fs *faultFS) OpenFile(name string, flag int, perm os.FileMode) (journalFile, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	suffix := ""
	if strings.HasSuffix(name, ".tmp") {
		suffix = ".tmp"
	}
	return &faultFile{File: f, fs: fs, suffix: suffix}, nil
}

func (fs *faultFS) Rename(from, to string) error {
	if err := fs.err("rename"); err != nil {
		return err
	}
	return os.Rename(from, to)
}

func (fs *faultFS) SyncDir(dir string) error {
	if err := fs.err("syncdir"); err != nil {
		return err
	}
	return fs.osFS.SyncDir(dir)
}

type faultFile struct {
	*os.File
	fs     *faultFS
	suffix string
}

func (f *faultFile) Write(b []byte) (int, error) {
	if err := f.fs.err("write" + f.suffix); err != nil {
		n, _ := f.File.Write(b[:len(b)/2])
		return n, err
	}
	return f.File.Write(b)
}

func (f *faultFile) Sync() error {
	if err := f.fs.err("sync" + f.suffix); err != nil {
		return err
	}
	f.fs.mu.Lock()
	hold := f.fs.hold
	f.fs.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return f.File.Sync()
}

func openFaultStore(t *testing.T, dir string, compact int64, fs *faultFS) *sessionStore {
	t.Helper()
	s, err := openSessionStoreFS(dir, 0, compact, slog.New(slog.DiscardHandler), fs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func storeMessage(s *sessionStore, payload string, to ...string) (uint64, error) {
	var rcpt []sessionTo
	for _, c := range to {
		rcpt = append(rcpt, sessionTo{Client: c, Qos: 1})
	}
	return s.addMessage(context.Background(), sessionMsgData{Topic: "r", Payload: []byte(payload), Qos: 1}, rcpt)
}

func noTmp(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, sessionFile+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed rewrite left its new file behind: %v", err)
	}
}

// A failed journal write (a full card) refuses the callers it covered,
// and so does each rewrite that fails while the card stays full; once
// space is freed the next durable record rewrites the journal and the
// store is healthy again. A message whose publisher was refused is not
// kept: no later rewrite persists it, and it holds no space.
func TestSessionStoreRecoversAfterFailedWrite(t *testing.T) {
	dir := t.TempDir()
	fs := newFaultFS()
	s := openFaultStore(t, dir, 1<<20, fs)
	if err := s.record(&sessionRec{T: "c", Client: "a"}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := storeMessage(s, "before", "a"); err != nil {
		t.Fatal(err)
	}

	fs.set("write", syscall.ENOSPC)
	fs.set("write.tmp", syscall.ENOSPC)
	if _, err := storeMessage(s, "refused", "a"); !errors.Is(err, ErrSessionStore) {
		t.Fatalf("message while the card is full: %v, want ErrSessionStore", err)
	}
	if st := s.Stats(); st.Messages != 1 || st.Bytes != sessionMsgSize(&sessionMsgData{Topic: "r", Payload: []byte("before")}, 1) || st.Failures != 1 {
		t.Fatalf("after the failed write %+v: want the refused message gone and 1 failure", st)
	}
	s.record(&sessionRec{T: "s", Client: "a", Sub: &sessionSub{Filter: "x/#", Qos: 1}}, false)
	if err := s.sync(); !errors.Is(err, ErrSessionStore) {
		t.Fatalf("sync while the card is full: %v, want ErrSessionStore", err)
	}
	if fs.hit("write.tmp") != 1 {
		t.Fatalf("%d rewrites tried, want 1 (by the sync)", fs.hit("write.tmp"))
	}
	noTmp(t, dir)
	if err := s.sync(); !errors.Is(err, ErrSessionStore) || fs.hit("write.tmp") != 2 {
		t.Fatalf("a second sync with nothing new: %v after %d rewrites, want the error after a second rewrite", err, fs.hit("write.tmp"))
	}

	fs.set("write", nil)
	fs.set("write.tmp", nil)
	if _, err := storeMessage(s, "after", "a"); err != nil {
		t.Fatalf("message once space is freed: %v", err)
	}
	if err := s.record(&sessionRec{T: "c", Client: "b"}, true); err != nil {
		t.Fatalf("session once healthy again: %v", err)
	}
	st := s.Stats()
	if st.Recoveries != 1 || st.Failures != 3 || st.Messages != 2 {
		t.Fatalf("after recovery %+v: want 1 recovery, 3 failures, messages before and after", st)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, 1<<20)
	defer s.close()
	if st := s.Stats(); st.Sessions != 2 || st.Messages != 2 || st.TornBytes != 0 {
		t.Fatalf("after reopen %+v: want sessions a and b, 2 messages, no torn end", st)
	}
	var payloads []string
	for _, m := range s.msgs {
		payloads = append(payloads, string(m.data.Payload))
	}
	if strings.Contains(strings.Join(payloads, ","), "refused") {
		t.Fatalf("messages %v: the refused one was persisted", payloads)
	}
	if _, ok := s.clients["a"].subs["x/#"]; !ok {
		t.Fatal("a's subscription, recorded while the card was full, was not persisted by the rewrite")
	}
}

// A QoS 2 receipt whose record failed is forgotten: the device got no
// PUBREC and resends the PUBLISH, which must not be taken for a resend of
// a message already received.
func TestSessionStoreFailedReceiptIsForgotten(t *testing.T) {
	dir := t.TempDir()
	fs := newFaultFS()
	s := openFaultStore(t, dir, 1<<20, fs)
	defer s.close()
	s.record(&sessionRec{T: "c", Client: "a"}, true)
	fs.set("sync", syscall.EIO)
	err := s.record(&sessionRec{T: "i", Client: "a", PacketID: 7, Tag: 1, Topic: "t", Routes: []receiptRoute{{Key: 0}}}, true)
	if !errors.Is(err, ErrSessionStore) {
		t.Fatalf("receipt with a failing fsync: %v, want ErrSessionStore", err)
	}
	if _, ok := s.receipt("a", 7); ok {
		t.Fatal("the refused receipt is still held")
	}
	fs.set("sync", nil)
	if err := s.record(&sessionRec{T: "i", Client: "a", PacketID: 7, Tag: 2, Topic: "t", Routes: []receiptRoute{{Key: 0}}}, true); err != nil {
		t.Fatal(err)
	}
	if rc, ok := s.receipt("a", 7); !ok || rc.tag != 2 {
		t.Fatalf("receipt of the resent PUBLISH %+v %v", rc, ok)
	}
}

// A rewrite (compaction) that fails at any step leaves no new file
// behind; the store refuses until a rewrite succeeds, and then holds, and
// after a crash opens with, every acknowledged message and not the
// refused one.
func TestSessionStoreFailedCompaction(t *testing.T) {
	for _, op := range []string{"write.tmp", "sync.tmp", "rename", "syncdir"} {
		t.Run(op, func(t *testing.T) {
			dir := t.TempDir()
			fs := newFaultFS()
			s := openFaultStore(t, dir, 1024, fs)
			if err := s.record(&sessionRec{T: "c", Client: "a"}, true); err != nil {
				t.Fatal(err)
			}
			fs.set(op, syscall.EIO)
			var acked int
			for s.Stats().Failures == 0 {
				if _, err := storeMessage(s, strings.Repeat("p", 100), "a"); err != nil {
					t.Fatalf("message %d: %v; its write succeeded before the rewrite failed", acked, err)
				}
				acked++
			}
			if fs.hit(op) != 1 {
				t.Fatalf("%s failed %d times, want once", op, fs.hit(op))
			}
			noTmp(t, dir)
			if _, err := storeMessage(s, "refused", "a"); !errors.Is(err, ErrSessionStore) {
				t.Fatalf("message while rewrites fail: %v, want ErrSessionStore", err)
			}
			noTmp(t, dir)
			fs.set(op, nil)
			if _, err := storeMessage(s, "after", "a"); err != nil {
				t.Fatalf("message once rewrites succeed: %v", err)
			}
			if st := s.Stats(); st.Recoveries != 1 || st.Messages != acked+1 {
				t.Fatalf("after recovery %+v", st)
			}
			s.crash()

			s = openStore(t, dir, 1024)
			defer s.close()
			if st := s.Stats(); st.Sessions != 1 || st.Messages != acked+1 {
				t.Fatalf("reopened %+v: want %d messages", st, acked+1)
			}
			for _, m := range s.msgs {
				if string(m.data.Payload) == "refused" {
					t.Fatal("the refused message was persisted")
				}
			}
		})
	}
}

// A restart after a failed write, before any rewrite, opens the journal:
// the failed write's torn end is cut off, the acknowledged records are
// there, and the store is healthy. After a failed fsync the whole record
// may be on the card (the kernel still had it): it is replayed, which is
// why a refused message may still be delivered after such a restart.
func TestSessionStoreRestartAfterFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		op       string
		torn     bool
		messages int
	}{{"write", true, 0}, {"sync", false, 1}} {
		t.Run(tc.op, func(t *testing.T) {
			dir := t.TempDir()
			fs := newFaultFS()
			s := openFaultStore(t, dir, 1<<20, fs)
			for _, c := range []string{"a", "b"} {
				if err := s.record(&sessionRec{T: "c", Client: c}, true); err != nil {
					t.Fatal(err)
				}
			}
			fs.set(tc.op, syscall.EIO)
			if _, err := storeMessage(s, "refused", "a", "b"); !errors.Is(err, ErrSessionStore) {
				t.Fatalf("message: %v, want ErrSessionStore", err)
			}
			s.crash()

			s = openStore(t, dir, 1<<20)
			st := s.Stats()
			if st.Sessions != 2 || st.Messages != tc.messages || (st.TornBytes > 0) != tc.torn {
				t.Fatalf("reopened %+v: want 2 sessions, %d messages, torn end %v", st, tc.messages, tc.torn)
			}
			if _, err := storeMessage(s, "next", "a"); err != nil {
				t.Fatal(err)
			}
			s.close()
			s = openStore(t, dir, 1<<20)
			defer s.close()
			if st := s.Stats(); st.Messages != tc.messages+1 || st.TornBytes != 0 {
				t.Fatalf("reopened again %+v", st)
			}
		})
	}
}

// A start on a card still full (the rewrite at open fails) opens the
// store failed instead of refusing to start the broker: what the journal
// held is there, a durable record is refused while the card stays full,
// and the first one once space is freed rewrites the journal.
func TestSessionStoreOpensFailedOnAFullCard(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 1<<20)
	s.record(&sessionRec{T: "c", Client: "a"}, true)
	if _, err := storeMessage(s, "kept", "a"); err != nil {
		t.Fatal(err)
	}
	s.close()

	fs := newFaultFS()
	fs.set("write.tmp", syscall.ENOSPC)
	s = openFaultStore(t, dir, 1<<20, fs)
	if st := s.Stats(); st.Sessions != 1 || st.Messages != 1 || st.Failures != 1 {
		t.Fatalf("opened on a full card %+v", st)
	}
	if err := s.record(&sessionRec{T: "c", Client: "b"}, true); !errors.Is(err, ErrSessionStore) {
		t.Fatalf("session on a full card: %v, want ErrSessionStore", err)
	}
	noTmp(t, dir)
	fs.set("write.tmp", nil)
	if _, err := storeMessage(s, "next", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, 1<<20)
	defer s.close()
	if st := s.Stats(); st.Sessions != 2 || st.Messages != 2 {
		t.Fatalf("reopened %+v: want a, b and both messages", st)
	}
}

// Writers racing with failing writes and rewrites (every 3rd journal
// write, every 2nd rewrite): after the last rewrite succeeds, the journal
// holds exactly the messages whose addMessage returned nil.
func TestSessionStoreFailuresUnderConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	fs := newFaultFS()
	s := openFaultStore(t, dir, 1<<20, fs)
	if err := s.record(&sessionRec{T: "c", Client: "a"}, true); err != nil {
		t.Fatal(err)
	}
	fs.mu.Lock()
	fs.every["write"], fs.every["write.tmp"] = 3, 2
	fs.mu.Unlock()
	var mu sync.Mutex
	accepted := map[string]bool{}
	var refused int
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				p := fmt.Sprintf("w%d-%d", w, i)
				_, err := storeMessage(s, p, "a")
				mu.Lock()
				if err == nil {
					accepted[p] = true
				} else if errors.Is(err, ErrSessionStore) {
					refused++
				} else {
					t.Errorf("%s: %v", p, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fs.mu.Lock()
	clear(fs.every)
	fs.mu.Unlock()
	if _, err := storeMessage(s, "last", "a"); err != nil {
		t.Fatal(err)
	}
	accepted["last"] = true
	if refused == 0 || s.Stats().Recoveries == 0 {
		t.Fatalf("%d refused, stats %+v: the failures were not reached", refused, s.Stats())
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, 1<<20)
	defer s.close()
	got := map[string]bool{}
	for _, m := range s.msgs {
		got[string(m.data.Payload)] = true
	}
	if len(got) != len(accepted) {
		t.Errorf("journal holds %d messages, %d were accepted (%d refused)", len(got), len(accepted), refused)
	}
	for p := range accepted {
		if !got[p] {
			t.Errorf("accepted message %s lost", p)
		}
	}
}

package stream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgedio/edged/snapshot"
)

// oneFile is a job master's execution that restores one state file.
type oneFile struct {
	epoch uint64
	path  string
	h     snapshot.Handle
}

func (o *oneFile) ReceiveFile(uint64, snapshot.ID, string, int64, uint32, io.Reader) error {
	return errors.New("not a push target")
}

func (o *oneFile) OpenRestoreFile(epoch uint64, name string) (*os.File, snapshot.Handle, error) {
	if epoch != o.epoch || name != o.h.File {
		return nil, snapshot.Handle{}, os.ErrNotExist
	}
	f, err := os.Open(o.path)
	return f, o.h, err
}

// A job's deployment invites the worker processes before the call that
// starts the job returns (stream.Environment.ExecuteAsync): a worker
// restoring a savepoint may fetch its state files from the master's
// process before the benchmark has the job in hand. The fetch waits for
// the job instead of being refused ("no job", "no attempt runs"), which
// failed the worker's deployment, and with it the job restarted from the
// savepoint (BenchmarkRebalancePauseProcesses's full-restart arm).
func TestProcFilesServeAJobBeingStarted(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "state.0.state")
	body := bytes.Repeat([]byte("keyed state "), 1000)
	if err := os.WriteFile(src, body, 0o644); err != nil {
		t.Fatal(err)
	}
	size, sum, err := snapshot.Checksum(src)
	if err != nil {
		t.Fatal(err)
	}
	job := &oneFile{epoch: 7, path: src, h: snapshot.Handle{File: "state.0.state", Size: size, Checksum: sum}}

	entered := make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	files := &procFiles{entered: func() {
		if armed.Load() {
			once.Do(func() { close(entered) })
		}
	}}
	srv := httptest.NewServer(files.handler())
	defer srv.Close()
	worker := &httpFiles{}
	addr := srv.Listener.Addr().String()
	worker.master.Store(&addr)

	// The attempt before, of the job stopped with the savepoint.
	files.start(func() stateFiles { return &oneFile{epoch: 6, path: src, h: job.h} })

	dst := filepath.Join(dir, "fetched")
	fetched := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	armed.Store(true)
	files.start(func() stateFiles {
		// The job invites the worker, which fetches at once; the call
		// that starts the job has not returned yet.
		go func() { fetched <- worker.Fetch(ctx, "node-0", "rebalance", 7, 1, job.h, dst) }()
		select {
		case <-entered:
		case err := <-fetched:
			t.Fatalf("the fetch ended before it reached the master: %v", err)
		}
		return job
	})
	if err := <-fetched; err != nil {
		t.Fatalf("fetch while the job was being started: %v", err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("fetched %d bytes, want %d", len(got), len(body))
	}
}

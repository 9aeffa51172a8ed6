package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgedio/edged/stream"
)

// gateWriter holds every Write until open is closed; entered is closed at
// the first.
type gateWriter struct {
	entered, open chan struct{}
	once          sync.Once
	mu            sync.Mutex // guards buf
	buf           bytes.Buffer
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.open
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// A pipeline stopped with a savepoint in the middle of its file, whose
// file is then rotated (renamed, a shorter one written at the path), and
// started again from the savepoint reads the new file from its start and
// counts it, instead of seeking past the new file's end and reading
// nothing.
func TestFileSourceRestoredIntoRotatedFile(t *testing.T) {
	const lines = 50_000
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "old%d,%d,20.5\n", i, 1547718199+i)
	}
	cpDir := filepath.Join(t.TempDir(), "cp")
	pc := csvPipeline(t, b.String(), "    checkpoint: {dir: "+cpDir+"}\n")
	path := pc.Source.File.Path
	opts, err := EnvOptions(pc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The sink holds its first write: the source, held back by it, is
	// in the middle of the file when the savepoint is asked. A source
	// that has ended refuses the savepoint, failing the test.
	gw := &gateWriter{entered: make(chan struct{}), open: make(chan struct{})}
	env := stream.NewEnvironment(pc.Name, append(opts, stream.WithBatchSize(1), stream.WithCredits(1))...)
	if _, err := BuildJob(pc, env, gw); err != nil {
		t.Fatal(err)
	}
	job, err := env.ExecuteAsync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-gw.entered:
	case <-ctx.Done():
		t.Fatal("no output")
	}
	type result struct {
		path string
		err  error
	}
	saved := make(chan result, 1)
	go func() {
		p, err := job.StopWithSavepoint(ctx, "")
		saved <- result{p, err}
	}()
	close(gw.open)
	sp := <-saved
	if err := job.Wait(); sp.err != nil || err != nil {
		t.Fatalf("stop with savepoint: %v; Wait: %v", sp.err, err)
	}
	gw.mu.Lock()
	before := strings.Count(gw.buf.String(), `"id":"old`)
	gw.mu.Unlock()
	t.Logf("%d rows before the savepoint", before)
	if before == 0 || before >= lines {
		t.Fatalf("%d rows before the savepoint, want some of the %d", before, lines)
	}

	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	var want []string
	var nb strings.Builder
	for i := range 5 {
		fmt.Fprintf(&nb, "new%d,%d,21.5\n", i, 1547718299+i)
		want = append(want, fmt.Sprintf("new%d", i))
	}
	if err := os.WriteFile(path, []byte(nb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	env = stream.NewEnvironment(pc.Name, append(opts, stream.WithSavepoint(sp.path, false))...)
	var out bytes.Buffer
	pj, err := BuildJob(pc, env, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if i := strings.Index(l, `"id":"`); i >= 0 {
			got = append(got, strings.SplitN(l[i+len(`"id":"`):], `"`, 2)[0])
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows after the restore: %q, want the new file's %q\n%s", got, want, out.String())
	}
	if pj.FileSourceResets() != 1 || !pj.ReadsFile() {
		t.Errorf("FileSourceResets() = %d, ReadsFile() = %v; want 1, true", pj.FileSourceResets(), pj.ReadsFile())
	}
}

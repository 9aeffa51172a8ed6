package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing directory synced")
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, content := range []string{"first", "2"} {
		if err := WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != content {
			t.Fatalf("read %q (%v), want %q", b, err, content)
		}
	}
	if left, _ := filepath.Glob(path + ".*"); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	if err := WriteFile(filepath.Join(path, "under-a-file"), []byte("x")); err == nil {
		t.Fatal("a file under a file was written")
	}
}

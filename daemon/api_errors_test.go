package daemon_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
)

// TestSavepointPathInAJSONBody: a savepoint or stop request may name its
// path in a JSON body; a body that is not {"path": ...}, or one whose
// path differs from the query's, is refused with 400 before any
// savepoint begins rather than ignored.
func TestSavepointPathInAJSONBody(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, tickingConfig("ticking", filepath.Join(dir, "cp")), daemon.Options{})
	post := func(path, body string) (int, string) {
		t.Helper()
		res, err := http.Post("http://"+n.addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b daemon.ErrorBody
		var sp daemon.SavepointResult
		raw, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			if err := json.Unmarshal(raw, &b); err != nil {
				t.Fatalf("POST %s: %d %q: not a JSON error: %v", path, res.StatusCode, raw, err)
			}
			return res.StatusCode, b.Error
		}
		if err := json.Unmarshal(raw, &sp); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, sp.Path
	}
	want := filepath.Join(dir, "cp", "savepoints", "from-body")
	if code, p := post("/jobs/ticking/savepoint", `{"path": "from-body"}`); code != http.StatusOK || p != want {
		t.Fatalf("savepoint with body path: %d %q, want 200 %s", code, p, want)
	}
	if _, err := os.Stat(filepath.Join(want, "_metadata")); err != nil {
		t.Errorf("no savepoint at the body's path: %v", err)
	}
	// The same path in both is taken.
	want = filepath.Join(dir, "cp", "savepoints", "both")
	if code, p := post("/jobs/ticking/savepoint?path=both", `{"path": "both"}`); code != http.StatusOK || p != want {
		t.Fatalf("savepoint with the same path twice: %d %q, want 200 %s", code, p, want)
	}
	for _, tc := range []struct{ path, body, want string }{
		{"/jobs/ticking/savepoint", `{"dir": "x"}`, `unknown field "dir"`},
		{"/jobs/ticking/savepoint", `{"path": 5}`, `not {"path": "<path>"}`},
		{"/jobs/ticking/savepoint", `path=x`, `not {"path": "<path>"}`},
		{"/jobs/ticking/savepoint", `{"path": "a"} {"path": "b"}`, "not one object"},
		{"/jobs/ticking/savepoint?path=a", `{"path": "b"}`, `the query's "a" and the body's "b" differ`},
		{"/jobs/ticking/stop", `{"path": "../x"}`, "snapshot: invalid name"},
		{"/jobs/ticking/stop", `{"path": "x"` + strings.Repeat(" ", 64<<10) + `}`, "over 65536 bytes"},
	} {
		code, msg := post(tc.path, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %.40q: %d %q, want 400 naming %q", tc.path, tc.body, code, msg, tc.want)
		}
	}
	cps, err := n.client.Checkpoints(ctxT(t), "ticking")
	if err != nil {
		t.Fatal(err)
	}
	var sps int
	for _, c := range cps {
		if c.Kind == "savepoint" {
			sps++
		}
	}
	if sps != 2 {
		t.Errorf("%d savepoints in the history, want the 2 taken: a refused body must begin none", sps)
	}
}

// TestAPIUnknownEndpointErrors: an API path no endpoint takes answers a
// JSON 404, and a known path asked with another method a JSON 405 naming
// the methods it takes, whatever the method; the dashboard keeps its
// paths.
func TestAPIUnknownEndpointErrors(t *testing.T) {
	n := startNode(t, tickingConfig("ticking", filepath.Join(t.TempDir(), "cp")), daemon.Options{})
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{http.MethodGet, "/jobs/ticking/savepoint", http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, "/jobs/ticking/savepoint", http.StatusMethodNotAllowed, "POST"},
		{http.MethodPost, "/jobs", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, "/jobs/ticking/checkpoints", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/jobs/ticking/nothing", http.StatusNotFound, ""},
		{http.MethodPost, "/jobs/ticking/nothing", http.StatusNotFound, ""},
		{http.MethodGet, "/cluster/nothing", http.StatusNotFound, ""},
		{http.MethodDelete, "/metrics/x", http.StatusNotFound, ""},
	} {
		req, err := http.NewRequest(tc.method, "http://"+n.addr+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b daemon.ErrorBody
		err = json.NewDecoder(res.Body).Decode(&b)
		res.Body.Close()
		if res.StatusCode != tc.code || err != nil || b.Error == "" || res.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q, body %+v (%v); want %d, Allow %q and a JSON error",
				tc.method, tc.path, res.StatusCode, res.Header.Get("Allow"), b, err, tc.code, tc.allow)
		}
	}
	// The dashboard and the endpoints keep answering.
	for _, p := range []string{"/", "/jobs"} {
		res, err := http.Get("http://" + n.addr + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", p, res.StatusCode)
		}
	}
}

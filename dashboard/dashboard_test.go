package dashboard_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/edgedio/edged/dashboard"
)

// The UI stays small and self-contained: under 300 KB and nothing
// loaded from another origin (the device may be offline).
func TestAssetsSmallAndOffline(t *testing.T) {
	var total int64
	remote := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|import\s+[^;]*from\s+["']https?:`)
	files := 0
	err := fs.WalkDir(dashboard.Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		b, err := fs.ReadFile(dashboard.Assets(), p)
		if err != nil {
			return err
		}
		total += int64(len(b))
		if m := remote.Find(b); m != nil {
			t.Errorf("%s loads from another origin: %q", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 || total >= 300<<10 {
		t.Fatalf("%d files, %d bytes; want index.html, style.css, app.js under 300 KB", files, total)
	}
}

// The handler serves the page, its module and its stylesheet with their
// types and a same-origin content security policy.
func TestHandler(t *testing.T) {
	srv := httptest.NewServer(dashboard.Handler())
	defer srv.Close()
	for path, ctype := range map[string]string{"/": "text/html", "/app.js": "javascript", "/style.css": "text/css"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), ctype) || len(b) == 0 {
			t.Errorf("GET %s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
	}
	srv.CloseClientConnections()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

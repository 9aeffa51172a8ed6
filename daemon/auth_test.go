package daemon

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgedio/edged/pipeline"
)

// The token decision follows the configured listen address: loopback
// addresses are open, anything else needs a token (generated when none is
// configured), and RequireToken forces it.
func TestTokenDecision(t *testing.T) {
	for _, tc := range []struct {
		listen     string
		configured string
		force      bool
		want       string // "" none, "gen" generated, else the token
	}{
		{"127.0.0.1:8081", "", false, ""},
		{"127.0.0.1:8081", "secret", false, ""},
		{"localhost:8081", "", false, ""},
		{"[::1]:8081", "", false, ""},
		{"127.0.0.2:8081", "", false, ""},
		{"0.0.0.0:8081", "", false, "gen"},
		{":8081", "", false, "gen"},
		{"[::]:8081", "", false, "gen"},
		{"192.168.1.20:8081", "secret", false, "secret"},
		{"edge-box.local:8081", "", false, "gen"},
		{"127.0.0.1:0", "secret", true, "secret"},
		{"127.0.0.1:0", "", true, "gen"},
	} {
		tok, generated, err := resolveToken(tc.listen, tc.configured, tc.force)
		if err != nil {
			t.Fatal(err)
		}
		switch tc.want {
		case "":
			if tok != "" || generated {
				t.Errorf("%s (force %v): token %q generated %v, want none", tc.listen, tc.force, tok, generated)
			}
		case "gen":
			if len(tok) != 32 || !generated {
				t.Errorf("%s (force %v): token %q generated %v, want a generated one", tc.listen, tc.force, tok, generated)
			}
		default:
			if tok != tc.want || generated {
				t.Errorf("%s (force %v): token %q generated %v, want %q", tc.listen, tc.force, tok, generated, tc.want)
			}
		}
		if got := NeedsToken(tc.listen, tc.force); got != (tc.want != "") {
			t.Errorf("NeedsToken(%q, %v) = %v", tc.listen, tc.force, got)
		}
	}
	a, _, _ := resolveToken("0.0.0.0:1", "", false)
	b, _, _ := resolveToken("0.0.0.0:1", "", false)
	if a == b {
		t.Errorf("two generated tokens are equal: %q", a)
	}
}

// requireToken lets through a request with the bearer token or the
// cookie, turns ?token= into the cookie, and refuses everything else with
// 401 and a JSON error.
func TestRequireToken(t *testing.T) {
	reached := 0
	h := requireToken("s3cret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		w.WriteHeader(http.StatusOK)
	}))
	do := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for name, r := range map[string]*http.Request{
		"none":          httptest.NewRequest("GET", "/jobs", nil),
		"wrong bearer":  withHeader(httptest.NewRequest("GET", "/jobs", nil), "Authorization", "Bearer nope"),
		"basic":         withHeader(httptest.NewRequest("GET", "/jobs", nil), "Authorization", "Basic czNjcmV0"),
		"wrong cookie":  withCookie(httptest.NewRequest("GET", "/", nil), "nope"),
		"wrong query":   httptest.NewRequest("GET", "/?token=nope", nil),
		"post by query": httptest.NewRequest("POST", "/jobs/x/cancel?token=s3cret", nil),
		"empty bearer":  withHeader(httptest.NewRequest("GET", "/jobs", nil), "Authorization", "Bearer "),
	} {
		w := do(r)
		if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), `"error"`) {
			t.Errorf("%s: %d %s, want 401 with an error body", name, w.Code, w.Body)
		}
	}
	if reached != 0 {
		t.Fatalf("handler reached %d times without the token", reached)
	}
	if w := do(withHeader(httptest.NewRequest("POST", "/jobs/x/cancel", nil), "Authorization", "Bearer s3cret")); w.Code != http.StatusOK {
		t.Errorf("bearer: %d", w.Code)
	}
	if w := do(withCookie(httptest.NewRequest("GET", "/jobs", nil), "s3cret")); w.Code != http.StatusOK {
		t.Errorf("cookie: %d", w.Code)
	}
	// The scheme is case-insensitive (RFC 7235): a client that writes
	// "bearer" is let in too.
	if w := do(withHeader(httptest.NewRequest("GET", "/jobs", nil), "Authorization", "bearer s3cret")); w.Code != http.StatusOK {
		t.Errorf("lower-case bearer: %d", w.Code)
	}
	if reached != 3 {
		t.Fatalf("handler reached %d times with the token, want 3", reached)
	}
	w := do(httptest.NewRequest("GET", "/?token=s3cret", nil))
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/" {
		t.Fatalf("?token=: %d Location %q", w.Code, w.Header().Get("Location"))
	}
	c := w.Result().Cookies()
	if len(c) != 1 || c[0].Name != TokenCookie || c[0].Value != "s3cret" || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookies %+v", c)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Accept", "text/html,application/xhtml+xml")
	if w := do(r); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "/?token=") {
		t.Errorf("browser without token: %d %s", w.Code, w.Body)
	}
	if h := requireToken("", http.NotFoundHandler()); h == nil {
		t.Fatal("no handler without a token")
	}
}

func withHeader(r *http.Request, k, v string) *http.Request {
	r.Header.Set(k, v)
	return r
}

func withCookie(r *http.Request, v string) *http.Request {
	r.AddCookie(&http.Cookie{Name: TokenCookie, Value: v})
	return r
}

// deadLetters answers the newest first, at most limit.
func TestDeadLettersAnswer(t *testing.T) {
	recent := []pipeline.DeadLetter{{Err: "e1", Payload: "p1"}, {Err: "e2", Payload: "p2"}, {Err: "e3", Payload: "p3"}}
	l := deadLetters("j", 7, recent, 2)
	if l.Job != "j" || l.Total != 7 || len(l.Recent) != 2 || l.Recent[0] != (DeadLetterInfo{Error: "e3", Payload: "p3"}) || l.Recent[1].Payload != "p2" {
		t.Fatalf("%+v", l)
	}
	if l := deadLetters("j", 0, nil, 5); l.Recent == nil || len(l.Recent) != 0 {
		t.Fatalf("%+v", l)
	}
}

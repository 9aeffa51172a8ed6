package daemon

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// TokenCookie is the cookie the dashboard's /?token=<t> sets, so the
// browser sends the token with every later request.
const TokenCookie = "edged_token"

// IsLoopback reports whether the listen address listen (host:port) binds
// only to the loopback interface: a loopback IP or "localhost". An empty
// host, a wildcard (0.0.0.0, ::) or any other name or address is not
// loopback.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// NeedsToken reports whether the REST API and the dashboard of a node
// listening on listen require a token: when listen is not loopback, or
// when force is set.
func NeedsToken(listen string, force bool) bool {
	return force || !IsLoopback(listen)
}

// resolveToken returns the token the API requires ("" for none): the
// configured one when the address needs a token, else a generated one
// (generated reports that, so it is logged).
func resolveToken(listen, configured string, force bool) (token string, generated bool, err error) {
	if !NeedsToken(listen, force) {
		return "", false, nil
	}
	if configured != "" {
		return configured, false, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", false, err
	}
	return hex.EncodeToString(b), true, nil
}

// requireToken wraps h so that, when token is not empty, every request
// must carry it: as "Authorization: Bearer <token>" (the scheme in any
// case) or in the TokenCookie cookie. A GET with ?token=<token> sets the cookie and
// redirects to the same URL without it, so a link printed at start opens
// the dashboard. Any other request is answered 401.
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	ok := func(t string) bool {
		return t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 7235): "bearer" is as good.
		if scheme, t, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") && ok(strings.TrimSpace(t)) {
			h.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(TokenCookie); err == nil && ok(c.Value) {
			h.ServeHTTP(w, r)
			return
		}
		if q := r.URL.Query(); r.Method == http.MethodGet && q.Has("token") && ok(q.Get("token")) {
			http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: token, Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode})
			q.Del("token")
			u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="edged"`)
		if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
			// A browser opening the dashboard: say how to get in.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, unauthorizedPage)
			return
		}
		writeJSON(w, http.StatusUnauthorized, ErrorBody{Error: ErrUnauthorized.Error()})
	})
}

// unauthorizedPage answers a browser without the token.
const unauthorizedPage = `<!doctype html><meta charset="utf-8"><title>edged: token required</title>
<body style="font-family:system-ui,sans-serif;margin:3em;max-width:40em">
<h1>Token required</h1>
<p>This node listens on a network address, so its dashboard and REST API
require a token. Open <code>/?token=&lt;token&gt;</code> once: the token is
the config's <code>node.token</code>, or the one the node logged at start.</p>
</body>
`

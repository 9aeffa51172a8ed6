// Package dashboard is the node's web dashboard: static HTML, CSS and
// JavaScript modules embedded in the binary, reading the node's REST API
// from the browser. Nothing is built or fetched at run time, so it works
// on an offline device.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Assets returns the dashboard's files (index.html at the root).
func Assets() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	return sub
}

// Handler serves the dashboard's files; mount it at "/".
func Handler() http.Handler {
	fsrv := http.FileServerFS(Assets())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'")
		fsrv.ServeHTTP(w, r)
	})
}

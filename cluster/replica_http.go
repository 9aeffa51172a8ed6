package cluster

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// ReplicaPath is the REST path, below a node's API address, of the
// replicas it holds: ReplicaPath/{node}/{job}/{checkpoint}/{file}.
const ReplicaPath = "/cluster/replicas"

// Header names of the replica API.
const (
	replicaSumHeader  = "X-Edged-Crc32c"
	replicaSizeHeader = "X-Edged-Size"
	replicaErrHeader  = "X-Edged-Replica-Error"
)

// ReplicaHandler serves a store's replicas to its peers: PUT stores one
// (its CRC32C in the X-Edged-Crc32c header, its size as the body's
// length), GET reads one (X-Edged-Crc32c and X-Edged-Size name what the
// reader expects; a replica that does not match is refused, never
// served). With a token, every request must carry it as a bearer token.
func ReplicaHandler(s *ReplicaStore, token string) http.Handler {
	mux := http.NewServeMux()
	pattern := ReplicaPath + "/{node}/{job}/{checkpoint}/{file}"
	mux.HandleFunc("PUT "+pattern, func(w http.ResponseWriter, r *http.Request) {
		k, sum, err := replicaRequest(r)
		if err != nil {
			replicaError(w, err)
			return
		}
		if r.ContentLength < 0 {
			http.Error(w, "content length required", http.StatusLengthRequired)
			return
		}
		replicaError(w, s.Put(k, sum, r.ContentLength, r.Body))
	})
	mux.HandleFunc("GET "+pattern, func(w http.ResponseWriter, r *http.Request) {
		k, sum, err := replicaRequest(r)
		var size int64
		if err == nil {
			size, err = strconv.ParseInt(r.Header.Get(replicaSizeHeader), 10, 64)
			if err != nil {
				err = fmt.Errorf("%w: size: %v", ErrBadReplicaKey, err)
			}
		}
		var b []byte
		if err == nil {
			b, err = s.Open(k, sum, size)
		}
		if err != nil {
			replicaError(w, err)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func replicaRequest(r *http.Request) (ReplicaKey, uint32, error) {
	id, err := strconv.ParseInt(r.PathValue("checkpoint"), 10, 64)
	if err != nil {
		return ReplicaKey{}, 0, fmt.Errorf("%w: checkpoint %q", ErrBadReplicaKey, r.PathValue("checkpoint"))
	}
	k := ReplicaKey{Node: r.PathValue("node"), Job: r.PathValue("job"), Checkpoint: id, File: r.PathValue("file")}
	if err := k.Validate(); err != nil {
		return ReplicaKey{}, 0, err
	}
	sum, err := strconv.ParseUint(r.Header.Get(replicaSumHeader), 16, 32)
	if err != nil {
		return ReplicaKey{}, 0, fmt.Errorf("%w: %s header: %v", ErrBadReplicaKey, replicaSumHeader, err)
	}
	return k, uint32(sum), nil
}

// replicaError writes err's status, with a header naming the replica
// error so that the client can wrap the same sentinel.
func replicaError(w http.ResponseWriter, err error) {
	if err == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	code, kind := http.StatusInternalServerError, ""
	switch {
	case errors.Is(err, ErrBadReplicaKey):
		code, kind = http.StatusBadRequest, "bad-key"
	case errors.Is(err, ErrReplicaMissing):
		code, kind = http.StatusNotFound, "missing"
	case errors.Is(err, ErrReplicaCorrupt):
		code, kind = http.StatusUnprocessableEntity, "corrupt"
	}
	w.Header().Set(replicaErrHeader, kind)
	http.Error(w, err.Error(), code)
}

// HTTPReplicaClient copies replicas over the peers' REST APIs
// (ReplicaHandler).
type HTTPReplicaClient struct {
	// Client sends the requests; nil means http.DefaultClient.
	Client *http.Client
	// Addr returns a peer's API address (host:port).
	Addr func(peer string) (string, error)
	// Token, if set, is sent as a bearer token.
	Token string
}

func (c *HTTPReplicaClient) do(ctx context.Context, method, peer string, k ReplicaKey, sum uint32, size int64, body io.Reader) (*http.Response, error) {
	addr, err := c.Addr(peer)
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "http", Host: addr, Path: fmt.Sprintf("%s/%s/%s/%d/%s", ReplicaPath, k.Node, k.Job, k.Checkpoint, k.File)}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
	}
	req.Header.Set(replicaSumHeader, strconv.FormatUint(uint64(sum), 16))
	req.Header.Set(replicaSizeHeader, strconv.FormatInt(size, 10))
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	switch resp.Header.Get(replicaErrHeader) {
	case "missing":
		err = fmt.Errorf("%w: %w", ErrReplicaMissing, err)
	case "corrupt":
		err = fmt.Errorf("%w: %w", ErrReplicaCorrupt, err)
	case "bad-key":
		err = fmt.Errorf("%w: %w", ErrBadReplicaKey, err)
	}
	return nil, err
}

// PutReplica implements ReplicaClient.
func (c *HTTPReplicaClient) PutReplica(ctx context.Context, peer string, k ReplicaKey, sum uint32, size int64, body io.Reader) error {
	resp, err := c.do(ctx, http.MethodPut, peer, k, sum, size, body)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// GetReplica implements ReplicaClient.
func (c *HTTPReplicaClient) GetReplica(ctx context.Context, peer string, k ReplicaKey, sum uint32, size int64) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, peer, k, sum, size, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, size+1))
	if err != nil {
		return nil, err
	}
	return b, nil
}

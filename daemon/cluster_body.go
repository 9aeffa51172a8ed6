package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Errors of the request bodies the node reads from its peers.
var (
	// ErrBodyTooLarge refuses a peer's request whose declared length is
	// over what its endpoint takes.
	ErrBodyTooLarge = errors.New("daemon: request body too large")
	// ErrBodiesBusy refuses a peer's request whose body does not fit in
	// what the bodies being read meanwhile left of the node's budget
	// (peerBodyBudget): the sender may try again.
	ErrBodiesBusy = errors.New("daemon: too many large request bodies being read; try again")
)

// maxPeerAnswer bounds the answers to the node's calls of its peers that
// are read whole (a job list, an ingest list, a drain's result), as the
// CLI's client bounds the node's answers: a peer that answers without end
// is cut off there instead of filling the node's memory until the call's
// deadline.
const maxPeerAnswer = 16 << 20

// peerBodyBudget is how many bytes of peers' request bodies a node reads
// into memory at once, all requests together: the largest body one
// endpoint takes (a deployment's or a snapshot's metadata, 64 MiB). A
// JSON body costs a few times its length while it decodes, so without
// the bound a handful of large requests at once took hundreds of MB.
const peerBodyBudget = 64 << 20

// peerBodies bounds the memory the node spends on reading its peers'
// request bodies: each body reserves its declared length (the endpoint's
// limit when the sender declares none) while it is read and decoded, and
// one that does not fit in what is left of the budget is refused at once
// (ErrBodiesBusy) rather than waited for, so that a sender that trickles a
// large body holds no other request up. Safe for concurrent use.
type peerBodies struct {
	mu   sync.Mutex // guards left
	left int64      // bytes of the budget not reserved
}

func newPeerBodies(budget int64) *peerBodies { return &peerBodies{left: budget} }

// decode reads r's body (a nil b has no budget), at most limit bytes, as JSON into v. It returns
// the HTTP status to answer with its error: 413 for a declared length
// over limit, 503 when the budget is taken, 400 for a body that does not
// decode.
func (b *peerBodies) decode(r *http.Request, limit int64, v any) (int, error) {
	n := r.ContentLength
	if n > limit {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("%w: %d bytes, at most %d", ErrBodyTooLarge, n, limit)
	}
	if n < 0 {
		n = limit
	}
	if b == nil {
		return decodeBody(r, n, v)
	}
	b.mu.Lock()
	if n > b.left {
		b.mu.Unlock()
		return http.StatusServiceUnavailable, fmt.Errorf("%w: a body of %d bytes", ErrBodiesBusy, n)
	}
	b.left -= n
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.left += n
		b.mu.Unlock()
	}()
	return decodeBody(r, n, v)
}

func decodeBody(r *http.Request, n int64, v any) (int, error) {
	if err := json.NewDecoder(io.LimitReader(r.Body, n)).Decode(v); err != nil {
		return http.StatusBadRequest, err
	}
	return http.StatusOK, nil
}

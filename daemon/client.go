package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/edgedio/edged/cluster"
)

// Client talks to the REST API of a running node. Safe for concurrent
// use.
type Client struct {
	// Addr is the node's API address, host:port or a http:// URL; default
	// DefaultListen.
	Addr string
	// HTTP is the client to use; default http.DefaultClient.
	HTTP *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>": the
	// node requires it when it listens on a non-loopback address.
	Token string
}

// ErrNotAPI is the error of a request whose address answered, but not in
// HTTP: it is not an edged node's API (a node's cluster.listen, say).
var ErrNotAPI = errors.New("daemon: not an edged API")

// notHTTP reports whether err is the HTTP client's error for a peer that
// answered bytes that are not an HTTP response: a malformed response, or
// bytes sent before the request (a gRPC or HTTP/2 server's preface).
func notHTTP(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "malformed HTTP") || strings.Contains(msg, "readLoopPeekFailLocked")
}

// APIError is an error answer of the API.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Msg is the body's "error".
	Msg string
}

// Error returns the API's message and status.
func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.StatusCode)
}

// Jobs lists the node's jobs.
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, error) {
	l, err := c.JobList(ctx)
	return l.Jobs, err
}

// JobList returns GET /jobs?cluster=1: the jobs, and in a cluster which
// node answered, which is the leader and whose jobs they are (on a
// worker, the leader's).
func (c *Client) JobList(ctx context.Context) (JobList, error) {
	var l JobList
	err := c.do(ctx, http.MethodGet, "/jobs?"+clusterParam+"=1", nil, &l)
	return l, err
}

// Checkpoints returns the checkpoint history of a job, oldest first.
func (c *Client) Checkpoints(ctx context.Context, job string) ([]CheckpointInfo, error) {
	var l CheckpointList
	err := c.do(ctx, http.MethodGet, "/jobs/"+url.PathEscape(job)+"/checkpoints", nil, &l)
	return l.Checkpoints, err
}

// Savepoint takes a savepoint of a job (path "" for the job's checkpoint
// directory) and returns its path.
func (c *Client) Savepoint(ctx context.Context, job, path string) (string, error) {
	return c.savepoint(ctx, job, "savepoint", path)
}

// Stop stops a job with a savepoint and returns its path.
func (c *Client) Stop(ctx context.Context, job, path string) (string, error) {
	return c.savepoint(ctx, job, "stop", path)
}

func (c *Client) savepoint(ctx context.Context, job, op, path string) (string, error) {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	var r SavepointResult
	err := c.do(ctx, http.MethodPost, "/jobs/"+url.PathEscape(job)+"/"+op, q, &r)
	return r.Path, err
}

// Cancel cancels a job and returns how it ended.
func (c *Client) Cancel(ctx context.Context, job string) (Status, error) {
	var r CancelResult
	err := c.do(ctx, http.MethodPost, "/jobs/"+url.PathEscape(job)+"/cancel", nil, &r)
	return r.Status, err
}

// Cluster returns the node's view of its cluster; Enabled is false on a
// node without one.
func (c *Client) Cluster(ctx context.Context) (cluster.Status, error) {
	var s cluster.Status
	err := c.do(ctx, http.MethodGet, "/cluster", nil, &s)
	return s, err
}

// Drain moves all the work of node to the other members of the node's
// cluster and lets it leave; it returns once that is done, with the
// rebalance it ran when the cluster recorded one.
func (c *Client) Drain(ctx context.Context, node string) (ClusterActionResult, error) {
	var r ClusterActionResult
	err := c.do(ctx, http.MethodPost, "/cluster/drain/"+url.PathEscape(node), nil, &r)
	return r, err
}

// Undrain ends the drain of node: it rejoins the cluster and takes work
// again from the rebalance the undrain queues (a join). It returns once
// that rebalance has ended, with it when the cluster recorded one.
func (c *Client) Undrain(ctx context.Context, node string) (ClusterActionResult, error) {
	var r ClusterActionResult
	err := c.do(ctx, http.MethodPost, "/cluster/undrain/"+url.PathEscape(node), nil, &r)
	return r, err
}

// Rebalance asks the node's cluster for a rebalance and returns once it
// has ended, with the rebalance when the cluster recorded one.
func (c *Client) Rebalance(ctx context.Context) (ClusterActionResult, error) {
	var r ClusterActionResult
	err := c.do(ctx, http.MethodPost, "/cluster/rebalance", nil, &r)
	return r, err
}

func (c *Client) base() string {
	a := c.Addr
	if a == "" {
		a = DefaultListen
	}
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	return strings.TrimSuffix(a, "/")
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, out any) error {
	u := c.base() + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return fmt.Errorf("daemon: %s %s: %w", method, path, err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if notHTTP(err) {
			return fmt.Errorf("daemon: %s %s: %w: %s answers, but not in HTTP: it is not an edged node's API; give its node.listen, not its cluster.listen, gossip or MQTT address (%v)",
				method, path, ErrNotAPI, c.base(), err)
		}
		return fmt.Errorf("daemon: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("daemon: %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorBody
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		return &APIError{StatusCode: resp.StatusCode, Msg: e.Error}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("daemon: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

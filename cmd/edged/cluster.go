package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http/httptrace"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/edgedio/edged/cluster"
	"github.com/edgedio/edged/daemon"
)

// clusterCommands are the usage lines of edged cluster, in both usages.
const clusterCommands = `  edged cluster status [-json] [--addr host:port | -c <config>] [--timeout d]
  edged cluster drain <node> [--addr host:port | -c <config>] [--timeout d]
  edged cluster undrain <node> [--addr host:port | -c <config>] [--timeout d]
  edged cluster rebalance [--addr host:port | -c <config>] [--timeout d]
`

// clusterTimeoutUsage explains what the cluster commands' --timeout
// leaves behind, in both usages.
const clusterTimeoutUsage = `a drain, undrain or rebalance still waiting when --timeout ends stays
queued or in progress on the node, which runs it: edged cluster status
shows its outcome
`

const clusterUsage = "usage:\n" + clusterCommands + "\n--timeout d (default 2m) is how long to wait for the node's answer;\n" + clusterTimeoutUsage

// runCluster runs edged cluster <status|drain|undrain|rebalance> against
// the node's REST API.
func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "edged cluster: a subcommand is required\n%s", clusterUsage)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "status", "drain", "undrain", "rebalance":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, clusterUsage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "edged cluster: unknown subcommand %q\n%s", sub, clusterUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("edged cluster "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &daemon.Client{}
	var cfgPath string
	var timeout time.Duration
	var asJSON bool
	fs.StringVar(&c.Addr, "addr", "", "address of the node's REST API (default: -c's node.listen, else $"+addrEnv+", else "+daemon.DefaultListen+")")
	fs.StringVar(&cfgPath, "c", "", "config file of the node, for its node.listen")
	fs.StringVar(&cfgPath, "config", "", "config file (same as -c)")
	fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the node (a drain, undrain or rebalance waits for the move; the node bounds it by its --stop-timeout)")
	fs.StringVar(&c.Token, "token", os.Getenv("EDGED_TOKEN"), "the node's API token (default $EDGED_TOKEN); needed when it listens on a non-loopback address")
	if sub == "status" {
		fs.BoolVar(&asJSON, "json", false, "print the node's GET /cluster answer as JSON")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if timeout <= 0 {
		fmt.Fprintf(stderr, "edged cluster %s: --timeout (%v) must be positive\n%s", sub, timeout, clusterUsage)
		return exitUsage
	}
	want := 0
	if sub == "drain" || sub == "undrain" {
		want = 1
	}
	switch {
	case len(pos) > 0 && want == 0:
		fmt.Fprintf(stderr, "edged cluster %s: takes no arguments\n%s", sub, clusterUsage)
		return exitUsage
	case want == 1 && (len(pos) == 0 || strings.TrimSpace(pos[0]) == ""):
		// An empty id would ask the node for POST /cluster/drain/.
		fmt.Fprintf(stderr, "edged cluster %s: a node id is required\n%s", sub, clusterUsage)
		return exitUsage
	case len(pos) > want:
		var q []string
		for _, p := range pos {
			q = append(q, fmt.Sprintf("%q", p))
		}
		fmt.Fprintf(stderr, "edged cluster %s: takes one node id, got %d: %s\n%s", sub, len(pos), strings.Join(q, " "), clusterUsage)
		return exitUsage
	}
	if c.Addr == "" {
		addr, err := clientAddr(cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "edged cluster %s: %v\n", sub, err)
			return exitUsage
		}
		c.Addr = addr
	}
	if err := checkDialAddr(c.Addr); err != nil {
		fmt.Fprintf(stderr, "edged cluster %s: %v\n", sub, err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// sent records that the request reached the node: a drain, undrain
	// or rebalance the caller stops waiting for then stays queued or in
	// progress there.
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			sent.Store(true)
		}
	}})
	switch sub {
	case "status":
		err = clusterStatus(ctx, c, asJSON, stdout)
	case "drain":
		var r daemon.ClusterActionResult
		if r, err = c.Drain(ctx, pos[0]); err == nil {
			fmt.Fprintf(stdout, "drained %s%s\n", pos[0], rebalanceSummary(r.Rebalance))
		}
	case "undrain":
		var r daemon.ClusterActionResult
		if r, err = c.Undrain(ctx, pos[0]); err == nil {
			fmt.Fprintf(stdout, "undrained %s%s\n", pos[0], rebalanceSummary(r.Rebalance))
		}
	case "rebalance":
		var r daemon.ClusterActionResult
		if r, err = c.Rebalance(ctx); err == nil {
			fmt.Fprintf(stdout, "rebalanced%s\n", rebalanceSummary(r.Rebalance))
		}
	}
	if err != nil {
		var ae *daemon.APIError
		switch {
		case sub != "status" && ctx.Err() != nil:
			err = gaveUp(ctx.Err(), sub, pos, timeout, sent.Load(), err)
		case sub != "status" && sent.Load() && !errors.As(err, &ae) && !errors.Is(err, daemon.ErrNotAPI):
			err = connectionLost(sub, pos, err)
		}
		fmt.Fprintf(stderr, "edged cluster %s: %v\n", sub, err)
		return exitFailure
	}
	return exitOK
}

// gaveUp explains a drain, undrain or rebalance the command stopped
// waiting for (why: its --timeout ended, or it was interrupted) with
// err: once the node has the request (sent), it stays queued or in
// progress there, and runs.
func gaveUp(why error, sub string, pos []string, timeout time.Duration, sent bool, err error) error {
	what := "the rebalance"
	if len(pos) > 0 {
		what = fmt.Sprintf("the %s of %s", sub, pos[0])
	}
	waited := fmt.Sprintf("no answer within --timeout %v", timeout)
	if !errors.Is(why, context.DeadlineExceeded) {
		waited = "interrupted before the node answered"
	}
	if !sent {
		return fmt.Errorf("%s; %s was not asked: the request did not reach the node (%w)", waited, what, err)
	}
	return fmt.Errorf("%s; %s was asked and is still queued or in progress on the node, which runs it "+
		"(a rebalance waits for a checkpoint or failover in progress and the damping interval): "+
		"edged cluster status shows its outcome under REBALANCES and the node's state under MEMBERS; "+
		"wait longer with --timeout (%w)", waited, what, err)
}

// connectionLost explains a drain, undrain or rebalance whose node took
// the request and then ended the connection without an answer (err): it
// stopped or crashed, most likely, and the action went with it; if it is
// still up, the action stays queued or in progress there.
func connectionLost(sub string, pos []string, err error) error {
	what := "the rebalance"
	if len(pos) > 0 {
		what = fmt.Sprintf("the %s of %s", sub, pos[0])
	}
	return fmt.Errorf("the node took the request and ended the connection without an answer: it stopped or crashed, most likely, "+
		"and %s went with it (ask again once a leader answers); if it is still up, %s is queued or in progress there: "+
		"edged cluster status shows its outcome under REBALANCES (%w)", what, what, err)
}

// rebalanceSummary describes what a drain or rebalance moved, when the
// node reported it.
func rebalanceSummary(r *cluster.Rebalance) string {
	if r == nil {
		return ""
	}
	s := fmt.Sprintf(": %s, %d key groups moved, %s shipped", r.Outcome, r.MovedKeyGroups, bytesString(r.BytesShipped))
	if sub, ms := r.MaxPauseMS(); sub != "" {
		s += fmt.Sprintf(", longest pause %s (%s)", msDuration(ms), sub)
	}
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

// clusterStatus prints the node's view of its cluster: as JSON, or as
// tables.
func clusterStatus(ctx context.Context, c *daemon.Client, asJSON bool, w io.Writer) error {
	s, err := c.Cluster(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	if !s.Enabled {
		_, err := fmt.Fprintln(w, "this node runs no cluster")
		return err
	}
	return printClusterStatus(w, s.Normalized())
}

// printClusterStatus writes the tables of edged cluster status.
func printClusterStatus(w io.Writer, s cluster.Status) error {
	by := s.MembersByState()
	leader := s.Leader
	if leader == "" {
		leader = "none"
	}
	fmt.Fprintf(w, "node %s, leader %s, epoch %d, %d of %d members alive", s.Node, leader, s.Epoch, by[cluster.StateAlive], len(s.Members))
	if me, ok := s.Member(s.Node); ok && me.State == cluster.StateLeft {
		fmt.Fprint(w, " (this node was drained and left the cluster: it runs nothing until it is undrained or restarts; the other members as it last saw them)")
	} else if ok && !me.SeesMajority {
		fmt.Fprint(w, " (this node sees no majority: it owns nothing)")
	}
	fmt.Fprintln(w)

	owned := s.KeyGroupsOwned()
	subtasks := map[string]int{}
	for _, p := range s.Placement {
		subtasks[p.Node] = len(p.Subtasks)
	}
	// The placement is the job masters': a worker holds none of it, and
	// its zeros would read as a cluster that runs nothing.
	elsewhere := len(s.Placement) == 0 && s.Leader != "" && s.Leader != s.Node
	count := func(n int) string {
		if elsewhere {
			return "-"
		}
		return fmt.Sprint(n)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nMEMBERS")
	fmt.Fprintln(tw, "ID\tSTATE\tLEADER\tMAJORITY\tCAPACITY\tWEIGHT\tSUBTASKS\tKEY GROUPS\tTRANSPORT\tAPI")
	for _, m := range s.Members {
		state := string(m.State)
		if m.Drained {
			state += " (drained)"
		}
		if m.OtherPipelines {
			state += " (other pipelines)"
		}
		majority := "-" // known for this node only
		if m.ID == s.Node {
			majority = yesNo(m.SeesMajority)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", m.ID, state, mark(m.Leader), majority,
			capacityString(m.Capacity), max(m.Weight, 1), count(subtasks[m.ID]), count(owned[m.ID]), m.Address, m.API)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nPLACEMENT (epoch %d)\n", s.Epoch)
	if elsewhere {
		api := "its API"
		if l, ok := s.Member(s.Leader); ok && l.API != "" {
			api = l.API
		}
		fmt.Fprintf(w, "(kept by the leader, node %s, which runs the job masters: edged cluster status --addr %s)\n", s.Leader, api)
	}
	rows := 0
	fmt.Fprintln(tw, "NODE\tOPERATOR\tUID\tSUBTASK\tKEY GROUPS")
	for _, p := range s.Placement {
		for _, st := range p.Subtasks {
			op := st.Operator
			if st.Job != "" {
				op = st.Job + "/" + op
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d-%d (%d)\n", p.Node, op, st.UID, st.Subtask, st.KeyGroups[0], st.KeyGroups[1], st.KeyGroups.Len())
			rows++
		}
	}
	if elsewhere {
		tw.Init(w, 0, 4, 2, ' ', 0) // no table: drop its header
	} else if err := flushOrNone(w, tw, rows); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nREPLICAS (newest checkpoint first)")
	rows = 0
	fmt.Fprintln(tw, "CHECKPOINT\tFILE\tSIZE\tNODES")
	for _, c := range s.Replicas {
		id := fmt.Sprint(c.Checkpoint)
		if c.Job != "" {
			id = c.Job + "/" + id
		}
		for _, f := range c.Files {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", id, f.File, bytesString(f.Size), strings.Join(f.Nodes, ","))
			rows++
		}
	}
	if err := flushOrNone(w, tw, rows); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nFAILOVERS (newest first; %d since the node started)\n", s.FailoversTotal)
	for _, f := range s.FailoversInProgress {
		fmt.Fprintf(w, "in progress: %s seen dead at %s (detection %s); the jobs do not run again on a new placement yet\n",
			f.DeadNode, f.At.Local().Format(time.DateTime), msDuration(f.DetectionMS))
	}
	fmt.Fprintln(tw, "AT\tDEAD NODE\tEPOCH\tDETECTION\tPLACEMENT\tRESTORE\tFIRST RECORD\tTOTAL")
	for _, f := range s.Failovers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", f.At.Local().Format(time.DateTime), f.DeadNode, f.Epoch,
			msDuration(f.DetectionMS), msDuration(f.PlacementMS), msDuration(f.RestoreMS), msDuration(f.FirstRecordMS), msDuration(f.TotalMS()))
	}
	if len(s.Failovers) == 0 && len(s.FailoversInProgress) > 0 {
		tw.Init(w, 0, 4, 2, ' ', 0) // none done yet: drop the header
	} else if err := flushOrNone(w, tw, len(s.Failovers)); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nREBALANCES (newest first; %d since the node started)\n", s.RebalancesTotal)
	fmt.Fprintln(tw, "AT\tTRIGGER\tOUTCOME\tMODE\tMOVED KEY GROUPS\tSHIPPED\tPAUSE PER SUBTASK\tERROR")
	for _, r := range s.Rebalances {
		mode := string(r.Mode)
		if mode == "" {
			mode = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.At.Local().Format(time.DateTime), r.Trigger, r.Outcome, mode, r.MovedKeyGroups,
			bytesString(r.BytesShipped), pauses(r.PauseMS), oneLine(r.Error))
	}
	if err := flushOrNone(w, tw, len(s.Rebalances)); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nHAND-BACKS OF THE LEADERSHIP (newest first; %d since the node started)\n", s.HandbacksTotal)
	fmt.Fprintln(tw, "AT\tFROM\tTO\tEPOCH\tOUTCOME\tSAVEPOINT\tREPLICATE\tTAKEOVER\tRESTORE\tERROR")
	for _, h := range s.Handbacks {
		// A step the other node of the hand-back timed is "-", not 0s.
		steps := make([]string, len(cluster.HandbackSteps))
		for i, step := range cluster.HandbackSteps {
			steps[i] = "-"
			if h.TimedBy(s.Node, step) {
				steps[i] = msDuration(h.StepMS(step))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", h.At.Local().Format(time.DateTime), h.From, h.To, h.Epoch, h.Outcome,
			strings.Join(steps, "\t"), oneLine(h.Error))
	}
	return flushOrNone(w, tw, len(s.Handbacks))
}

// flushOrNone flushes tw, or drops its header and prints "(none)" when no
// row was written.
func flushOrNone(w io.Writer, tw *tabwriter.Writer, rows int) error {
	if rows == 0 {
		// The header alone would read as an empty table; say so instead.
		tw.Init(w, 0, 4, 2, ' ', 0)
		_, err := fmt.Fprintln(w, "(none)")
		return err
	}
	return tw.Flush()
}

// pauses lists the pause of each moved subtask, longest first.
func pauses(p map[string]float64) string {
	if len(p) == 0 {
		return "-"
	}
	subs := make([]string, 0, len(p))
	for s := range p {
		subs = append(subs, s)
	}
	slices.SortFunc(subs, func(a, b string) int {
		if p[a] != p[b] {
			if p[a] > p[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s + " " + msDuration(p[s])
	}
	return strings.Join(out, ", ")
}

// capacityString writes a member's capacity: "-" for no limit.
func capacityString(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func mark(b bool) string {
	if b {
		return "*"
	}
	return ""
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// bytesString writes n in binary units.
func bytesString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGT"[exp])
}

// Command edged runs an edged node and talks to a running one.
//
//	edged run -c <config> [--from-savepoint <path>] [--allow-non-restored] [--listen addr]
//	edged list                 [--addr host:port | -c <config>]
//	edged checkpoints <job>    [--addr host:port | -c <config>]
//	edged savepoint <job>      [--path p] [--addr host:port | -c <config>]
//	edged stop <job>           [--path p] [--addr host:port | -c <config>]   (stop with a savepoint)
//	edged cancel <job>         [--addr host:port | -c <config>]
//	edged cluster status       [-json] [--addr host:port | -c <config>]
//	edged cluster drain <node> [--addr host:port | -c <config>]
//	edged cluster rebalance    [--addr host:port | -c <config>]
//
// The client commands find the node's REST API at, in this order: --addr;
// node.listen of the config given with -c (a wildcard host such as
// 0.0.0.0 or an empty one is dialled on the loopback address); the
// EDGED_ADDR environment variable; 127.0.0.1:8081. A node started with
// run --listen overrides its config's node.listen, so its clients need
// --addr too.
//
// The client commands send --token (default $EDGED_TOKEN) as the API's
// bearer token, which a node listening on a non-loopback address requires.
//
// SIGTERM or SIGINT stops edged run gracefully: every job with
// checkpointing stops with a savepoint (on a cluster's job-master node as
// well); a cluster's worker node first asks the job masters to drain it,
// which they do when the other nodes keep a majority and have the
// capacity (its subtasks move away from a savepoint and it leaves the
// membership), and stops without a drain otherwise. It exits 0 either
// way; its --stop-timeout bounds the drain as it does a stop.
//
// Exit status: 0 on success, 1 on a runtime failure, 2 on a usage or
// config error (every config problem is printed with its key path).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptrace"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	cmap "github.com/orcaman/concurrent-map"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/pipeline"
)

func main() {
	shrinkActorRegistry()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// shrinkActorRegistry makes the process registry of each protoactor actor
// system (one per job start) hold about 100 KB of heap instead of 2.8 MB.
// The registry spreads actors over 1024 concurrent maps of
// cmap.SHARD_COUNT shards each, 32 by default: 32,768 Go maps and locks,
// 85 % of an idle node's live heap, for the few dozen actors a node
// spawns. One shard per map still leaves 1024 locks, taken when an actor
// is spawned or stopped or a PID first resolved (protoactor caches the
// process in the PID; sends do not look it up). The count is a package
// variable of the map library, read by every map on every access: it is
// set here, before any goroutine or map exists, and nowhere else.
func shrinkActorRegistry() { cmap.SHARD_COUNT = 1 }

const usage = `usage:
  edged run -c <config> [--from-savepoint <path>] [--allow-non-restored] [--listen addr]
  edged list [--addr host:port | -c <config>]
  edged checkpoints <job> [--addr host:port | -c <config>]
  edged savepoint <job> [--path p] [--addr host:port | -c <config>]
  edged stop <job> [--path p] [--addr host:port | -c <config>]
  edged cancel <job> [--addr host:port | -c <config>]
` + clusterCommands + `
The client commands find the node at --addr, else the -c config's
node.listen, else $EDGED_ADDR, else 127.0.0.1:8081.
client commands take --token t (default $EDGED_TOKEN) for a node on a non-loopback address
and --timeout d (default 2m), how long to wait for the node's answer;
` + clusterTimeoutUsage

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// run runs the edged command line args (without the program name) and
// returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "run":
		return runNode(ctx, args, stdout, stderr)
	case "list", "checkpoints", "savepoint", "stop", "cancel":
		return runClient(ctx, cmd, args, stdout, stderr)
	case "cluster":
		return runCluster(ctx, args, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "edged: unknown command %q\n%s", cmd, usage)
	return exitUsage
}

// parse parses flags anywhere among args and returns the positional
// arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edged run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts daemon.Options
	var cfgPath, logLevel string
	fs.StringVar(&cfgPath, "c", "", "config file (required)")
	fs.StringVar(&cfgPath, "config", "", "config file (same as -c)")
	fs.StringVar(&opts.Savepoint, "from-savepoint", "", "start the pipeline this savepoint directory was taken of from it (the others resume from their own snapshots)")
	fs.BoolVar(&opts.AllowNonRestored, "allow-non-restored", false, "skip savepoint state of operators the pipelines no longer have")
	fs.StringVar(&opts.Listen, "listen", daemon.DefaultListen, "REST API address (default: the config's node.listen, else "+daemon.DefaultListen+")")
	fs.DurationVar(&opts.StopTimeout, "stop-timeout", time.Minute, "how long a stop with savepoint may take before the job is cancelled")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	var cpuProfile string
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (for profiling; off by default)")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) > 0 {
		if len(pos) == 1 && cfgPath == "" {
			fmt.Fprintf(stderr, "edged run: unexpected argument %q: the config is given with -c (edged run -c %s)\n", pos[0], pos[0])
			return exitUsage
		}
		fmt.Fprintf(stderr, "edged run: unexpected arguments %q\n", pos)
		return exitUsage
	}
	emptySavepoint := false
	fs.Visit(func(f *flag.Flag) {
		emptySavepoint = emptySavepoint || f.Name == "from-savepoint" && f.Value.String() == ""
	})
	if emptySavepoint {
		// An empty value (an unset shell variable) would start from the
		// latest snapshot instead of the savepoint meant.
		fmt.Fprintln(stderr, "edged run: --from-savepoint: a savepoint directory is required (without the flag, each pipeline resumes from its latest snapshot)")
		return exitUsage
	}
	if cfgPath == "" {
		fmt.Fprintln(stderr, "edged run: -c: a config file is required")
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		fmt.Fprintf(stderr, "edged run: --log-level: %q must be debug, info, warn or error\n", logLevel)
		return exitUsage
	}
	cfg, err := pipeline.Load(cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "edged: %v\n", err)
		return exitUsage
	}
	listenSet := false
	fs.Visit(func(f *flag.Flag) { listenSet = listenSet || f.Name == "listen" })
	if !listenSet && cfg.Node.Listen != "" {
		opts.Listen = cfg.Node.Listen
	}
	if listenSet {
		// --listen stands for node.listen: checked as it would be there,
		// before anything starts, not only when the API binds it.
		cfg.Node.Listen = opts.Listen
		if err := cfg.Validate(); err != nil {
			fmt.Fprintf(stderr, "edged run: --listen %q: %v\n", opts.Listen, err)
			return exitUsage
		}
	}
	if cpuProfile != "" {
		stopProfile, err := startCPUProfile(cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "edged run: --cpuprofile: %v\n", err)
			return exitFailure
		}
		defer stopProfile()
	}
	opts.Token = cfg.Node.Token
	opts.Stdout = stdout
	opts.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := daemon.Run(ctx, cfg, opts); err != nil {
		opts.Logger.Error("edged failed", "err", err)
		var ce *pipeline.ConfigError
		if errors.As(err, &ce) {
			return ce.ExitCode()
		}
		return exitFailure
	}
	return exitOK
}

func runClient(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edged "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &daemon.Client{}
	var path, cfgPath string
	var timeout time.Duration
	fs.StringVar(&c.Addr, "addr", "", "address of the node's REST API (default: -c's node.listen, else $"+addrEnv+", else "+daemon.DefaultListen+")")
	fs.StringVar(&cfgPath, "c", "", "config file of the node, for its node.listen")
	fs.StringVar(&cfgPath, "config", "", "config file (same as -c)")
	fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the node")
	fs.StringVar(&c.Token, "token", os.Getenv("EDGED_TOKEN"), "the node's API token (default $EDGED_TOKEN); needed when it listens on a non-loopback address")
	if cmd == "savepoint" || cmd == "stop" {
		fs.StringVar(&path, "path", "", "savepoint directory (default: under the job's checkpoint dir)")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if timeout <= 0 {
		fmt.Fprintf(stderr, "edged %s: --timeout (%v) must be positive\n%s", cmd, timeout, usage)
		return exitUsage
	}
	want := 1
	if cmd == "list" {
		want = 0
	}
	if len(pos) != want {
		switch {
		case want == 0:
			fmt.Fprintf(stderr, "edged %s: takes no arguments\n%s", cmd, usage)
		case len(pos) == 0:
			fmt.Fprintf(stderr, "edged %s: a job name is required\n%s", cmd, usage)
		default:
			// A flag's value left out takes the next flag as its value
			// (--path -c x): what follows is then an argument.
			fmt.Fprintf(stderr, "edged %s: one job name expected, got %q (a flag without its value?)\n%s", cmd, pos, usage)
		}
		return exitUsage
	}
	if c.Addr == "" {
		addr, err := clientAddr(cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "edged %s: %v\n", cmd, err)
			return exitUsage
		}
		c.Addr = addr
	}
	if err := checkDialAddr(c.Addr); err != nil {
		fmt.Fprintf(stderr, "edged %s: %v\n", cmd, err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// sent records that the request reached the node: a stop or
	// savepoint whose connection ends without an answer may have been
	// carried out.
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			sent.Store(true)
		}
	}})
	if err := client(ctx, c, cmd, pos, path, stdout); err != nil {
		var ae *daemon.APIError
		if (cmd == "stop" || cmd == "savepoint") && sent.Load() && ctx.Err() == nil && !errors.As(err, &ae) && !errors.Is(err, daemon.ErrNotAPI) {
			err = answerLost(cmd, pos[0], err)
		}
		fmt.Fprintf(stderr, "edged %s: %v\n", cmd, err)
		return exitFailure
	}
	return exitOK
}

// answerLost explains a stop or savepoint of job whose node took the
// request and ended the connection without an answer (err).
func answerLost(cmd, job string, err error) error {
	what := "the savepoint"
	if cmd == "stop" {
		what = "the stop and its savepoint"
	}
	return fmt.Errorf("the node took the request and ended the connection without an answer: it stopped or crashed, most likely; "+
		"%s of %s may have completed or not: edged checkpoints %s on the node that leads now lists the savepoint if it completed; "+
		"in a cluster the node that takes the job masters over resumes the job from its newest snapshot (%w)", what, job, job, err)
}

// addrEnv is the environment variable with the node's API address.
const addrEnv = "EDGED_ADDR"

// clientAddr returns the API address when --addr is not given: node.listen
// of the config at cfgPath (when given), else $EDGED_ADDR, else the
// default. A config that does not load is an error.
func clientAddr(cfgPath string) (string, error) {
	if cfgPath != "" {
		cfg, err := pipeline.Load(cfgPath)
		if err != nil {
			return "", err
		}
		if cfg.Node.Listen != "" {
			return dialAddr(cfg.Node.Listen), nil
		}
		return daemon.DefaultListen, nil
	}
	if a := os.Getenv(addrEnv); a != "" {
		return a, nil
	}
	return daemon.DefaultListen, nil
}

// checkDialAddr refuses an API address that is neither host:port with a
// numeric port nor a URL: "127.0.0.1" without its port would be asked as
// http://127.0.0.1, on port 80, and "host:api" fails only once dialled.
func checkDialAddr(addr string) error {
	if strings.Contains(addr, "://") {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n uint64
		n, err = strconv.ParseUint(port, 10, 16)
		if err == nil && n == 0 {
			err = errors.New("port 0")
		}
	}
	if err != nil {
		return fmt.Errorf("the node's address %q must be host:port with a port in [1, 65535] (--addr, -c's node.listen or $%s)", addr, addrEnv)
	}
	return nil
}

// dialAddr turns a listen address into one to dial: a wildcard or empty
// host becomes the loopback address of its family.
func dialAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch host {
	case "", "0.0.0.0":
		return net.JoinHostPort("127.0.0.1", port)
	case "::":
		return net.JoinHostPort("::1", port)
	}
	return listen
}

// client runs one client command against c and prints the answer.
func client(ctx context.Context, c *daemon.Client, cmd string, pos []string, path string, stdout io.Writer) error {
	switch cmd {
	case "list":
		l, err := c.JobList(ctx)
		if err != nil {
			return err
		}
		printJobList(stdout, l)
		return nil
	case "checkpoints":
		cps, err := c.Checkpoints(ctx, pos[0])
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tSTATUS\tTRIGGERED\tDURATION\tSIZE\tALIGNMENT\tPATH\tERROR")
		for _, cp := range cps {
			status := cp.Status
			if cp.Gone {
				status += " (files gone)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cp.ID, cp.Kind, status,
				cp.TriggerTime.Format(time.RFC3339), msDuration(cp.DurationMS), cp.SizeBytes,
				msDuration(cp.AlignmentMS), cp.Path, oneLine(cp.Error))
		}
		return tw.Flush()
	case "savepoint", "stop":
		var p string
		var err error
		if cmd == "stop" {
			p, err = c.Stop(ctx, pos[0], path)
		} else {
			p, err = c.Savepoint(ctx, pos[0], path)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, p)
		return nil
	case "cancel":
		s, err := c.Cancel(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s\n", pos[0], s)
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func msDuration(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Microsecond).String()
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// startCPUProfile starts a CPU profile written to path and returns the
// function that stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// printJobList writes the table of edged list; in a cluster, first a line
// that names the leader (the node of the job masters) and whose jobs
// these are, and on a worker a TASKS HERE column.
func printJobList(w io.Writer, l daemon.JobList) {
	switch {
	case l.Leader == "":
	case l.Node == l.Leader:
		fmt.Fprintf(w, "node %s, the leader: it runs the job masters\n", l.Node)
	case l.From == l.Leader:
		fmt.Fprintf(w, "node %s, a worker; the jobs of the leader, node %s, which runs the job masters\n", l.Node, l.Leader)
	default:
		fmt.Fprintf(w, "node %s, a worker; the leader, node %s, did not answer\n", l.Node, l.Leader)
	}
	if l.Note != "" {
		fmt.Fprintln(w, oneLine(l.Note))
	}
	worker := l.Leader != "" && l.Node != l.Leader
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if worker {
		fmt.Fprintln(tw, "NAME\tSTATUS\tATTEMPTS\tCHECKPOINTING\tDEAD LETTERS\tTASKS HERE\tERROR")
	} else {
		fmt.Fprintln(tw, "NAME\tSTATUS\tATTEMPTS\tCHECKPOINTING\tDEAD LETTERS\tERROR")
	}
	for _, j := range l.Jobs {
		why := j.Error
		if why == "" && j.Status == daemon.StatusRestarting {
			why = "last failure: " + j.LastFailure
		}
		if worker {
			here := 0
			if j.TasksHere != nil {
				here = *j.TasksHere
			}
			if l.From != l.Leader {
				// Known to the leader only.
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t%d\t%s\n", j.Name, j.Status, here, oneLine(why))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%t\t%d\t%d\t%s\n", j.Name, j.Status, j.Attempts, j.Checkpointing, j.DeadLetters, here, oneLine(why))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%t\t%d\t%s\n", j.Name, j.Status, j.Attempts, j.Checkpointing, j.DeadLetters, oneLine(why))
	}
	tw.Flush()
}

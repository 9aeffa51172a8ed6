// Command rolling-average keeps a per-sensor rolling average of
// temperature readings read from a socket, the classic first Flink job:
//
//	sensor_1,1547718199,35.8
//
// With -addr it reads the lines a TCP server sends (for example
// `nc -lk 7777` and -addr 127.0.0.1:7777). Without it, it starts a local
// feeder on 127.0.0.1 that sends -n simulated readings and closes, so the
// job runs with nothing installed and ends by itself.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/stream"
)

// average is the rolling average of one sensor.
type average struct {
	ID    string
	Count int64
	Sum   float64
}

func (a average) String() string {
	return a.ID + " count=" + strconv.FormatInt(a.Count, 10) + " avg=" + strconv.FormatFloat(a.Sum/float64(a.Count), 'f', 2, 64)
}

type averager struct{}

func (averager) CreateAccumulator() average { return average{} }

func (averager) Add(r operators.SensorReading, a average) average {
	return average{ID: r.ID, Count: a.Count + 1, Sum: a.Sum + r.Temperature}
}

func (averager) Result(a average) average { return a }

func main() {
	addr := flag.String("addr", "", "host:port of a TCP server sending SensorReading lines; empty starts a local feeder")
	n := flag.Int("n", 20, "readings the local feeder sends")
	parallelism := flag.Int("p", 2, "parallelism of the keyed average")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, log, os.Stdout, *addr, *n, *parallelism); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("job failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, out io.Writer, addr string, n, parallelism int) error {
	if addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		go feed(ln, n)
		addr = ln.Addr().String()
		log.Info("feeding simulated readings", "addr", addr, "readings", n)
	}

	env := stream.NewEnvironment("rolling-average", stream.WithLogger(log))
	readings := stream.FromSource(env, "socket", func() operators.Source[operators.SensorReading] {
		return operators.NewSocketSource(addr, operators.ParseSensorReading).
			WithDeadLetter(func(line string, err error) {
				log.Warn("malformed reading skipped", "line", line, "err", err)
			})
	})
	keyed := stream.KeyBy(readings, func(r operators.SensorReading) string { return r.ID })
	avg := stream.Aggregate(keyed, "average", averager{}).UID("average").SetParallelism(parallelism)
	avg.To("print", func() operators.Sink[average] {
		return operators.NewPrintSink(out, average.String)
	}).SetParallelism(parallelism)
	return env.Execute(ctx)
}

// feed serves one connection with n readings of 5 sensors, then closes.
func feed(ln net.Listener, n int) {
	conn, err := ln.Accept()
	if err != nil {
		return
	}
	defer conn.Close()
	w := bufio.NewWriter(conn)
	for i := range n {
		r := operators.SensorReading{
			ID:          fmt.Sprintf("sensor_%d", i%5+1),
			Timestamp:   operators.DefaultGeneratorStart + int64(i),
			Temperature: 30 + float64(i%7),
		}
		fmt.Fprintln(w, r.String())
	}
	w.Flush()
}

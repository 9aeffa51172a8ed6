package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgedio/edged/daemon"
	"github.com/edgedio/edged/internal/testutil"
	"github.com/edgedio/edged/mqtt"
)

// An external broker's outage shows in the metrics and in GET /ingest:
// edged_mqtt_source_connected drops to 0 while the broker is away and
// is 1 again once it accepts the subscriber's next connection, which
// edged_mqtt_source_connects_total counts; the logs say how long the
// subscriber was without a connection.
func TestSourceBrokerOutageInMetrics(t *testing.T) {
	startBroker := func(addr string) *mqtt.Broker {
		br, err := mqtt.NewBroker(mqtt.BrokerConfig{Address: addr, Filters: []string{"#"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := br.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return br
	}
	br := startBroker("127.0.0.1:0")
	addr := br.Addr()
	dir := t.TempDir()
	n := startNode(t, fmt.Sprintf(`
node:
  data_dir: %s
pipelines:
  - name: p
    source:
      mqtt:
        broker: tcp://%s
        topics: [sensors/+/temperature]
        format: json
        fields:
          id: {type: string, path: $.sensor}
          temp: {type: float, path: $.t}
    key: id
    sinks: [{stdout: {}}]
`, filepath.Join(dir, "data"), addr), daemon.Options{})
	connected := func(want string, connects string) func() bool {
		return func() bool {
			var il daemon.IngestList
			getJSON(t, n, "/ingest", &il)
			up := len(il.Pipelines) == 1 && il.Pipelines[0].SourceConnected != nil &&
				*il.Pipelines[0].SourceConnected == (want == "1") && il.Pipelines[0].SourceBroker == "tcp://"+addr
			return up && metric(t, n.addr, `edged_mqtt_source_connected{pipeline="p"}`) == want &&
				metric(t, n.addr, `edged_mqtt_source_connects_total{pipeline="p"}`) == connects
		}
	}
	testutil.Eventually(t, waitLimit, "the source connected, in the metrics and /ingest", connected("1", "1"))

	br.Close()
	testutil.Eventually(t, waitLimit, "the source not connected while its broker is away", connected("0", "1"))

	br = startBroker(addr)
	t.Cleanup(func() { br.Close() })
	testutil.Eventually(t, waitLimit, "the source connected again once its broker is back", connected("1", "2"))
	testutil.Eventually(t, waitLimit, "the reconnection logged with the outage's length", func() bool {
		return strings.Contains(n.logs.String(), "down_for=")
	})
}

package operators_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/edgedio/edged/operators"
	"github.com/edgedio/edged/operators/operatorstest"
)

// A window without a late-data side output that drops late records says
// how many when it closes, with a warning on the operator's logger: the
// count is not otherwise visible to a job. A window with the side output
// drops nothing and warns of nothing.
func TestWindowWarnsOfDroppedLateRecordsAtClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		tag  string
		want string
	}{
		{"without side output", "", "dropped=2"},
		{"with side output", lateTag, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			opts := []operatorstest.Option{operatorstest.Keyed(128)}
			if tc.tag != "" {
				opts = append(opts, operatorstest.SideOutput[ev](tc.tag))
			}
			h := operatorstest.New(func(out operators.Collector[result]) operators.OneInput[ev] {
				op, err := operators.NewWindowAggregate(windowName, evKey, operators.TumblingEventTimeWindows(ms(10)), 0, tc.tag, operators.AggregateFunction[ev, cs, cs](csAgg{}), out)
				if err != nil {
					t.Fatal(err)
				}
				return op
			}, opts...)
			h.Ctx.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			if err := h.Open(); err != nil {
				t.Fatal(err)
			}
			feed(h, ev{"a", 1, 1})
			advance(t, h, 20)
			feed(h, ev{"a", 2, 1}, ev{"b", 5, 1}, ev{"a", 25, 1})
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			got := logs.String()
			if tc.want == "" {
				if got != "" {
					t.Fatalf("logged %q, want nothing", got)
				}
				return
			}
			if !strings.Contains(got, "level=WARN") || !strings.Contains(got, tc.want) {
				t.Fatalf("logged %q, want a warning with %s", got, tc.want)
			}
		})
	}
}

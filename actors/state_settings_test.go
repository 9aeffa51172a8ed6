package actors

import "testing"

// A restore compares a snapshot's state settings with the job's part by
// part: a window's assigner entry when both declare one, the job's
// digest when both declare one.
func TestSettingsDiffer(t *testing.T) {
	tumbling := WindowStateSetting("sliced event-time size=1000ms slide=1000ms offset=0ms")
	sliding := WindowStateSetting("sliced event-time size=1000ms slide=500ms offset=0ms")
	for _, c := range []struct {
		snap, job string
		differ    bool
	}{
		{"", "", false},
		{"aggregates count()", "aggregates count()", false},
		{"aggregates count()", "aggregates max(t)", true},
		{"", "aggregates max(t)", false},  // a snapshot without settings
		{"aggregates count()", "", false}, // a job without a digest
		{tumbling, tumbling, false},       // the runtime's entry alone
		{tumbling, sliding, true},         // another assigner
		{JoinStateSettings(tumbling, "v1"), JoinStateSettings(tumbling, "v2"), true},
		{JoinStateSettings(tumbling, "a; b"), JoinStateSettings(tumbling, "a; b"), false}, // a digest with the separator
		{JoinStateSettings(tumbling, "a; b"), JoinStateSettings(tumbling, "a; c"), true},
		{"aggregates count()", JoinStateSettings(tumbling, "aggregates count()"), false}, // written before windows declared their assigner
		{"aggregates count()", JoinStateSettings(tumbling, "aggregates sum(t)"), true},
		{tumbling, JoinStateSettings(sliding, "v1"), true},
		{JoinStateSettings(OperatorStateSetting("window"), tumbling), OperatorStateSetting("keyed-process"), true}, // another kind of operator
		{JoinStateSettings(OperatorStateSetting("window"), tumbling), JoinStateSettings(OperatorStateSetting("window"), tumbling), false},
		{tumbling, JoinStateSettings(OperatorStateSetting("window"), tumbling), false}, // written before operators declared their kind
		{JoinStateSettings(tumbling, KeyStateSetting("id")+"; aggregates count()"), JoinStateSettings(tumbling, KeyStateSetting("room")+"; aggregates count()"), true}, // another key field
		{JoinStateSettings(tumbling, KeyStateSetting("id")+"; aggregates count()"), JoinStateSettings(tumbling, KeyStateSetting("id")+"; aggregates count()"), false},
		{JoinStateSettings(tumbling, "aggregates count()"), JoinStateSettings(tumbling, KeyStateSetting("room")+"; aggregates count()"), false}, // written before keyed operators declared their key
		{JoinStateSettings(tumbling, "aggregates count()"), JoinStateSettings(tumbling, KeyStateSetting("room")+"; aggregates sum(t)"), true},
	} {
		if got := settingsDiffer(c.snap, c.job); got != c.differ {
			t.Errorf("settingsDiffer(%q, %q) = %v, want %v", c.snap, c.job, got, c.differ)
		}
	}
	if JoinStateSettings("", "d") != "d" || JoinStateSettings("w", "") != "w" || JoinStateSettings("w", "d") != "w; d" {
		t.Error("JoinStateSettings")
	}
}

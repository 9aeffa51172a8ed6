package actors

import "strings"

// A vertex's StateSettings are made of two parts: entries the runtime
// declares for an operator's own settings (its kind, "operator=window";
// a window's assigner, "window=..."; what its keys are, "key=..."), and
// the digest the job declares
// (Stream.StateSettings), joined by "; ", the runtime's first. A restore compares them part by
// part (settingsDiffer), so that a snapshot written before the runtime
// declared an entry still restores.

// settingsSep separates the entries of StateSettings.
const settingsSep = "; "

// The prefixes of the runtime's entries.
const (
	operatorSettingPrefix = "operator="
	windowSettingPrefix   = "window="
	keySettingPrefix      = "key="
)

// OperatorStateSetting returns the StateSettings entry of an operator of
// kind ("window", "keyed-process", ...): state written by one kind is
// not read by another (their state and timers have other meanings).
func OperatorStateSetting(kind string) string { return operatorSettingPrefix + kind }

// WindowStateSetting returns the StateSettings entry of a window operator
// whose assigner's digest is digest.
func WindowStateSetting(digest string) string { return windowSettingPrefix + digest }

// KeyStateSetting returns the StateSettings entry of a keyed operator
// whose keys are what desc describes (a declared pipeline's key field):
// state kept under one field's values is not read under another's.
func KeyStateSetting(desc string) string { return keySettingPrefix + desc }

// JoinStateSettings returns the StateSettings of an operator whose own
// entries are own and whose job declares digest.
func JoinStateSettings(own, digest string) string {
	switch {
	case own == "":
		return digest
	case digest == "":
		return own
	}
	return own + settingsSep + digest
}

// splitSettings returns the runtime's entries of s, by prefix, and the
// job's digest.
func splitSettings(s string) (own map[string]string, digest string) {
	var rest []string
	for _, e := range strings.Split(s, settingsSep) {
		if p, ok := ownPrefix(e); ok {
			if own == nil {
				own = map[string]string{}
			}
			own[p] = e
			continue
		}
		rest = append(rest, e)
	}
	return own, strings.Join(rest, settingsSep)
}

// ownPrefix returns the prefix of e when it is one of the runtime's
// entries.
func ownPrefix(e string) (string, bool) {
	for _, p := range []string{operatorSettingPrefix, windowSettingPrefix, keySettingPrefix} {
		if strings.HasPrefix(e, p) {
			return p, true
		}
	}
	return "", false
}

// settingsDiffer reports whether state written under the settings a
// (a snapshot's) cannot be read under b (the job's): a part both declare
// differs. A part only one of them declares does not count (a snapshot
// of an older version, or a job without a digest).
func settingsDiffer(a, b string) bool {
	ownA, digestA := splitSettings(a)
	ownB, digestB := splitSettings(b)
	for k, v := range ownA {
		if w, ok := ownB[k]; ok && w != v {
			return true
		}
	}
	return digestA != "" && digestB != "" && digestA != digestB
}

package actors

import "strings"

// A vertex's StateSettings are made of two parts: entries the runtime
// declares for an operator's own settings (a window's assigner:
// "window=..."), and the digest the job declares (Stream.StateSettings),
// joined by "; ", the runtime's first. A restore compares them part by
// part (settingsDiffer), so that a snapshot written before the runtime
// declared an entry still restores.

// settingsSep separates the entries of StateSettings.
const settingsSep = "; "

// windowSettingPrefix starts the entry of a window's assigner.
const windowSettingPrefix = "window="

// WindowStateSetting returns the StateSettings entry of a window operator
// whose assigner's digest is digest.
func WindowStateSetting(digest string) string { return windowSettingPrefix + digest }

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
		if strings.HasPrefix(e, windowSettingPrefix) {
			if own == nil {
				own = map[string]string{}
			}
			own[windowSettingPrefix] = e
			continue
		}
		rest = append(rest, e)
	}
	return own, strings.Join(rest, settingsSep)
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

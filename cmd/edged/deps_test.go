package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// notLinked are packages the edged binary must not link: each costs the
// idle process the pages of its code and tables that start-up maps
// (package initialisers, type descriptors), whether or not it is used.
var notLinked = map[string]string{
	// mochi's hooks/auth links it for its ledger; edged has its own
	// allow-all hook and reads YAML with go.yaml.in/yaml/v3.
	"gopkg.in/yaml.v3": "a second YAML library",
}

// TestLinkedPackages lists the packages the edged command links (go list
// -deps) and fails on any of notLinked.
func TestLinkedPackages(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list edged's packages: %v", err)
	}
	out, err := exec.Command(goCmd, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/edgedio/edged/daemon") || !slices.Contains(deps, "github.com/mochi-mqtt/server/v2") {
		t.Fatalf("go list -deps listed %d packages, without the daemon or the broker: not edged's list", len(deps))
	}
	for _, p := range deps {
		if why, ok := notLinked[p]; ok {
			t.Errorf("edged links %s (%s)", p, why)
		}
	}
}

package pipeline

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// aliasBomb is a config of n pipelines, each an alias of the first,
// whose sinks are a list of n aliases of one sink: a file of about 6n
// bytes that decodes n*n sinks. The anchors are set where first used,
// since a key of no use to the config is refused.
func aliasBomb(n int) string {
	aliases := func(alias string) string { return strings.Repeat(", "+alias, n-1) }
	return "pipelines: [&p {name: a, source: {generator: {}}, sinks: [&s {stdout: {}}" + aliases("*s") + "]}" + aliases("*p") + "]\n"
}

// Aliases that repeat aliases are refused once they expand the config
// past MaxAliasExpansion values, naming the key where the bound was
// reached, and nothing more is decoded or validated: a file of a few
// kilobytes cannot make the node decode and validate millions of sinks.
// Aliases that expand less decode as written.
func TestYAMLAliasExpansionBounded(t *testing.T) {
	_, err := Parse([]byte(aliasBomb(400))) // 160,000 sinks
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Parse = %v, want a *ConfigError", err)
	}
	if len(ce.Problems) != 1 || !strings.HasPrefix(ce.Problems[0].Path, "pipelines[") ||
		!strings.Contains(ce.Problems[0].Msg, "YAML aliases expand the config to more than 100000 values") {
		t.Fatalf("problems = %d, first %+v; want the one problem of the aliases' expansion, naming its key", len(ce.Problems), ce.Problems[0])
	}

	ok := `
pipelines:
  - {name: a, source: &src {generator: {count: 10}}, sinks: &sinks [{stdout: {}}, {stdout: {}}]}
  - {name: b, source: *src, sinks: *sinks}
`
	cfg, err := Parse([]byte(ok))
	if err != nil {
		t.Fatalf("Parse of a config with a few aliases: %v", err)
	}
	if len(cfg.Pipelines) != 2 || len(cfg.Pipelines[1].Sinks) != 2 || cfg.Pipelines[1].Source.Generator == nil {
		t.Fatalf("config with aliases decoded as %+v", cfg.Pipelines)
	}
}

// A path given to Load by mistake that is no config file (a large log,
// /dev/zero) is refused after MaxConfigBytes instead of read whole into
// memory.
func TestLoadRefusesAFileOverMaxConfigBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// A sparse file: its size costs no disk.
	if err := f.Truncate(2 * MaxConfigBytes); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = Load(path)
	if !errors.Is(err, ErrConfigTooLarge) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a file of 8 MiB: %v, want ErrConfigTooLarge naming the file", err)
	}
}

// A directory given as the config is named once, as a directory: before,
// the message named it twice ("read /tmp: read /tmp: is a directory").
func TestLoadOfADirectorySaysSo(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(dir)
	if err == nil || strings.Count(err.Error(), dir) != 1 || !strings.Contains(err.Error(), "is a directory, not a config file") {
		t.Fatalf("Load of a directory: %v, want one mention of %s as a directory", err, dir)
	}
}

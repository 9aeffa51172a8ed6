package operatorstest

import (
	"bufio"
	"fmt"
	"os"
	"slices"

	"github.com/edgedio/edged/operators"
)

// CommittedLines returns the lines of every committed part file of a
// file sink's directory dir (operators.CommittedParts), sorted: what the
// sink's transactions committed, in an order that does not depend on
// the subtasks or the part files.
func CommittedLines(dir string) ([]string, error) {
	parts, err := operators.CommittedParts(dir)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, p := range parts {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
	}
	slices.Sort(lines)
	return lines, nil
}

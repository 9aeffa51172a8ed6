package snapshot

import (
	"errors"
	"fmt"
	"strings"
)

// problems collects the findings of a Validate method.
type problems []error

// add records one problem, wrapping ErrInvalidConfig.
func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
}

// err joins the problems, or returns nil if there are none.
func (p problems) err() error { return errors.Join(p...) }

// normalizeName lowers s and turns hyphens into underscores, so that
// "EXACTLY_ONCE", "exactly-once" and "exactly_once" read alike.
func normalizeName(s string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
}

package stream

import "errors"

// errSideOutputOfUnion is reported when SideOutput is asked of a union.
var errSideOutputOfUnion = errors.New("stream: side output of a union; take it from each input")

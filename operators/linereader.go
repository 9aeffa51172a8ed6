package operators

import (
	"bufio"
	"bytes"
)

// longLinePrefix is how much of a line longer than MaxLineSize its dead
// letter keeps.
const longLinePrefix = 4 << 10

// lineReader reads lines of any length with memory bounded by
// MaxLineSize: a longer line is read to its end but only its first
// longLinePrefix bytes are kept. The line sources (LineFileSource,
// SocketSource) read through it.
type lineReader struct {
	*bufio.Reader
	long []byte // a line longer than the Reader's buffer, being assembled
	// eol is the length of the end of line ("\n" 1, "\r\n" 2, none 0)
	// of the line readLine returned last: its n less eol is the line's
	// length.
	eol int
}

// readLine returns the next line with its "\n" (none at the end of the
// input), the bytes of the input it took, and the Reader's error (io.EOF
// when the input has no more lines). A line longer than MaxLineSize
// (without its end of line) is read to its end but not kept: long is set,
// and the slice holds its first longLinePrefix bytes. The slice is valid
// until the next call.
func (r *lineReader) readLine() (line []byte, n int64, long bool, err error) {
	r.long = r.long[:0]
	cr := false // the fragment before ended with "\r"
	for {
		frag, err := r.ReadSlice('\n')
		n += int64(len(frag))
		if err != bufio.ErrBufferFull {
			r.eol = eolLen(frag, cr)
		} else {
			cr = len(frag) > 0 && frag[len(frag)-1] == '\r'
		}
		if long {
			if err != bufio.ErrBufferFull {
				return r.long, n, true, err
			}
			continue
		}
		if err != bufio.ErrBufferFull {
			if len(r.long) == 0 {
				return frag, n, false, err
			}
			r.long = append(r.long, frag...)
			if len(trimEOL(r.long)) > MaxLineSize {
				r.long = r.long[:longLinePrefix]
				return r.long, n, true, err
			}
			return r.long, n, false, err
		}
		r.long = append(r.long, frag...)
		if len(r.long) > MaxLineSize+2 { // longer than MaxLineSize whatever its end of line
			r.long, long = r.long[:longLinePrefix], true
		}
	}
}

// eolLen returns the length of the end of line that ends frag, the last
// fragment of a line; cr tells whether the fragment before it ended with
// "\r" (a "\r\n" split between two reads).
func eolLen(frag []byte, cr bool) int {
	switch {
	case len(frag) == 0 || frag[len(frag)-1] != '\n':
		return 0
	case len(frag) >= 2 && frag[len(frag)-2] == '\r', len(frag) == 1 && cr:
		return 2
	}
	return 1
}

// trimEOL removes a trailing "\n" or "\r\n".
func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

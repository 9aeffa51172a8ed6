package mqtt

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// msgIDSeparator ends the id prefixed to a payload that is not a JSON
// object.
const msgIDSeparator = '|'

// WithMsgID returns payload carrying the deterministic message id, for
// consumers that drop duplicates:
//
//   - a JSON object gets a "msg_id" string field as its last member
//     (`{"v":1}` becomes `{"v":1,"msg_id":"<id>"}`); a payload that already
//     has a msg_id field then has two, and decoders that keep the last
//     one (encoding/json does) see ours;
//   - anything else is prefixed with the id and '|' ("<id>|<payload>").
//
// ParseMsgID undoes either form.
func WithMsgID(payload []byte, id string) []byte {
	trimmed := bytes.TrimSpace(payload)
	if isJSONObject(trimmed) {
		return appendObjectWithID(make([]byte, 0, len(trimmed)+len(id)+12), trimmed, id)
	}
	out := make([]byte, 0, len(id)+1+len(payload))
	out = append(out, id...)
	out = append(out, msgIDSeparator)
	return append(out, payload...)
}

// isJSONObject reports whether trimmed (without surrounding space) is one
// JSON object.
func isJSONObject(trimmed []byte) bool {
	return len(trimmed) >= 2 && trimmed[0] == '{' && trimmed[len(trimmed)-1] == '}' && json.Valid(trimmed)
}

// appendObjectWithID appends the JSON object obj with a "msg_id" member
// id as its last to dst.
func appendObjectWithID(dst, obj []byte, id string) []byte {
	body := bytes.TrimSpace(obj[1 : len(obj)-1])
	dst = append(dst, obj[:len(obj)-1]...)
	if len(body) > 0 {
		dst = append(dst, ',')
	}
	dst = append(dst, `"msg_id":`...)
	dst = strconv.AppendQuote(dst, id)
	return append(dst, '}')
}

// ParseMsgID returns the id WithMsgID put into payload: the "msg_id"
// field of a JSON object, else the prefix before '|'. ok is false when
// there is none.
func ParseMsgID(payload []byte) (id string, ok bool) {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var v struct {
			MsgID *string `json:"msg_id"`
		}
		if json.Unmarshal(trimmed, &v) == nil {
			if v.MsgID == nil {
				return "", false
			}
			return *v.MsgID, true
		}
	}
	i := bytes.IndexByte(payload, msgIDSeparator)
	if i <= 0 {
		return "", false
	}
	return string(payload[:i]), true
}

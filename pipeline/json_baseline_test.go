package pipeline

import "encoding/json"

var jsonUnmarshal = json.Unmarshal

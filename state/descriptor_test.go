package state

import (
	"errors"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
)

// plainCodec is a custom codec, to tell it from the default one.
type plainCodec struct{ codec.IntCodec[int] }

// hidden has no default codec: its fields are unexported.
type hidden struct{ n int }

func TestDescriptorCodecs(t *testing.T) {
	b, _ := newTestBackend()
	var kc KeyContext[string]
	must(NewValue(b, &kc, ValueDescriptor[int]{Name: "default"}))
	must(NewNamespacedList[string, hiddenWindow](b, &kc, ListDescriptor[int]{Name: "custom", Codec: plainCodec{}}))
	must(NewMap(b, &kc, MapDescriptor[string, point]{Name: "map"}))
	must(NewValue(b, &kc, ValueDescriptor[hidden]{Name: "hidden"}))

	sp := b.lookup("default").spec()
	if sp.codecs.err != nil {
		t.Fatalf("default codecs: %v", sp.codecs.err)
	}
	if _, ok := sp.codecs.value.(codec.Codec[int]); !ok {
		t.Fatalf("value codec %T", sp.codecs.value)
	}
	if _, ok := sp.codecs.key.(codec.Codec[string]); !ok {
		t.Fatalf("key codec %T", sp.codecs.key)
	}
	if _, ok := sp.codecs.namespace.(codec.Codec[voidNamespace]); !ok {
		t.Fatalf("namespace codec %T", sp.codecs.namespace)
	}
	sp = b.lookup("custom").spec()
	if _, ok := sp.codecs.value.(plainCodec); !ok {
		t.Fatalf("custom codec replaced by %T", sp.codecs.value)
	}
	if !strings.Contains(sp.sig, "List[int] keyed by string in namespace state.hiddenWindow") {
		t.Fatalf("sig %q", sp.sig)
	}
	// hiddenWindow has unexported fields: no namespace codec, recorded.
	if !errors.Is(sp.codecs.err, codec.ErrUnsupported) {
		t.Fatalf("namespace codec error %v", sp.codecs.err)
	}
	sp = b.lookup("map").spec()
	if _, ok := sp.codecs.userKey.(codec.Codec[string]); !ok {
		t.Fatalf("user key codec %T", sp.codecs.userKey)
	}
	if _, ok := sp.codecs.value.(codec.Codec[point]); !ok || sp.codecs.err != nil {
		t.Fatalf("user value codec %T, %v", sp.codecs.value, sp.codecs.err)
	}
	// The memory backend holds values without a codec and records why.
	sp = b.lookup("hidden").spec()
	if !errors.Is(sp.codecs.err, codec.ErrUnsupported) {
		t.Fatalf("codec error %v, want ErrUnsupported", sp.codecs.err)
	}
	h := must(NewValue(b, &kc, ValueDescriptor[hidden]{Name: "hidden"}))
	kc.Set("a", 10)
	h.Update(hidden{3})
	if v, _ := h.Get(); v.n != 3 {
		t.Fatal("state of a type without codec")
	}
}

func TestUnsetKeyContextPanics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newTestBackend func() (Backend, *clockwork.FakeClock)) {
		b, _ := newTestBackend()
		var kc KeyContext[string]
		v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
		defer func() {
			if r, _ := recover().(string); !strings.Contains(r, "KeyContext not set") {
				t.Fatalf("recovered %q", r)
			}
		}()
		v.Update(1)
	})
}

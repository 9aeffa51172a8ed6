package state

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/edgedio/edged/codec"
	"github.com/edgedio/edged/keygroup"
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

// TestNoCurrentKeyFailsOnTheFirstKeyGroupToo: a handle used before its
// KeyContext was ever set (keyed state used in a function's Open) fails
// with ErrNoCurrentKey on every backend, including one that owns key group
// 0, where the unset context's group would otherwise be taken for a real
// one and the state read and written under the key type's zero value.
func TestNoCurrentKeyFailsOnTheFirstKeyGroupToo(t *testing.T) {
	for _, k := range backendKinds {
		for _, r := range []keygroup.Range{{Start: 0, End: 64}, testGroups} {
			t.Run(fmt.Sprintf("%s/%v", k.name, r), func(t *testing.T) {
				b := k.new(t, r, clockwork.NewFakeClock())
				var kc KeyContext[string]
				v := must(NewValue(b, &kc, ValueDescriptor[int]{Name: "v"}))
				l := must(NewList(b, &kc, ListDescriptor[int]{Name: "l"}))
				m := must(NewMap(b, &kc, MapDescriptor[string, int]{Name: "m"}))
				uses := map[string]func(){
					"Value.Get":    func() { v.Get() },
					"Value.Update": func() { v.Update(1) },
					"Value.Clear":  func() { v.Clear() },
					"List.Add":     func() { l.Add(1) },
					"List.Get":     func() { l.Get() },
					"Map.Put":      func() { m.Put("a", 1) },
					"Map.Contains": func() { m.Contains("a") },
				}
				for name, use := range uses {
					func() {
						defer func() {
							err, _ := recover().(error)
							if !errors.Is(err, ErrNoCurrentKey) {
								t.Errorf("%s without a current key: recovered %v, want ErrNoCurrentKey", name, err)
							} else if !strings.Contains(err.Error(), "Open") {
								t.Errorf("%s: %q does not say where keyed state can be used", name, err)
							}
						}()
						use()
					}()
				}
				// Once a key is set the same handles work.
				kc.Set("a", r.Start)
				v.Update(7)
				if got, ok := v.Get(); !ok || got != 7 {
					t.Fatalf("after Set: Get = %d, %v", got, ok)
				}
			})
		}
	}
}

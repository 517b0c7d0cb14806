package sinks

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestObserved(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	looks := 0
	look := func(context.Context) (int, error) { looks++; return looks, nil }
	fail := func(context.Context) (int, error) { return 0, errors.New("list failed") }
	o := Observed[int]{MaxAge: 30 * time.Second}
	if _, ok := o.Current(); ok {
		t.Fatal("a new Observed holds a look")
	}
	steps := []struct {
		name    string
		advance time.Duration
		forget  bool
		look    func(context.Context) (int, error)
		want    int
		wantErr bool
	}{
		{name: "first look", look: look, want: 1},
		{name: "reused within MaxAge", advance: 29 * time.Second, look: look, want: 1},
		{name: "looked again at MaxAge", advance: time.Second, look: look, want: 2},
		{name: "looked again after Forget", forget: true, look: look, want: 3},
		{name: "a failed look is not kept", forget: true, look: fail, wantErr: true},
		{name: "the next looks again", look: look, want: 4},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		if s.forget {
			o.Forget()
		}
		got, err := o.Get(context.Background(), clock, s.look)
		if (err != nil) != s.wantErr || got != s.want {
			t.Fatalf("%s: Get = %d, %v; want %d (error %v)", s.name, got, err, s.want, s.wantErr)
		}
		if cur, ok := o.Current(); ok != !s.wantErr || cur != s.want {
			t.Fatalf("%s: Current = %d, %v", s.name, cur, ok)
		}
	}
}

package failpoint

import (
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"x", "=kill", "a=explode", "a=kill@0", "a=panic@0", "a=kill@x"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	s, err := Parse("")
	if err != nil || s != nil {
		t.Fatalf("empty spec: %v %v", s, err)
	}
	s.Hit("anything") // nil Set: no-op
	if Hook(s, func(name string) string { return name }) != nil {
		t.Fatal("nil Set gives a nil hook")
	}
}

func TestKillAtNthHit(t *testing.T) {
	t.Parallel()
	s, err := Parse("relay.after-publish=kill@3, api.after-commit=kill")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	s.kill = func() { kills++ }
	s.Hit("relay.after-publish")
	s.Hit("relay.after-publish")
	s.Hit("other")
	if kills != 0 {
		t.Fatalf("killed early")
	}
	s.Hit("relay.after-publish")
	if kills != 1 {
		t.Fatalf("kills = %d after the 3rd hit, want 1", kills)
	}
	s.Hit("api.after-commit")
	if kills != 2 {
		t.Fatalf("kill (no @N) should fire on the first hit")
	}
	if len(s.Armed()) != 2 {
		t.Fatalf("Armed() = %v", s.Armed())
	}
}

func TestPanicAtNthHit(t *testing.T) {
	t.Parallel()
	s, err := Parse("api.after-commit=panic@2")
	if err != nil {
		t.Fatal(err)
	}
	s.kill = func() { t.Fatal("a panic point killed") }
	s.Hit("api.after-commit")
	defer func() {
		if v := recover(); v != "failpoint api.after-commit" {
			t.Fatalf("recovered %v, want the point's panic", v)
		}
		if got := s.Armed(); len(got) != 1 || got[0] != "api.after-commit=panic@2" {
			t.Fatalf("Armed() = %v", got)
		}
	}()
	s.Hit("api.after-commit")
	t.Fatal("the 2nd hit did not panic")
}

func BenchmarkHitUnarmed(b *testing.B) {
	var s *Set
	for b.Loop() {
		s.Hit("relay.after-publish")
	}
}

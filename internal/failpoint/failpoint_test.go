package failpoint

import (
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"x", "=kill", "a=panic", "a=kill@0", "a=kill@x"} {
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

func BenchmarkHitUnarmed(b *testing.B) {
	var s *Set
	for b.Loop() {
		s.Hit("relay.after-publish")
	}
}

package pipeline

import "testing"

func TestSubjectsOverlap(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		{"events.dev1", "events.dev1", true},
		{"events.dev1", "events.dev2", false},
		{"events.*", "events.dev1", true},
		{"events.*", "events.dev1.temp", false},
		{"events.>", "events.dev1.temp", true},
		{"events.>", "events", false}, // > stands for one token or more
		{"events", "events.dev1", false},
		{">", "a.b.c", true},
		{"*.b", "a.*", true}, // a.b matches both
		{"a.*.c", "a.b.d", false},
		{"orders.*.created", "orders.42.created", true},
	}
	for _, c := range cases {
		for _, ab := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
			if got := SubjectsOverlap(ab[0], ab[1]); got != c.want {
				t.Errorf("SubjectsOverlap(%q, %q) = %v, want %v", ab[0], ab[1], got, c.want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { SubjectsOverlap("events.>", "events.dev1.temp") }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}

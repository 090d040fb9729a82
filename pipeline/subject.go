package pipeline

import "strings"

// SubjectsOverlap reports whether some subject matches both NATS subject
// patterns a and b (each may hold * and >; > stands for one token or
// more). A message's subject holds no wildcard, so SubjectsOverlap(p,
// subject) is whether pattern p matches it. It allocates nothing.
func SubjectsOverlap(a, b string) bool {
	for {
		at, arest, amore := strings.Cut(a, ".")
		bt, brest, bmore := strings.Cut(b, ".")
		switch {
		case at == ">" || bt == ">":
			return true
		case at != "*" && bt != "*" && at != bt:
			return false
		case !amore || !bmore:
			return amore == bmore
		}
		a, b = arest, brest
	}
}

package pipeline

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// DeadLetterCodes lists every Code* constant of the package, which is what
// `jetsink dlq replay --code` checks a code against: a code added without
// it would draw a warning that jetsink never writes it.
func TestDeadLetterCodesListsEveryCode(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					consts = append(consts, v)
				}
			}
			return true
		})
	}
	if len(consts) < 10 {
		t.Fatalf("found only %d Code constants: %q", len(consts), consts)
	}
	codes := DeadLetterCodes()
	for _, c := range consts {
		if !slices.Contains(codes, c) {
			t.Errorf("code %q is missing from DeadLetterCodes", c)
		}
	}
	if len(codes) != len(consts) {
		t.Errorf("DeadLetterCodes has %d codes, the package %d Code constants: %q against %q", len(codes), len(consts), codes, consts)
	}
}

package pipeline

import (
	"errors"
	"strings"
	"testing"
)

// TestNumericFitsAgreesWithAppendNumeric holds numericFits, shortcut
// included, to appendNumeric's verdict around numeric's limits: dscale
// 16383, weight 32767, and the exponent's bound of numeric_in.
func TestNumericFitsAgreesWithAppendNumeric(t *testing.T) {
	var nums []string
	for _, mant := range []string{"1", "-1", "0", "0.0", "9.99", "-0.5", "1" + strings.Repeat("0", 62), "0." + strings.Repeat("0", 60) + "1",
		"1" + strings.Repeat("0", 63), "0." + strings.Repeat("0", 70) + "1", strings.Repeat("9", 200), "1." + strings.Repeat("0", 16383)} {
		nums = append(nums, mant)
		for _, exp := range []string{"0", "1", "9999", "+9999", "-9999", "10000", "-10000", "-0009999", "16383", "-16383", "-16384", "-16320",
			"-16321", "99999", "131071", "131072", "131068", "-99999", "+99999", "999999", "1073741823", "1073741824", "-999999999999"} {
			nums = append(nums, mant+"e"+exp, mant+"E"+exp)
		}
	}
	fits := 0
	for _, s := range nums {
		_, err := appendNumeric(nil, s)
		if got := numericFits(s); got != (err == nil) {
			t.Errorf("numericFits(%.40q) = %v, appendNumeric: %v", s, got, err)
		}
		if err == nil {
			fits++
		}
	}
	if fits == 0 || fits == len(nums) {
		t.Fatalf("%d of %d numbers fit: the cases miss a side", fits, len(nums))
	}
}

// TestOutOfRangeNumbersCostNothingUnstored: an accepted event full of
// numbers beyond numeric's range (1e999999) allocates nothing, whether no
// jsonb column reads the payload (nothing checks them) or one reads a
// member without them (they are checked, without building an error).
func TestOutOfRangeNumbersCostNothingUnstored(t *testing.T) {
	payload := []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","j":{"k":1e5},"a":[1e999999` +
		strings.Repeat(",1e999999", 10000) + `]}`)
	for _, cols := range [][]Column{
		{{Name: "id", From: "json:id", Type: TypeUUID}},
		{{Name: "id", From: "json:id", Type: TypeUUID}, {Name: "j", From: "json:j", Type: TypeJSONB}},
	} {
		enc := mustCompile(t, cols...).NewEncoder(0)
		ev := &Event{Data: payload}
		buf := make([]byte, 0, 1<<10)
		if _, err := enc.AppendTuple(buf, ev); err != nil {
			t.Fatalf("%d columns: %v", len(cols), err)
		}
		if n := testing.AllocsPerRun(20, func() { enc.AppendTuple(buf, ev) }); n != 0 {
			t.Errorf("%d columns: %v allocations per event", len(cols), n)
		}
	}
	// A jsonb column that stores them still refuses them.
	for _, c := range []Column{{Name: "a", From: "json:a", Type: TypeJSONB}, {Name: "p", From: "payload", Type: TypeJSONB}} {
		_, err := mustCompile(t, c).NewEncoder(0).AppendTuple(nil, &Event{Data: payload})
		var de *DecodeError
		if !errors.As(err, &de) || de.Code != CodeOutOfRange {
			t.Errorf("%s: err = %v, want %s", c.From, err, CodeOutOfRange)
		}
	}
}

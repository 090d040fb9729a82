package config

import (
	"errors"
	"math/big"
	"strings"

	"github.com/dustin/go-humanize"
)

// sizeUnits are the units a size may end in, in any case, as
// humanize.ParseBytes names them: KB (or K) is 1000 bytes, KiB (or Ki) 1024,
// and so on up to EB and EiB; no unit, or B, is bytes.
var sizeUnits = map[string]uint64{
	"": humanize.Byte, "b": humanize.Byte,
	"k": humanize.KByte, "kb": humanize.KByte, "ki": humanize.KiByte, "kib": humanize.KiByte,
	"m": humanize.MByte, "mb": humanize.MByte, "mi": humanize.MiByte, "mib": humanize.MiByte,
	"g": humanize.GByte, "gb": humanize.GByte, "gi": humanize.GiByte, "gib": humanize.GiByte,
	"t": humanize.TByte, "tb": humanize.TByte, "ti": humanize.TiByte, "tib": humanize.TiByte,
	"p": humanize.PByte, "pb": humanize.PByte, "pi": humanize.PiByte, "pib": humanize.PiByte,
	"e": humanize.EByte, "eb": humanize.EByte, "ei": humanize.EiByte, "eib": humanize.EiByte,
}

// maxSize is the largest size a key takes: 2^53, past which a float64 (a
// JSON reader of `jetsink keys` output, say) no longer holds every integer.
const maxSize = 1 << 53

var (
	errSizeComma     = errors.New("comma")
	errSizeNotWhole  = errors.New("not a whole number of bytes")
	errSizeMalformed = errors.New("not a size")
)

// parseSize reads s, an amount in decimal digits with at most one decimal
// point, then a unit of sizeUnits (after spaces, if any), as a number of
// bytes, exactly: humanize.ParseBytes, which it replaces, multiplied in
// floating point and dropped what was left of a byte (0.5 was 0, 0.29KB
// 289), and took commas out (1,5MiB was 15MiB). It returns errSizeComma for
// a comma anywhere (a decimal point or a thousands separator, which one is
// anyone's guess), errSizeNotWhole for a fraction of a byte written in
// bytes or a size that rounds down to none (a larger unit's fraction of a
// byte is dropped: 1.2GiB is 1288490188), and errSizeMalformed for anything else it cannot read
// or above maxSize. A sign, an exponent (1e3), underscores and hex are
// malformed here; parse reads a plain, signed integer before calling it.
func parseSize(s string) (uint64, error) {
	if strings.ContainsRune(s, ',') {
		return 0, errSizeComma
	}
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(s)
	}
	num := s[:i]
	unit, ok := sizeUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if !ok || strings.Count(num, ".") > 1 || strings.Trim(num, ".") == "" {
		return 0, errSizeMalformed
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, errSizeMalformed
	}
	r.Mul(r, new(big.Rat).SetUint64(unit))
	n := new(big.Int).Quo(r.Num(), r.Denom()) // whole bytes, rounded down
	if !r.IsInt() && (unit == humanize.Byte || n.Sign() == 0) {
		// A fraction of a byte written in bytes (0.5, 1.9), or a size
		// that would round down to nothing (0.0001KiB): a slip, not a
		// size. A fraction of a larger unit (1.2GiB) is rounded down to
		// a whole byte, as humanize did.
		return 0, errSizeNotWhole
	}
	if n.Cmp(big.NewInt(maxSize)) > 0 {
		return 0, errSizeMalformed
	}
	return n.Uint64(), nil
}

package pipeline

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
)

// This file holds the per-type encoders: each appends one value in
// PostgreSQL's binary send format and allocates nothing unless it fails.

// appendNumber encodes s, the text of a JSON number (fromJSON) or of a
// string, as a numeric type.
func appendNumber(dst []byte, t Type, s string, fromJSON bool) ([]byte, *DecodeError) {
	integer := t == TypeInt2 || t == TypeInt4 || t == TypeInt8
	if !fromJSON {
		var ok bool
		if s, ok = pgNumberText(s, t); !ok {
			if integer {
				return dst, invalidFormat(t, "want an integer such as 42")
			}
			return dst, invalidFormat(t, "want a number such as 21.5")
		}
	}
	switch t {
	case TypeInt2, TypeInt4, TypeInt8:
		if !isInteger(s) { // a JSON number: a string passed pgNumberText
			return dst, wrongType(t, "a number with a fraction or exponent")
		}
		v, ok := parseInt64(s)
		if !ok {
			return dst, outOfRange(t, "")
		}
		return appendIntValue(dst, t, v)
	case TypeFloat4, TypeFloat8:
		if t == TypeFloat8 {
			if f, ok := parseFloat64Short(s); ok {
				return binary.BigEndian.AppendUint64(dst, math.Float64bits(f)), nil
			}
		}
		bits := 64
		if t == TypeFloat4 {
			bits = 32
		}
		f, err := strconv.ParseFloat(s, bits)
		if err != nil || math.IsInf(f, 0) || (f == 0 && nonZeroMantissa(s)) {
			// Overflow, or underflow to zero: PostgreSQL's input refuses both.
			return dst, outOfRange(t, "")
		}
		if t == TypeFloat4 {
			return binary.BigEndian.AppendUint32(dst, math.Float32bits(float32(f))), nil
		}
		return binary.BigEndian.AppendUint64(dst, math.Float64bits(f)), nil
	default: // numeric
		return appendNumeric(dst, s)
	}
}

// pow10f64 holds the powers of ten a float64 represents exactly.
var pow10f64 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// parseFloat64Short parses s (a JSON number, or pgNumberText's) when it has no exponent and at
// most 15 digits: the digits then make an integer a float64 holds exactly,
// and one division by an exact power of ten rounds correctly, so the result
// is strconv.ParseFloat's (Clinger's fast path, which ParseFloat also takes,
// without its general parsing). ok is false for any other s.
func parseFloat64Short(s string) (f float64, ok bool) {
	i, neg := 0, false
	if s[0] == '-' {
		i, neg = 1, true
	}
	var mant uint64
	nd, frac := 0, -1
	for ; i < len(s); i++ {
		c := s[i]
		if c == '.' {
			frac = 0
			continue
		}
		if c < '0' || c > '9' || nd == 15 {
			return 0, false
		}
		mant = mant*10 + uint64(c-'0')
		nd++
		if frac >= 0 {
			frac++
		}
	}
	f = float64(mant)
	if frac > 0 {
		f /= pow10f64[frac]
	}
	if neg {
		f = -f
	}
	return f, true
}

// nonZeroMantissa reports whether the number s has a non-zero digit
// before its exponent.
func nonZeroMantissa(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 'e' || c == 'E':
			return false
		case c >= '1' && c <= '9':
			return true
		}
	}
	return false
}

func appendIntValue(dst []byte, t Type, v int64) ([]byte, *DecodeError) {
	switch t {
	case TypeInt2:
		if v < math.MinInt16 || v > math.MaxInt16 {
			return dst, outOfRange(t, "")
		}
		return binary.BigEndian.AppendUint16(dst, uint16(v)), nil
	case TypeInt4:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return dst, outOfRange(t, "")
		}
		return binary.BigEndian.AppendUint32(dst, uint32(v)), nil
	default:
		return binary.BigEndian.AppendUint64(dst, uint64(v)), nil
	}
}

// isInteger reports whether s is -?[0-9]+.
func isInteger(s string) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseInt64 parses a string isInteger accepted; ok is false on overflow.
func parseInt64(s string) (int64, bool) {
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	var u uint64
	for i := 0; i < len(s); i++ {
		d := uint64(s[i] - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, false
		}
		u = u*10 + d
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return int64(-u), true //nolint:gosec // -u wraps to the right value, 1<<63 included
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// pgNumberText reads s, a string (not a JSON number) bound for a column
// of numeric type t, as PostgreSQL 15's text input for that type does:
// white space around it is dropped (isspace's six bytes), and so is a
// leading '+'. What is left must be -?[0-9]+ for an integer type; for the
// others a number whose point may have digits on one side only (".5",
// "1.", as C's strtod and numeric_in read them), then an optional
// exponent, which for numeric alone may start with white space ("1e 5":
// numeric_in reads the exponent with strtol, which skips it; float8in's
// strtod does not). It returns what is left, a substring of s, in a form
// parseInt64, appendNumeric and (with no white space in it)
// parseFloat64Short and strconv.ParseFloat read. NaN, Infinity, hex and
// PostgreSQL 16's 1_000 and 0x1F stay refused.
func pgNumberText(s string, t Type) (string, bool) {
	s = trimSpace(s)
	if len(s) > 1 && s[0] == '+' && s[1] != '-' {
		s = s[1:]
	}
	if t == TypeInt2 || t == TypeInt4 || t == TypeInt8 {
		return s, isInteger(s)
	}
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return s, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		for t == TypeNumeric && i < len(s) && isSpace(s[i]) {
			i++
		}
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			return s, false
		}
	}
	return s, i == len(s)
}

// trimSpace drops the white space around s that PostgreSQL's number and
// bool inputs skip: C's isspace, six ASCII bytes.
func trimSpace(s string) string {
	for len(s) > 0 && isSpace(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && isSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

func isSpace(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') }

// Limits of PostgreSQL's numeric as numeric_recv accepts it.
const (
	numericMaxDScale = 0x3FFF         // NUMERIC_DSCALE_MAX
	numericMaxWeight = math.MaxInt16  // NUMERIC_WEIGHT_MAX
	numericMinWeight = math.MinInt16  // a weight below this cannot be sent
	numericMaxDigits = math.MaxUint16 // ndigits is sent as uint16; the weight and dscale limits keep it far below
	numericPosSign   = 0x0000
	numericNegSign   = 0x4000
)

// numericMaxExp bounds a number's exponent as numeric_in (text) does: it
// refuses |exponent| >= INT_MAX/2, and below that only the weight and the
// dscale count, so 0e1000001 is 0.
const numericMaxExp = math.MaxInt32 / 2

var pow10x4 = [4]uint16{1, 10, 100, 1000}

// numericForm is numeric's binary form of a number's text before it is
// written (parseNumeric).
type numericForm struct {
	neg           bool
	intPart, frac string // the mantissa's digits before and after the point
	n             int    // len(intPart) + len(frac)
	f             int64  // the value is the digits * 10^-f
	dscale        int64
	lo, hi        int   // the first and last non-zero digit; lo == n for zero
	weight, low   int64 // the base-10000 places of digits lo and hi
}

func (p *numericForm) digit(k int) byte {
	if k < len(p.intPart) {
		return p.intPart[k] - '0'
	}
	return p.frac[k-len(p.intPart)] - '0'
}

// pow is the power of ten the digit at index k stands for.
func (p *numericForm) pow(k int) int64 { return int64(p.n-1-k) - p.f }

// parseNumeric reads s (a JSON number, or pgNumberText's) as numeric's
// binary form, or says why numeric cannot hold it (a detail for
// outOfRange). It allocates nothing.
func parseNumeric(s string) (p numericForm, detail string, ok bool) {
	p.neg = s[0] == '-'
	if p.neg {
		s = s[1:]
	}
	mant, exp := s, int64(0)
	for i := 0; i < len(s); i++ {
		if s[i] == 'e' || s[i] == 'E' {
			mant = s[:i]
			e := s[i+1:]
			for isSpace(e[0]) { // "1e 5" from a string, as numeric_in's strtol reads it
				e = e[1:]
			}
			eneg := e[0] == '-'
			if e[0] == '-' || e[0] == '+' {
				e = e[1:]
			}
			for j := 0; j < len(e); j++ {
				exp = exp*10 + int64(e[j]-'0')
				if exp >= numericMaxExp {
					return p, "exponent too large", false
				}
			}
			if eneg {
				exp = -exp
			}
			break
		}
	}
	p.intPart = mant
	for i := 0; i < len(mant); i++ {
		if mant[i] == '.' {
			p.intPart, p.frac = mant[:i], mant[i+1:]
			break
		}
	}
	p.n = len(p.intPart) + len(p.frac)
	p.f = int64(len(p.frac)) - exp
	p.dscale = max(p.f, 0)
	if p.dscale > numericMaxDScale {
		return p, "more than 16383 digits after the decimal point", false
	}
	p.lo, p.hi = 0, p.n-1
	for p.lo < p.n && p.digit(p.lo) == 0 {
		p.lo++
	}
	if p.lo == p.n { // zero
		return p, "", true
	}
	for p.digit(p.hi) == 0 {
		p.hi--
	}
	p.weight = floorDiv4(p.pow(p.lo))
	p.low = floorDiv4(p.pow(p.hi))
	if p.weight > numericMaxWeight || p.low < numericMinWeight {
		return p, "", false
	}
	if p.weight-p.low+1 > numericMaxDigits {
		return p, "too many significant digits", false
	}
	return p, "", true
}

// numericFits reports whether numeric holds the JSON number s, as jsonb
// needs, allocating nothing. A mantissa of fewer than 64 characters with
// an exponent of at most 4 digits always fits: its digits after the point
// number at most 63 + 9999 < 16383 (NUMERIC_DSCALE_MAX), and its first
// digit stands for at most 10^(63+9999), base-10000 place 2515, far below
// 32767 (NUMERIC_WEIGHT_MAX); the last for at least 10^-(63+9999). Other
// numbers are measured.
func numericFits(s string) bool {
	e := strings.IndexAny(s, "eE")
	if e < 0 {
		e = len(s)
	}
	if e < 64 && len(s)-e <= 1+1+4 { // e, a sign, 4 digits
		if d := s[min(e+1, len(s)):]; len(d) <= 4 || ((d[0] == '-' || d[0] == '+') && len(d) <= 5) {
			return true
		}
	}
	_, _, ok := parseNumeric(s)
	return ok
}

// appendNumeric encodes s (a JSON number, or pgNumberText's) in numeric's binary format:
// int16 ndigits, int16 weight, uint16 sign, uint16 dscale, then ndigits
// base-10000 digits, most significant first. The value is exact: the
// display scale is the number of fraction digits the text shows (after
// applying the exponent), as PostgreSQL's text input would give.
func appendNumeric(dst []byte, s string) ([]byte, *DecodeError) {
	p, detail, ok := parseNumeric(s)
	if !ok {
		return dst, outOfRange(TypeNumeric, detail)
	}
	if p.lo == p.n { // zero
		dst = binary.BigEndian.AppendUint16(dst, 0)
		dst = binary.BigEndian.AppendUint16(dst, 0)
		dst = binary.BigEndian.AppendUint16(dst, numericPosSign)
		return binary.BigEndian.AppendUint16(dst, uint16(p.dscale)), nil
	}
	nd := p.weight - p.low + 1
	dst = binary.BigEndian.AppendUint16(dst, uint16(nd))
	dst = binary.BigEndian.AppendUint16(dst, uint16(int16(p.weight)))
	if p.neg {
		dst = binary.BigEndian.AppendUint16(dst, numericNegSign)
	} else {
		dst = binary.BigEndian.AppendUint16(dst, numericPosSign)
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(p.dscale))
	base := len(dst)
	for range nd {
		dst = append(dst, 0, 0)
	}
	for k := p.lo; k <= p.hi; k++ {
		d := p.digit(k)
		if d == 0 {
			continue
		}
		pw := p.pow(k)
		g := floorDiv4(pw)
		at := base + 2*int(p.weight-g)
		v := binary.BigEndian.Uint16(dst[at:]) + uint16(d)*pow10x4[pw-4*g]
		binary.BigEndian.PutUint16(dst[at:], v)
	}
	return dst, nil
}

func floorDiv4(p int64) int64 {
	if p >= 0 {
		return p / 4
	}
	return -((-p + 3) / 4)
}

// uuidHex holds the offsets of the 16 hex digit pairs of a canonical UUID.
var uuidHex = [16]uint8{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

// appendUUID accepts the canonical 8-4-4-4-12 form in either case.
func appendUUID(dst []byte, s string) ([]byte, *DecodeError) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return dst, invalidFormat(TypeUUID, "want the canonical form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
	}
	var u [16]byte
	var bad byte
	for k, p := range uuidHex {
		h, l := unhexTab[s[p]], unhexTab[s[p+1]]
		bad |= h | l
		u[k] = h<<4 | l
	}
	if bad&0xF0 != 0 {
		return dst, invalidFormat(TypeUUID, "not a hex digit")
	}
	return append(dst, u[:]...), nil
}

// daysFromCivil returns the days since 1970-01-01 of a proleptic Gregorian
// date (H. Hinnant's algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	if y < 0 && y%400 != 0 {
		era = (y - 399) / 400
	}
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

const pgEpochDays = 10957 // 2000-01-01 in days since 1970-01-01

func daysIn(y, m int64) int64 {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func digits(s string, n int) (int64, bool) {
	if len(s) < n {
		return 0, false
	}
	var v int64
	for i := 0; i < n; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		v = v*10 + int64(s[i]-'0')
	}
	return v, true
}

// parseBool reads s as PostgreSQL's bool input does (boolin): white space
// around it is ignored, case too, and any prefix of true, yes, false or no
// counts, as do on, off (at least "of"), 1 and 0. It returns 1 or 0.
func parseBool(s string) (byte, bool) {
	s = trimSpace(s)
	if s == "" || len(s) > len("false") {
		return 0, false
	}
	var b [5]byte
	for i := range len(s) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	l := string(b[:len(s)])
	switch {
	case strings.HasPrefix("true", l), strings.HasPrefix("yes", l), l == "on", l == "1":
		return 1, true
	case strings.HasPrefix("false", l), strings.HasPrefix("no", l), len(l) >= 2 && strings.HasPrefix("off", l), l == "0":
		return 0, true
	}
	return 0, false
}

// parseYMD parses "YYYY-MM-DD" at the start of s into days since 2000-01-01.
func parseYMD(s string) (int64, bool) {
	if len(s) < 10 || s[4] != '-' || s[7] != '-' {
		return 0, false
	}
	y, ok1 := digits(s, 4)
	m, ok2 := digits(s[5:], 2)
	d, ok3 := digits(s[8:], 2)
	if !ok1 || !ok2 || !ok3 || m < 1 || m > 12 || d < 1 || d > daysIn(y, m) {
		return 0, false
	}
	return daysFromCivil(y, m, d) - pgEpochDays, true
}

// infinity reports whether s is "infinity" (+1) or "-infinity" (-1), in
// any case, as PostgreSQL's timestamptz and date input read them; 0 for
// anything else.
func infinity(s string) int {
	switch {
	case strings.EqualFold(s, "infinity"):
		return 1
	case strings.EqualFold(s, "-infinity"):
		return -1
	}
	return 0
}

// parseDate parses "YYYY-MM-DD" into days since 2000-01-01, or "infinity"
// and "-infinity" into PostgreSQL's date infinities (the largest and
// smallest int32). As PostgreSQL's date input does, it skips white space
// around the value and takes a date followed by a time of day and an
// optional zone (what parseTimestamp reads, zone or not), keeping the date
// as written: 2026-11-29T23:30:00-05:00 is 2026-11-29.
func parseDate(s string) (int32, bool) {
	// The plain "YYYY-MM-DD" skips the trim; ten bytes with white space at
	// an end (" -infinity", "infinity\t\t") do not.
	if len(s) != 10 || isSpace(s[0]) || isSpace(s[9]) {
		s = trimSpace(s)
		switch infinity(s) {
		case 1:
			return math.MaxInt32, true
		case -1:
			return math.MinInt32, true
		}
		if len(s) > 10 {
			_, rest, ok := parseClock(s)
			if !ok || (rest != "" && !zoneOK(rest)) {
				return 0, false
			}
			s = s[:10]
		}
	}
	d, ok := parseYMD(s)
	return int32(d), ok
}

// zoneOK reports whether parseZone reads all of rest.
func zoneOK(rest string) bool {
	_, ok := parseZone(rest)
	return ok
}

// parseTimestamp parses an RFC 3339 timestamp (YYYY-MM-DDTHH:MM:SS, an
// optional fraction of any length, then Z or ±HH:MM) into microseconds
// since 2000-01-01 UTC, rounding the fraction to microseconds as
// PostgreSQL's text input does (pgFractionMicros). Four-digit years always
// lie inside PostgreSQL's timestamptz range. It also takes the ISO 8601
// forms that common libraries write and PostgreSQL reads the same way: a
// space for the T (PostgreSQL's own output, Python's str), no seconds
// (Java's OffsetDateTime.toString at second 0: "10:15Z"; then no
// fraction either, which PostgreSQL would read as minutes and seconds),
// and the zones parseZone reads. Hour 24 is the next day's midnight when
// nothing follows it but zeros, as ISO 8601 and PostgreSQL have it
// (24:00:00.0000001 rounds to 24:00:00 in PostgreSQL too). "infinity" and
// "-infinity" (any case) are PostgreSQL's timestamp infinities, the
// largest and smallest int64. White space around the value is skipped, as
// PostgreSQL skips it.
func parseTimestamp(s string) (int64, *DecodeError) {
	if len(s) > 0 && (isSpace(s[0]) || isSpace(s[len(s)-1])) {
		s = trimSpace(s)
	}
	if len(s) < 10 { // shorter than any date: the hot path skips the look
		switch infinity(s) {
		case 1:
			return math.MaxInt64, nil
		case -1:
			return math.MinInt64, nil
		}
	}
	days, ok := parseYMD(s)
	if !ok {
		return 0, badTimestamp(s)
	}
	c, rest, ok := parseClock(s)
	if !ok {
		return 0, badTimestamp(s)
	}
	off, ok := parseZone(rest)
	if !ok {
		return 0, badTimestamp(s)
	}
	secs := days*86400 + c.h*3600 + c.mi*60 + c.sec - off
	return secs*1_000_000 + c.us, nil
}

// badTimestamp is the refusal of s, a string parseTimestamp refused: what
// timeRefusal finds wrong, else an example of the form wanted. Only the
// failure path comes here, so that valid values pay nothing for the
// classification.
func badTimestamp(s string) *DecodeError {
	why := timeRefusal(s, true)
	if why == "" {
		why = "want RFC 3339 such as 2026-11-29T19:59:15.123456Z"
	}
	return invalidFormat(TypeTimestamptz, why)
}

// badDate is the refusal of s, a string parseDate refused, as badTimestamp
// is parseTimestamp's.
func badDate(s string) *DecodeError {
	why := timeRefusal(s, false)
	if why == "" {
		why = "want YYYY-MM-DD"
	}
	return invalidFormat(TypeDate, why)
}

// timeRefusal says what is wrong with s, a timestamptz (needZone) or date
// that parseTimestamp or parseDate refused, when it has their form but a
// part of it is wrong: a date that does not exist, a time of day or an
// offset out of range, a zone named other than UTC or GMT, or (needZone)
// no zone. It returns "" for anything else. It re-reads s, mirroring the
// parsers' checks of form, so that a part whose form passes must have
// failed on its range.
func timeRefusal(s string, needZone bool) string {
	s = trimSpace(s)
	if len(s) < 10 || s[4] != '-' || s[7] != '-' {
		return ""
	}
	y, ok1 := digits(s, 4)
	m, ok2 := digits(s[5:], 2)
	d, ok3 := digits(s[8:], 2)
	switch {
	case !ok1 || !ok2 || !ok3:
		return ""
	case m < 1 || m > 12:
		return "no such date: month " + s[5:7]
	case d < 1:
		return "no such date: day 00"
	case d > daysIn(y, m):
		return "no such date: " + s[:7] + " has " + strconv.FormatInt(daysIn(y, m), 10) + " days"
	}
	if len(s) == 10 {
		if needZone {
			return "no time of day and no time zone: want RFC 3339 such as 2026-11-29T19:59:15.123456Z"
		}
		return ""
	}
	_, rest, ok := parseClock(s)
	if !ok {
		if clockForm(s) {
			return "time of day out of range: hours 00 to 23 (or 24:00:00, the end of the day), minutes 00 to 59, seconds 00 to 60"
		}
		return ""
	}
	z := strings.TrimLeft(rest, " ")
	switch {
	case z == "":
		if needZone {
			return "no time zone: add Z or an offset such as +01:00 (without one PostgreSQL would use its session's zone)"
		}
	case isLetter(z[0]):
		for i := 1; i < len(z); i++ {
			if c := z[i]; !isLetter(c) && !isDigit(c) && strings.IndexByte("/_+-", c) < 0 {
				return ""
			}
		}
		return "time zone named other than UTC or GMT, whose meaning is the server's setting: write Z or an offset such as +01:00"
	case offsetForm(z):
		return "time zone offset out of range: at most 23 hours, 59 minutes and 59 seconds either way"
	}
	return ""
}

// clockForm reports whether the time of day after the date in s has the
// form parseClock reads, whatever the range of its numbers.
func clockForm(s string) bool {
	if len(s) < 16 || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || s[13] != ':' {
		return false
	}
	_, ok1 := digits(s[11:], 2)
	_, ok2 := digits(s[14:], 2)
	if !ok1 || !ok2 {
		return false
	}
	rest := s[16:]
	if rest == "" || rest[0] != ':' {
		return true
	}
	if _, ok := digits(rest[1:], 2); !ok {
		return false
	}
	rest = rest[3:]
	return rest == "" || rest[0] != '.' || (len(rest) > 1 && isDigit(rest[1]))
}

// offsetForm reports whether z has the form of an offset parseZone reads,
// whatever the range of its numbers.
func offsetForm(z string) bool {
	if len(z) < 3 || (z[0] != '+' && z[0] != '-') {
		return false
	}
	all := func(s string) bool {
		_, ok := digits(s, len(s))
		return ok
	}
	switch {
	case len(z) == 3, len(z) == 5:
		return all(z[1:])
	case len(z) == 6 && z[3] == ':':
		return all(z[1:3]) && all(z[4:])
	case len(z) == 9 && z[3] == ':' && z[6] == ':':
		return all(z[1:3]) && all(z[4:6]) && all(z[7:])
	}
	return false
}

func isLetter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

// clock is a time of day as parseClock reads it.
type clock struct{ h, mi, sec, us int64 }

// parseClock reads the time of day after the date in s (a T, t or space,
// then HH:MM, optionally :SS and a fraction of any length rounded to
// microseconds) and returns it with the rest of s. Second 60 (a leap
// second, which RFC 3339 allows) is the next minute's first, as in
// PostgreSQL; hour 24 only with nothing but zeros after it.
func parseClock(s string) (c clock, rest string, ok bool) {
	if len(s) < 16 || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || s[13] != ':' {
		return c, "", false
	}
	h, ok1 := digits(s[11:], 2)
	mi, ok2 := digits(s[14:], 2)
	if !ok1 || !ok2 || h > 24 || mi > 59 {
		return c, "", false
	}
	c.h, c.mi = h, mi
	rest = s[16:]
	if rest != "" && rest[0] == ':' {
		if c.sec, ok = digits(rest[1:], 2); !ok || c.sec > 60 {
			return c, "", false
		}
		rest = rest[3:]
		if rest != "" && rest[0] == '.' {
			i := 1
			for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
				if i <= 6 {
					c.us = c.us*10 + int64(rest[i]-'0')
				}
				i++
			}
			if i == 1 {
				return c, "", false
			}
			for j := i; j <= 6; j++ {
				c.us *= 10
			}
			if i > 7 { // finer than microseconds: round as PostgreSQL's input does
				c.us = pgFractionMicros(rest[:i])
			}
			rest = rest[i:]
		}
	}
	if h == 24 && (mi != 0 || c.sec != 0 || c.us != 0) {
		return c, "", false // past the end of the day (PostgreSQL's time_overflows)
	}
	return c, rest, true
}

// parseZone reads all of rest, the zone after a time of day, as seconds
// east of UTC: Z, UTC or GMT in any case (zones whose meaning no server
// setting changes), or an offset of ±HH:MM, ±HH or ±HHMM (strftime's %z,
// PostgreSQL's "+00"), or ±HH:MM:SS (what Java's OffsetDateTime and
// Python's isoformat write for an instant in local mean time, before
// ~1900: Amsterdam's +00:19:32); spaces may come first (Ruby's Time#to_s:
// "2026-11-29 19:59:15 +0000", "... UTC"). No zone at all is refused:
// PostgreSQL would use its session's.
func parseZone(rest string) (off int64, ok bool) {
	for len(rest) > 0 && rest[0] == ' ' {
		rest = rest[1:]
	}
	switch {
	case rest == "Z" || rest == "z":
		return 0, true
	case len(rest) == 3 && (strings.EqualFold(rest, "UTC") || strings.EqualFold(rest, "GMT")):
		return 0, true
	case len(rest) < 3 || (rest[0] != '+' && rest[0] != '-'):
		return 0, false
	}
	oh, ok1 := digits(rest[1:], 2)
	var om, os int64
	ok2, ok3 := true, true
	switch {
	case len(rest) == 3: // ±HH
	case len(rest) == 5: // ±HHMM
		om, ok2 = digits(rest[3:], 2)
	case len(rest) == 6 && rest[3] == ':': // ±HH:MM
		om, ok2 = digits(rest[4:], 2)
	case len(rest) == 9 && rest[3] == ':' && rest[6] == ':': // ±HH:MM:SS, local mean time
		om, ok2 = digits(rest[4:], 2)
		os, ok3 = digits(rest[7:], 2)
	default:
		return 0, false
	}
	if !ok1 || !ok2 || !ok3 || oh > 23 || om > 59 || os > 59 {
		return 0, false
	}
	off = oh*3600 + om*60 + os
	if rest[0] == '-' {
		off = -off
	}
	return off, true
}

// strictBase64 is standard base64 that refuses nonzero padding bits ("QR==",
// which StdEncoding reads as "QQ==", "A"). Strict returns a new *Encoding:
// made once here, not per value.
var strictBase64 = base64.StdEncoding.Strict()

// appendBase64 decodes standard base64 (with padding) straight into dst,
// strictly: the unused bits of the last group must be zero, and line breaks,
// which even a strict Encoding skips, are refused as any other byte outside
// the alphabet is, so that one byte string has one encoding.
func appendBase64(dst []byte, s string) ([]byte, *DecodeError) {
	start := len(dst)
	if strings.ContainsAny(s, "\r\n") {
		return dst, invalidFormat(TypeBytea, "want standard base64 with padding")
	}
	n := strictBase64.DecodedLen(len(s))
	dst = append(dst, make([]byte, n)...)
	w, err := strictBase64.Decode(dst[start:], s2bView(s))
	if err != nil {
		return dst[:start], invalidFormat(TypeBytea, "want standard base64 with padding")
	}
	return dst[:start+w], nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s (valid UTF-8) as a JSON string, escaping what
// JSON needs escaped as PostgreSQL's jsonb output does: the two-byte forms
// \" \\ \b \f \n \r \t, and \u00XX only for the other control
// characters, so that a value of escapes grows no more than it came in.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	last := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[last:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		last = i + 1
	}
	dst = append(dst, s[last:]...)
	return append(dst, '"')
}

// pgFractionMicros rounds a fraction of a second (".ddddddd...", more than
// six digits) to microseconds the way PostgreSQL 15's text input does
// (ParseFractionalSecond: rint(strtod(fraction) * 1e6)): in binary floating
// point, ties to even, so ".0000005" is 0 µs and ".0000015" is 2, and
// ".1234565", whose double lies just below the tie, is 123456. Rounding the
// decimal digits half up instead stored 1 µs more than PostgreSQL would for
// some of these. The result may be 1,000,000 (".9999996"); the caller adds it.
//
// Up to 15 digits the decimal decides, except at an exact decimal tie: the
// fraction is at least 1e-15 s (1e-9 µs) from a tie, and the double and the
// product are within ~2.2e-10 µs of the decimal, so rounding the double
// lands where rounding the decimal half-way up or down does. That skips
// strconv.ParseFloat, 2.6% of jetsink's CPU in a drain of timestamps with
// nine fraction digits (BENCHMARKS.md, session 23).
func pgFractionMicros(frac string) int64 {
	if k := len(frac) - 1; k >= 7 && k <= 15 {
		var n int64
		for i := 1; i < len(frac); i++ {
			n = n*10 + int64(frac[i]-'0')
		}
		unit := int64(1)
		for range k - 6 {
			unit *= 10
		}
		q, r := n/unit, n%unit
		switch {
		case 2*r < unit:
			return q
		case 2*r > unit:
			return q + 1
		}
	}
	return pgFractionMicrosFloat(frac)
}

// pgFractionMicrosFloat is pgFractionMicros computed as PostgreSQL does.
func pgFractionMicrosFloat(frac string) int64 {
	f, err := strconv.ParseFloat(frac, 64) // correctly rounded, as glibc's strtod
	if err != nil {
		return 0 // not reached: frac is a dot and digits
	}
	return int64(math.RoundToEven(f * 1e6))
}

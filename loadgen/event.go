package loadgen

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"
)

// Event is one generated telemetry event.
type Event struct {
	ID     [16]byte // a version-4-shaped UUID derived from (run, seq)
	TS     time.Time
	Device string
	Kind   string
	Value  float64
	Seq    uint64
	Site   string
	Rack   string
}

var kinds = [...]string{"temperature", "humidity", "pressure", "voltage"}

// Base is the timestamp of seq 0; seq n is n milliseconds later.
var Base = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// Make returns event seq of run, spread over subjects devices.
func Make(run, seq uint64, subjects int) Event {
	if subjects < 1 {
		subjects = 1
	}
	h := mix(run*0x9E3779B97F4A7C15 ^ seq)
	var e Event
	binary.BigEndian.PutUint64(e.ID[:8], h)
	binary.BigEndian.PutUint64(e.ID[8:], mix(h^seq))
	e.ID[6] = e.ID[6]&0x0f | 0x40 // version 4
	e.ID[8] = e.ID[8]&0x3f | 0x80 // RFC 4122 variant
	e.TS = Base.Add(time.Duration(seq) * time.Millisecond)
	dev := seq % uint64(subjects)
	e.Device = "dev-" + strconv.FormatUint(dev, 10)
	e.Kind = kinds[h%uint64(len(kinds))]
	e.Value = math.Round(float64(h%100000)/1000*1000) / 1000 // 0..99.999, 3 decimals
	e.Seq = seq
	e.Site = "site-" + strconv.FormatUint(dev%7, 10)
	e.Rack = "r" + strconv.FormatUint(dev%40, 10)
	return e
}

// mix is SplitMix64's finaliser.
func mix(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// UUID renders ID in canonical form.
func (e *Event) UUID() string {
	var b [36]byte
	hex.Encode(b[0:8], e.ID[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], e.ID[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], e.ID[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], e.ID[8:10])
	b[23] = '-'
	hex.Encode(b[24:], e.ID[10:])
	return string(b[:])
}

// Subject is the event's subject under prefix: prefix.<device>.
func (e *Event) Subject(prefix string) string { return prefix + "." + e.Device }

// Pad extends the JSON object at the end of dst (as AppendJSON wrote it)
// to exactly size bytes, for events larger than the ~180 bytes of a bare
// one, with a "pad" field of x's; a difference too small for the field
// (under its 9 bytes, `,"pad":""`) is made of spaces before the object's
// closing brace, which JSON ignores. Otherwise bare events, whose length
// varies by some bytes with their values, would come out at a mix of
// lengths for a size just above theirs. A size it already reaches adds
// nothing.
func Pad(dst []byte, size int) []byte {
	const field = `,"pad":""`
	d := size - len(dst)
	if d <= 0 || len(dst) == 0 || dst[len(dst)-1] != '}' {
		return dst
	}
	if d < len(field) {
		return append(append(dst[:len(dst)-1], "        "[:d]...), '}')
	}
	n := d - len(field)
	dst = append(dst[:len(dst)-1], `,"pad":"`...)
	for n > 0 {
		k := min(n, len(padding))
		dst = append(dst, padding[:k]...)
		n -= k
	}
	return append(dst, `"}`...)
}

var padding = strings.Repeat("x", 4096)

// AppendJSON appends the event as compact JSON.
func (e *Event) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, e.UUID()...)
	dst = append(dst, `","ts":"`...)
	dst = e.TS.AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","device":"`...)
	dst = append(dst, e.Device...)
	dst = append(dst, `","kind":"`...)
	dst = append(dst, e.Kind...)
	dst = append(dst, `","value":`...)
	dst = strconv.AppendFloat(dst, e.Value, 'f', -1, 64)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"tags":{"site":"`...)
	dst = append(dst, e.Site...)
	dst = append(dst, `","rack":"`...)
	dst = append(dst, e.Rack...)
	dst = append(dst, `"}}`...)
	return dst
}

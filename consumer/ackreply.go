package consumer

import (
	"strings"
	"time"
)

// ackMeta is what an ack reply subject says about a delivered message.
type ackMeta struct {
	stream    string
	delivered uint64
	streamSeq uint64
	consSeq   uint64
	published time.Time
	pending   uint64 // messages after this one not yet delivered to the consumer
}

// parseAckReply reads a JetStream ack reply subject without allocating
// (jetstream.Msg.Metadata allocates its result on every message):
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	v2: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>...]
//
// It accepts exactly what nats.go's parser accepts (9 tokens, or 11 and
// more) and reports false otherwise; numbers that are not plain decimals
// read as 0, as there.
func parseAckReply(reply string) (ackMeta, bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return ackMeta{}, false
	}
	n := strings.Count(rest, ".") + 3 // tokens in the whole subject
	switch {
	case n == 9:
	case n >= 11:
		_, rest, _ = strings.Cut(rest, ".") // domain
		_, rest, _ = strings.Cut(rest, ".") // account hash
	default:
		return ackMeta{}, false
	}
	var tok [7]string // stream, consumer, delivered, sseq, cseq, tm, pending
	for i := range tok {
		tok[i], rest, _ = strings.Cut(rest, ".")
	}
	return ackMeta{
		stream:    tok[0],
		delivered: parseNum(tok[2]),
		streamSeq: parseNum(tok[3]),
		consSeq:   parseNum(tok[4]),
		published: time.Unix(0, int64(parseNum(tok[5]))),
		pending:   parseNum(tok[6]),
	}, true
}

// parseNum reads a decimal; anything else (or nothing) is 0.
func parseNum(s string) uint64 {
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

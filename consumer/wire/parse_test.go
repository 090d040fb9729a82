package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// wantFrame is a frame as the tests compare it.
type wantFrame struct {
	kind                      frameKind
	sid                       uint64
	subj, reply, header, data string
	text                      string
}

func got(f *frame) wantFrame {
	w := wantFrame{kind: f.kind, sid: f.sid, text: string(f.text)}
	if f.msg != nil {
		w.subj, w.reply, w.header, w.data = f.msg.Subject(), f.msg.Reply(), f.msg.HeaderBlock(), string(f.msg.Data())
	}
	return w
}

const hdrBlock = "NATS/1.0\r\nNats-Msg-Id: id-1\r\ntraceparent:  00-abc-01\r\n\r\n"

var protoStream = []struct {
	wire string
	want wantFrame
}{
	{"INFO {\"max_payload\":1048576}\r\n", wantFrame{kind: frameInfo, text: `{"max_payload":1048576}`}},
	{"MSG a.b 1 5\r\nhello\r\n", wantFrame{kind: frameMsg, sid: 1, subj: "a.b", data: "hello"}},
	{"MSG a.b 2 $JS.ACK.S.C.1.2.3.4.0 0\r\n\r\n", wantFrame{kind: frameMsg, sid: 2, subj: "a.b", reply: "$JS.ACK.S.C.1.2.3.4.0"}},
	{"msg\ta  7\t r 3\r\nx\r\n\r\n", wantFrame{kind: frameMsg, sid: 7, subj: "a", reply: "r", data: "x\r\n"}},
	{"HMSG ev.1 3 $JS.ACK.x " + itoa(len(hdrBlock)) + " " + itoa(len(hdrBlock)+4) + "\r\n" + hdrBlock + "data\r\n",
		wantFrame{kind: frameMsg, sid: 3, subj: "ev.1", reply: "$JS.ACK.x", header: hdrBlock, data: "data"}},
	{"HMSG _INBOX.x 4 31 31\r\nNATS/1.0 100 Idle Heartbeat\r\n\r\n\r\n",
		wantFrame{kind: frameMsg, sid: 4, subj: "_INBOX.x", header: "NATS/1.0 100 Idle Heartbeat\r\n\r\n"}},
	{"PING\r\n", wantFrame{kind: framePing}},
	{"pong\r\n", wantFrame{kind: framePong}},
	{"+OK\r\n", wantFrame{kind: frameOK}},
	{"-ERR 'Permissions Violation for Publish to \"x\"'\r\n", wantFrame{kind: frameErr, text: `Permissions Violation for Publish to "x"`}},
	{"PING\n", wantFrame{kind: framePing}},
}

func itoa(n int) string { return strconv.Itoa(n) }

func readAll(t *testing.T, r io.Reader, maxPayload int) []wantFrame {
	t.Helper()
	p := parser{br: bufio.NewReaderSize(r, readBufSize), maxPayload: maxPayload}
	var out []wantFrame
	var f frame
	for {
		err := p.next(&f)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("after %d frames: %v", len(out), err)
		}
		out = append(out, got(&f))
	}
}

func TestParserEveryOp(t *testing.T) {
	var all strings.Builder
	var want []wantFrame
	for _, c := range protoStream {
		all.WriteString(c.wire)
		want = append(want, c.want)
	}
	check := func(t *testing.T, frames []wantFrame) {
		t.Helper()
		if len(frames) != len(want) {
			t.Fatalf("got %d frames, want %d", len(frames), len(want))
		}
		for i := range want {
			if frames[i] != want[i] {
				t.Errorf("frame %d:\n got %+v\nwant %+v", i, frames[i], want[i])
			}
		}
	}
	t.Run("whole", func(t *testing.T) { check(t, readAll(t, strings.NewReader(all.String()), 1<<20)) })
	t.Run("one byte at a time", func(t *testing.T) {
		check(t, readAll(t, iotest.OneByteReader(strings.NewReader(all.String())), 1<<20))
	})
	s := all.String()
	for i := 1; i < len(s); i++ {
		r := io.MultiReader(iotest.HalfReader(strings.NewReader(s[:i])), strings.NewReader(s[i:]))
		frames := readAll(t, r, 1<<20)
		if len(frames) != len(want) {
			t.Fatalf("split at %d: got %d frames, want %d", i, len(frames), len(want))
		}
	}
}

func TestParserHeaders(t *testing.T) {
	p := parser{br: bufio.NewReader(strings.NewReader(protoStream[4].wire))}
	var f frame
	if err := p.next(&f); err != nil {
		t.Fatal(err)
	}
	m := f.msg
	for key, want := range map[string]string{
		"Nats-Msg-Id": "id-1", "traceparent": "00-abc-01",
		"nats-msg-id": "", "Traceparent": "", "Missing": "",
	} {
		if v := m.HeaderGet(key); v != want {
			t.Errorf("HeaderGet(%q) = %q, want %q", key, v, want)
		}
	}
	if v, ok := m.HeaderLookup("traceparent"); !ok || v != "00-abc-01" {
		t.Errorf("HeaderLookup(traceparent) = %q, %v", v, ok)
	}
	if _, ok := m.HeaderLookup("nats-msg-id"); ok {
		t.Error("HeaderLookup is case-insensitive")
	}
	var keys []string
	for k, v := range m.HeaderFields() {
		keys = append(keys, k+"="+v)
	}
	if got := strings.Join(keys, ","); got != "Nats-Msg-Id=id-1,traceparent=00-abc-01" {
		t.Errorf("HeaderFields: %s", got)
	}
	if code, _ := m.status(); code != 0 {
		t.Errorf("user message has status %d", code)
	}
	st := "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 12\r\nNats-Pending-Bytes: 0\r\n\r\n"
	p = parser{br: bufio.NewReader(strings.NewReader("HMSG _INBOX.x 4 " + itoa(len(st)) + " " + itoa(len(st)) + "\r\n" + st + "\r\n"))}
	if err := p.next(&f); err != nil {
		t.Fatal(err)
	}
	code, descr := f.msg.status()
	if code != 408 || descr != "Request Timeout" || f.msg.HeaderGet("Nats-Pending-Messages") != "12" {
		t.Errorf("status %d %q pending %q", code, descr, f.msg.HeaderGet("Nats-Pending-Messages"))
	}
}

func TestParserRejects(t *testing.T) {
	for name, in := range map[string]string{
		"unknown op":         "HELLO\r\n",
		"empty line":         "\r\n",
		"msg few args":       "MSG a 1\r\n",
		"msg many args":      "MSG a 1 r x 5\r\nhello\r\n",
		"hmsg few args":      "HMSG a 1 5\r\nhello\r\n",
		"bad sid":            "MSG a x 5\r\nhello\r\n",
		"bad size":           "MSG a 1 5x\r\nhello\r\n",
		"negative size":      "MSG a 1 -5\r\nhello\r\n",
		"huge number":        "MSG a 1 99999999999999999999999\r\nhello\r\n",
		"header over total":  "HMSG a 1 10 5\r\nhello\r\n",
		"no crlf after body": "MSG a 1 5\r\nhelloXY",
		"short body":         "MSG a 1 5\r\nhel",
		"body then eof":      "MSG a 1 5\r\nhello",
		"oversize":           "MSG a 1 70000000\r\n",
		"ping with args":     "PING x\r\n",
		"line too long":      "MSG " + strings.Repeat("a", readBufSize) + " 1 1\r\nx\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			p := parser{br: bufio.NewReaderSize(strings.NewReader(in), readBufSize), maxPayload: 1000}
			var f frame
			err := p.next(&f)
			if err == nil {
				t.Fatalf("accepted %q as %+v", in, got(&f))
			}
			if !errors.Is(err, ErrProtocol) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v, want ErrProtocol or ErrUnexpectedEOF", err)
			}
		})
	}
}

func FuzzParser(f *testing.F) {
	for _, c := range protoStream {
		f.Add([]byte(c.wire))
	}
	f.Add([]byte("HMSG a 1 3 3\r\nabc\r\n"))
	f.Add([]byte("HMSG a 1 r 12 12\r\nNATS/1.0 4\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		p := parser{br: bufio.NewReaderSize(bytes.NewReader(in), readBufSize), maxPayload: 4096}
		var f frame
		for p.next(&f) == nil {
			if f.kind != frameMsg {
				continue
			}
			m := f.msg
			if m.Subject() == "" {
				t.Fatal("message without subject")
			}
			_ = m.Reply()
			_ = m.Data()
			_, _ = m.status()
			_ = m.HeaderGet("Nats-Msg-Id")
			for range m.HeaderFields() {
			}
		}
	})
}

func TestIndexBlank(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", -1}, {"abc", -1}, {" ", 0}, {"\t", 0}, {"ab c", 2}, {"ab\tc", 2},
		{"ab\t c", 2}, {"ab \tc", 2}, {"a b\tc", 1}, {"a\tb c", 1},
		{"$JS.ACK.stream.consumer.1.2.3.1700000000000000000.0 17", 51},
	} {
		if got := indexBlank([]byte(c.in)); got != c.want {
			t.Errorf("indexBlank(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// chunkReader returns one chunk per Read, noting when it returned each and
// sleeping a little first so that successive clock readings differ.
type chunkReader struct {
	chunks []string
	at     []time.Time
}

func (r *chunkReader) Read(b []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	time.Sleep(time.Millisecond)
	n := copy(b, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if r.chunks[0] == "" {
		r.chunks = r.chunks[1:]
	}
	r.at = append(r.at, time.Now())
	return n, nil
}

// A message is stamped with the read that completed it, not the one that
// brought its control line; without a clock it has no receipt time.
func TestMsgReceivedIsTheReadThatCompletedIt(t *testing.T) {
	r := &chunkReader{chunks: []string{"MSG a 1 5\r\nhel", "lo\r\nMSG b 1 2\r\nhi\r\n", "MSG c 1 1\r\nx\r\n"}}
	clock := &readClock{r: r}
	p := parser{br: bufio.NewReaderSize(clock, readBufSize), maxPayload: 1 << 20, clock: clock}
	var got []time.Time
	var f frame
	for {
		err := p.next(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f.msg.Received())
	}
	if len(got) != 3 || len(r.at) != 3 {
		t.Fatalf("%d messages from %d reads, want 3 from 3", len(got), len(r.at))
	}
	after := time.Now()
	within := func(i int, from, to time.Time) {
		if got[i].Before(from) || got[i].After(to) {
			t.Errorf("message %d received at %v, want within [%v, %v]", i, got[i], from, to)
		}
	}
	within(0, r.at[1], r.at[2]) // its body ended in the second read
	within(1, r.at[1], r.at[2])
	within(2, r.at[2], after)

	p = parser{br: bufio.NewReader(strings.NewReader("MSG a 1 1\r\nx\r\n"))}
	if err := p.next(&f); err != nil {
		t.Fatal(err)
	}
	if !f.msg.Received().IsZero() {
		t.Errorf("without a clock: received %v, want the zero Time", f.msg.Received())
	}
}

// HeaderFold prefers an exact match anywhere in the block to an earlier
// match in another case, as HeaderGet followed by a case-blind search did.
func TestHeaderFoldPrefersExactCase(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{"NATS/1.0\r\nTRACEPARENT: upper\r\ntraceparent: exact\r\n\r\n", "exact"},
		{"NATS/1.0\r\nTraceParent: mixed\r\nTRACEPARENT: upper\r\n\r\n", "mixed"},
		{"NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n", ""},
		{"NATS/1.0\r\ntraceparentx: no\r\ntrace: no\r\n\r\n", ""},
	} {
		in := "HMSG a 1 " + itoa(len(c.block)) + " " + itoa(len(c.block)) + "\r\n" + c.block + "\r\n"
		p := parser{br: bufio.NewReader(strings.NewReader(in))}
		var f frame
		if err := p.next(&f); err != nil {
			t.Fatal(err)
		}
		if got := f.msg.HeaderFold("traceparent"); got != c.want {
			t.Errorf("%q: HeaderFold = %q, want %q", c.block, got, c.want)
		}
	}
}

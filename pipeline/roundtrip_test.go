package pipeline

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/tests/testenv"
)

// rowStrings collects a row of any width for error messages.
func rowStrings(r pgx.CollectableRow) ([]string, error) {
	vals, err := r.Values()
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = fmt.Sprint(v)
	}
	return out, err
}

// readCorpusEntry reads a "go test fuzz v1" file holding a []byte and a string.
// queryRows runs query on conn and returns its rows as strings, failing
// the test on an error.
func queryRows(t *testing.T, ctx context.Context, conn *pgx.Conn, query string, args ...any) [][]string {
	t.Helper()
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, rowStrings)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readCorpusEntry(t testing.TB, path string) ([]byte, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%s: %d lines", path, len(lines))
	}
	unq := func(line, prefix string) string {
		v, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(line, prefix), ")"))
		if err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		return v
	}
	return []byte(unq(lines[1], "[]byte(")), unq(lines[2], "string(")
}

// copyTuples COPYs tuples into table in binary format, as the sink does.
func copyTuples(t *testing.T, ctx context.Context, conn *pgx.Conn, table string, cols []Column, tuples [][]byte) {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("PGCOPY\n\xff\r\n\x00")
	buf.Write(make([]byte, 8)) // flags, header extension length
	for _, tup := range tuples {
		buf.Write(tup)
	}
	buf.Write(binary.BigEndian.AppendUint16(nil, 0xffff))
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	sql := fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", pgx.Identifier{table}.Sanitize(), strings.Join(names, ", "))
	tag, err := conn.PgConn().CopyFrom(ctx, &buf, sql)
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
	if int(tag.RowsAffected()) != len(tuples) {
		t.Fatalf("copied %d rows, want %d", tag.RowsAffected(), len(tuples))
	}
}

func createTable(t *testing.T, ctx context.Context, conn *pgx.Conn, table string, cols []Column) {
	t.Helper()
	defs := make([]string, len(cols))
	for i, c := range cols {
		defs[i] = pgx.Identifier{c.Name}.Sanitize() + " " + string(c.Type)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (%s)", pgx.Identifier{table}.Sanitize(), strings.Join(defs, ", "))); err != nil {
		t.Fatal(err)
	}
}

func encodeAll(t *testing.T, m *Mapper, evs []Event) [][]byte {
	t.Helper()
	enc := m.NewEncoder(0)
	var out [][]byte
	for i := range evs {
		tup, err := enc.AppendTuple(nil, &evs[i])
		if err != nil {
			t.Fatalf("event %d (%s): %v", i, evs[i].Data, err)
		}
		out = append(out, tup)
	}
	return out
}

// TestRoundTripPostgres COPYs encoded tuples of every type into a real
// PostgreSQL and reads the values back as text.
func TestRoundTripPostgres(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := pg.Conn(t)
	if _, err := conn.Exec(ctx, "SET TIME ZONE 'UTC'"); err != nil {
		t.Fatal(err)
	}

	t.Run("every type", func(t *testing.T) {
		cols := []Column{
			{Name: "c_text", From: "json:text", Type: TypeText},
			{Name: "c_uuid", From: "json:uuid", Type: TypeUUID},
			{Name: "c_int2", From: "json:int2", Type: TypeInt2},
			{Name: "c_int4", From: "json:int4", Type: TypeInt4},
			{Name: "c_int8", From: "json:int8", Type: TypeInt8},
			{Name: "c_float4", From: "json:float4", Type: TypeFloat4},
			{Name: "c_float8", From: "json:float8", Type: TypeFloat8},
			{Name: "c_numeric", From: "json:numeric", Type: TypeNumeric},
			{Name: "c_bool", From: "json:bool", Type: TypeBool},
			{Name: "c_ts", From: "json:ts", Type: TypeTimestamptz},
			{Name: "c_date", From: "json:date", Type: TypeDate},
			{Name: "c_jsonb", From: "/obj", Type: TypeJSONB},
			{Name: "c_bytea", From: "json:bytes", Type: TypeBytea},
			{Name: "c_seq", From: "meta:stream_seq", Type: TypeNumeric},
			{Name: "c_body", From: "payload", Type: TypeJSONB},
		}
		evs := []Event{
			{StreamSeq: 18446744073709551615, Data: []byte(`{"text":"héllo \"q\"\n😀","uuid":"3F0C9A2E-1B7D-4C8E-9F00-0123456789AB",` +
				`"int2":-32768,"int4":2147483647,"int8":"-9223372036854775808","float4":0.1,"float8":21.375,` +
				`"numeric":-12.50,"bool":true,"ts":"2026-11-29T21:59:15.123456+02:00","date":"1999-12-31",` +
				`"obj":{"a":[1,"x\t"],"b":null,"c\u00e9":1.50},"bytes":"AAEC/w=="}`)},
			{StreamSeq: 0, Data: []byte(`{"text":null,"obj":null}`)},
			{StreamSeq: 10000, Data: []byte(`{"text":{"k":[true,false]},"numeric":"1e-5","ts":"0000-03-01T00:00:00Z","date":"9999-12-31","float8":-0,"bool":false,"bytes":""}`)},
		}
		want := [][]string{
			{"héllo \"q\"\n😀", "3f0c9a2e-1b7d-4c8e-9f00-0123456789ab", "-32768", "2147483647", "-9223372036854775808",
				"0.1", "21.375", "-12.50", "true", "2026-11-29 19:59:15.123456+00", "1999-12-31",
				`{"a": [1, "x\t"], "b": null, "cé": 1.50}`, `\x000102ff`, "18446744073709551615", string(evs[0].Data)},
			{`{"k":[true,false]}`, "NULL", "NULL", "NULL", "NULL", "NULL", "-0", "0.00001", "false", "0001-03-01 00:00:00+00 BC", "9999-12-31",
				"NULL", `\x`, "10000", string(evs[2].Data)},
			{"NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "0", string(evs[1].Data)},
		}
		createTable(t, ctx, conn, "every_type", cols)
		copyTuples(t, ctx, conn, "every_type", cols, encodeAll(t, mustCompile(t, cols...), evs))

		sel := make([]string, len(cols))
		for i, c := range cols {
			sel[i] = fmt.Sprintf("coalesce(%s::text, 'NULL')", pgx.Identifier{c.Name}.Sanitize())
		}
		rows, err := conn.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM every_type ORDER BY c_seq DESC")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]string, error) {
			vals := make([]string, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			return vals, r.Scan(ptrs...)
		})
		if err != nil {
			t.Fatal(err)
		}
		// jsonb normalises the payload; compare the payload column as jsonb.
		for i := range want {
			for j := range cols {
				w := want[i][j]
				if cols[j].Name == "c_body" {
					var eq bool
					if err := conn.QueryRow(ctx, "SELECT $1::jsonb = $2::jsonb", got[i][j], w).Scan(&eq); err != nil || !eq {
						t.Errorf("row %d c_body = %s, want %s (%v)", i, got[i][j], w, err)
					}
					continue
				}
				if got[i][j] != w {
					t.Errorf("row %d %s = %q, want %q", i, cols[j].Name, got[i][j], w)
				}
			}
		}
	})

	// Numbers and timestamps: the same JSON value goes both to a text column
	// (its JSON text) and to the typed column; PostgreSQL's own text input
	// must agree with our binary encoding.
	t.Run("agrees with text input", func(t *testing.T) {
		cols := []Column{
			{Name: "src", From: "json:v", Type: TypeText},
			{Name: "n", From: "json:v", Type: TypeNumeric},
			{Name: "f8", From: "json:v", Type: TypeFloat8},
		}
		nums := []string{"0", "-0", "0.000", "1", "-1", "9999", "10000", "0.0001", "0.00012", "123.456", "-99999999.99999999",
			"12345678901234567890.123456789", "1e10", "1.5e-7", "123e-2", "1E+3", "0e-20", "5e-324", "1.7976931348623157e308",
			"3.4028235e38", "1e-45", "100000000", "0.1", "1e300", "-1e-300",
			// float8's fast path and its edges: 15 and 16 digits, 2^53 and
			// around it, negative zero, trailing zeros, exponent forms.
			"123456789012345", "-0.00000000000001", "99999999999999.9", "1234567890123456", "9007199254740992",
			"9007199254740993", "-9007199254740993.5", "0.000000000000001", "1.500000000000000", "-0.0", "1.0e0",
			"0e1000001", "2.4703282292062328e-324", "4.9e-324", "0.1000000000000000055511151231257827"}
		r := rand.New(rand.NewPCG(1, 2))
		for range 300 {
			s := strconv.FormatInt(r.Int64N(1e12)-5e11, 10)
			if r.IntN(2) == 0 {
				s += "." + strconv.Itoa(r.IntN(1e6))
			}
			if r.IntN(3) == 0 {
				s += "e" + strconv.Itoa(r.IntN(80)-40)
			}
			nums = append(nums, s)
		}
		evs := make([]Event, len(nums))
		for i, s := range nums {
			evs[i] = Event{Data: []byte(`{"v":` + s + `}`)}
		}
		createTable(t, ctx, conn, "numbers", cols)
		copyTuples(t, ctx, conn, "numbers", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT src, n::text, src::numeric::text FROM numbers
			WHERE n::text <> src::numeric::text OR f8 <> src::float8`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
		var count int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM numbers").Scan(&count); err != nil || count != len(nums) {
			t.Fatalf("count %d (%v), want %d", count, err, len(nums))
		}
	})

	t.Run("timestamps agree with text input", func(t *testing.T) {
		cols := []Column{
			{Name: "src", From: "json:v", Type: TypeText},
			{Name: "ts", From: "json:v", Type: TypeTimestamptz},
		}
		tss := []string{"2026-11-29T24:00:00Z", "2026-11-29T24:00Z", "2026-12-31T24:00:00.0000001+14:00",
			"2024-02-28T24:00:00-05:30", "infinity", "-infinity", "Infinity", "-INFINITY",
			"2016-12-31T23:59:60Z", "2026-11-29 19:59:15.1234565+00",
			// zones after spaces, UTC and GMT, white space around the value
			"2026-11-29 19:59:15 UTC", "2026-11-29 19:59:15UTC", "2026-11-29T19:59:15.5 gmt", "2026-11-29 19:59 Utc",
			"2026-11-29 19:59:15 +0530", "2026-11-29T19:59:15  -01:00", "2026-11-29 19:59:15 z", " 2026-11-29T19:59:15Z ",
			"\\t2026-11-29T19:59:15+01\\n", " infinity", "-infinity\\r"}
		// A zone the encoder missed would show: the session's is not UTC here.
		if _, err := conn.Exec(ctx, "SET TIME ZONE 'Asia/Kolkata'"); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if _, err := conn.Exec(ctx, "SET TIME ZONE 'UTC'"); err != nil {
				t.Fatal(err)
			}
		}()
		evs := make([]Event, len(tss))
		for i, s := range tss {
			evs[i] = Event{Data: []byte(`{"v":"` + s + `"}`)}
		}
		createTable(t, ctx, conn, "timestamps", cols)
		copyTuples(t, ctx, conn, "timestamps", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT src, ts::text, src::timestamptz::text FROM timestamps
			WHERE ts IS DISTINCT FROM src::timestamptz`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
		dates := []string{"infinity", "-Infinity", "2026-11-29", " 2026-11-29\\t", "2026-11-29T23:59:15-05:00",
			"2026-11-29 24:00:00", "2026-11-29T23:59:60Z", "2026-11-29 10:00", "2026-11-29 10:00:00.9999999 UTC",
			"2026-11-29T00:30+14:00", " -infinity ",
			// ten bytes with white space at an end, the length of a plain date
			" -infinity", "-infinity ", " infinity ", "  infinity", "infinity\\t\\t", " infinity\\n"}
		evs = make([]Event, len(dates))
		for i, s := range dates {
			evs[i] = Event{Data: []byte(`{"v":"` + s + `"}`)}
		}
		cols[1] = Column{Name: "d", From: "json:v", Type: TypeDate}
		createTable(t, ctx, conn, "dates", cols)
		copyTuples(t, ctx, conn, "dates", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad = queryRows(t, ctx, conn, `SELECT src, d::text, src::date::text FROM dates WHERE d IS DISTINCT FROM src::date`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
		var count int
		if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM timestamps) + (SELECT count(*) FROM dates)").Scan(&count); err != nil ||
			count != len(tss)+len(dates) {
			t.Fatalf("count %d (%v), want %d", count, err, len(tss)+len(dates))
		}
	})

	t.Run("float4 agrees with text input", func(t *testing.T) {
		cols := []Column{{Name: "src", From: "json:v", Type: TypeText}, {Name: "f4", From: "json:v", Type: TypeFloat4}}
		nums := []string{"0", "-0", "0.1", "3.4028235e38", "-3.4028235e38", "1e-45", "1.17549435e-38", "16777217", "21.375"}
		r := rand.New(rand.NewPCG(5, 6))
		for range 300 {
			nums = append(nums, strconv.FormatInt(r.Int64N(1e9)-5e8, 10)+"."+strconv.Itoa(r.IntN(1e6))+"e"+strconv.Itoa(r.IntN(50)-30))
		}
		evs := make([]Event, len(nums))
		for i, s := range nums {
			evs[i] = Event{Data: []byte(`{"v":` + s + `}`)}
		}
		createTable(t, ctx, conn, "float4s", cols)
		copyTuples(t, ctx, conn, "float4s", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT src, f4::text FROM float4s WHERE f4 <> src::float4`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
		// Values PostgreSQL's text input refuses as out of range are refused here too.
		for _, s := range []string{"3.5e38", "1e-46", "1e39"} {
			_, err := mustCompile(t, cols...).NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{"v":` + s + `}`)})
			if de, ok := err.(*DecodeError); !ok || de.Code != CodeOutOfRange {
				t.Errorf("%s: %v, want out_of_range", s, err)
			}
			if _, err := conn.Exec(ctx, "SELECT $1::text::float4", s); err == nil {
				t.Errorf("%s: PostgreSQL accepts it, the encoder does not", s)
			}
		}
	})

	// Whatever the encoder accepts, PostgreSQL must accept: COPY every
	// fuzz corpus entry that encodes.
	t.Run("fuzz corpus", func(t *testing.T) {
		dir := filepath.Join("testdata", "fuzz", "FuzzAppendTuple")
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		createTable(t, ctx, conn, "fuzz_corpus", fuzzColumns)
		enc := mustCompile(t, fuzzColumns...).NewEncoder(1 << 16)
		accepted := 0
		for _, e := range entries {
			payload, header := readCorpusEntry(t, filepath.Join(dir, e.Name()))
			tup, err := enc.AppendTuple(nil, &Event{Data: payload, Header: map[string][]string{"H": {header}}})
			if err != nil {
				continue
			}
			accepted++
			var buf bytes.Buffer
			buf.WriteString("PGCOPY\n\xff\r\n\x00")
			buf.Write(make([]byte, 8))
			buf.Write(tup)
			buf.Write([]byte{0xff, 0xff})
			if _, err := conn.PgConn().CopyFrom(ctx, &buf, "COPY fuzz_corpus FROM STDIN (FORMAT binary)"); err != nil {
				t.Errorf("%s: PostgreSQL refuses what the encoder accepted: %v\npayload %q header %q", e.Name(), err, payload, header)
			}
		}
		if accepted == 0 {
			t.Fatal("no corpus entry encodes")
		}
		t.Logf("%d of %d corpus entries encode; PostgreSQL took them all", accepted, len(entries))
	})

	// Random JSON documents: the jsonb the encoder re-serialises from a
	// sub-value must equal what PostgreSQL parses from the original bytes,
	// and text from a JSON string must equal jsonb's own ->> extraction
	// (JSON null is SQL NULL in our columns).
	t.Run("random json", func(t *testing.T) {
		cols := []Column{
			{Name: "doc", From: "payload", Type: TypeJSONB},
			{Name: "o", From: "json:o", Type: TypeJSONB},
			{Name: "s", From: "json:s", Type: TypeText},
			{Name: "n", From: "json:n", Type: TypeNumeric},
		}
		r := rand.New(rand.NewPCG(7, 8))
		evs := make([]Event, 400)
		for i := range evs {
			var b strings.Builder
			b.WriteString(`{"o":`)
			randJSON(r, &b, 4)
			b.WriteString(`,"s":`)
			randString(r, &b)
			b.WriteString(`,"n":`)
			randNumber(r, &b)
			b.WriteString(`}`)
			evs[i] = Event{Data: []byte(b.String())}
		}
		createTable(t, ctx, conn, "random_json", cols)
		copyTuples(t, ctx, conn, "random_json", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT doc::text, o::text FROM random_json
			WHERE o IS DISTINCT FROM nullif(doc->'o', 'null'::jsonb) OR s IS DISTINCT FROM doc->>'s' OR n <> (doc->>'n')::numeric`)
		for _, b := range bad {
			t.Errorf("disagreement: doc %s, o %s", b[0], b[1])
		}
	})

	// The scanner's edges: what it accepts PostgreSQL's jsonb input must
	// accept, with the same value; what it refuses jsonb refuses too,
	// except nesting beyond 300, which the package documents.
	t.Run("scanner edges", func(t *testing.T) {
		cols := []Column{
			{Name: "seq", From: "meta:stream_seq", Type: TypeInt8},
			{Name: "raw", From: "payload", Type: TypeText},
			{Name: "doc", From: "payload", Type: TypeJSONB},
			{Name: "v", From: "json:v", Type: TypeJSONB},
			{Name: "vt", From: "json:v", Type: TypeText},
			{Name: "h", From: "header:H", Type: TypeJSONB},
		}
		deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
		good := []string{
			`{"v":"\ud83d\ude00 \uDBFF\uDFFF \uFFFE \u00e9 \u001f \/ \" \\ \b\f\n\r\t"}`,
			"{\"v\":\"\x7f \xef\xbf\xbf \xf4\x8f\xbf\xbf \xe2\x80\xa8 \u00a0\"}",
			"{\"v\":\"abcdefg\xc3\xa9\",\"w\":\"abcdefgh\\\\\"}",
			" \t\r\n{ \"v\" : [ -0 , 0.0 , 1E5 , 1e+5 , 1.0e0 , -1.5E-3 , 0e1000001 , 1e131071 , -1e-16383 ] } \n",
			`{"v":` + "1" + strings.Repeat("0", 70) + `.5}`,
			`{"v":0.` + strings.Repeat("0", 63) + `1}`,
			`{"v":` + deep(299) + `}`, // 300 deep with the object
			`{"v":{"":{"":""}},"\u0076x":1}`, `{"\u0076":"x\u00e9"}`,
			`{"v":1,"v":2}`, `{"v":{"a":1},"w":0,"\u0076":[2]}`, `{"\u0076":"x","v":null}`, `{"v":null,"v":"y"}`,
			`"v"`, `null`, `-0`, `[]`,
		}
		bad := []string{
			`{"v":"\u0000"}`, `{"\u0000":1}`, `{"\u0076":{"k\u0000ey":1}}`, `{"v":"\ud800"}`, `{"v":"\udc00\ud800"}`, `{"v":"\ud800\u0041"}`,
			`{"v":1e131072}`, `{"v":[1e-16384]}`, `{"v":0e1073741823}`,
			"{\"v\":\"\x01\"}", "{\"v\":\"\x01\\\\n\"}", "{\"v\":\"\xed\xa0\x80\"}", "{\"v\":\"\xc0\xaf\"}", "{\"v\":\"\xf4\x90\x80\x80\"}",
			"{\"v\":\"abcdefg\xc3\"}", "\"abcdefghijklmno\xe2\x82",
			`{"v":01}`, `{"v":1.}`, `{"v":.1}`, `{"v":+1}`, `{"v":1e}`, `{"v":NaN}`, `{"v":-Infinity}`,
			`{"v":"\x"}`, `{"v":"\U0041"}`, `{"v":1,}`, `[1,]`, `{"v":1}x`, "{\"v\":1}\f", "\xef\xbb\xbf{}", ``, ` `,
		}
		var evs []Event
		for i, p := range good {
			evs = append(evs, Event{StreamSeq: uint64(i), Data: []byte(p), Header: map[string][]string{"H": {p}}})
		}
		m := mustCompile(t, cols...)
		createTable(t, ctx, conn, "scanner_edges", cols)
		copyTuples(t, ctx, conn, "scanner_edges", cols, encodeAll(t, m, evs))
		diff := queryRows(t, ctx, conn, `SELECT seq::text, raw FROM scanner_edges WHERE doc IS DISTINCT FROM raw::jsonb
			OR h IS DISTINCT FROM raw::jsonb OR v IS DISTINCT FROM nullif(raw::jsonb->'v', 'null')
			OR (jsonb_typeof(raw::jsonb->'v') = 'string' AND vt IS DISTINCT FROM raw::jsonb->>'v')
			OR (jsonb_typeof(raw::jsonb->'v') IN ('object', 'array') AND vt::jsonb IS DISTINCT FROM raw::jsonb->'v')`)
		for _, d := range diff {
			t.Errorf("disagreement: event %s: %q", d[0], d[1])
		}
		for _, p := range append(bad, `{"v":`+deep(300)+`}`) {
			_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(p)})
			if err == nil {
				t.Errorf("%q: the encoder accepts it", p)
			}
			_, herr := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{}`), Header: map[string][]string{"H": {p}}})
			if herr == nil && !strings.Contains(p, deep(300)) {
				t.Errorf("%q: the encoder accepts it as a header value for jsonb", p)
			}
			_, pgErr := conn.Exec(ctx, "SELECT convert_from($1::bytea, 'UTF8')::jsonb", []byte(p))
			if pgErr == nil && !strings.Contains(p, deep(300)) {
				t.Errorf("%q: PostgreSQL accepts it, the encoder refuses it: %v", p, err)
			}
		}
	})

	// Duplicate keys: the last one wins, for the json: columns as in the
	// jsonb payload, at any depth; a later object replaces what an earlier
	// one held under it.
	t.Run("duplicate keys", func(t *testing.T) {
		cols := []Column{
			{Name: "doc", From: "payload", Type: TypeJSONB},
			{Name: "a", From: "json:o.a", Type: TypeInt8},
			{Name: "b", From: "json:o.b.c", Type: TypeText},
			{Name: "o", From: "json:o", Type: TypeJSONB},
		}
		docs := []string{
			`{"o":{"a":1,"b":{"c":"x"}},"o":{"a":2}}`,
			`{"o":{"a":1,"a":3,"b":{"c":"x","c":"y"}}}`,
			`{"o":{"b":{"c":"x"}},"o":{"b":{"c":"y"}},"\u006f":{"b":{"c":"z"},"a":4}}`,
			`{"o":{"a":5},"o":[1],"o":{"a":6,"b":null}}`,
			`{"o":{"a":7},"o":null}`,
		}
		evs := make([]Event, len(docs))
		for i, d := range docs {
			evs[i] = Event{Data: []byte(d)}
		}
		createTable(t, ctx, conn, "duplicate_keys", cols)
		copyTuples(t, ctx, conn, "duplicate_keys", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT doc::text, coalesce(a::text, 'NULL'), coalesce(b, 'NULL') FROM duplicate_keys
			WHERE a IS DISTINCT FROM (doc->'o'->>'a')::int8 OR b IS DISTINCT FROM doc->'o'->'b'->>'c'
			OR o IS DISTINCT FROM nullif(doc->'o', 'null'::jsonb)`)
		for _, b := range bad {
			t.Errorf("disagreement: doc %s, o.a %s, o.b.c %s", b[0], b[1], b[2])
		}
	})

	t.Run("numeric limits", func(t *testing.T) {
		cols := []Column{{Name: "src", From: "json:v", Type: TypeText}, {Name: "n", From: "json:v", Type: TypeNumeric}}
		nums := []string{"1e131071", "-9.99e131071", "1e-16383", "123456789e-16383", "1" + strings.Repeat("0", 4000) + "." + strings.Repeat("7", 16383)}
		evs := make([]Event, len(nums))
		for i, s := range nums {
			evs[i] = Event{Data: []byte(`{"v":` + s + `}`)}
		}
		createTable(t, ctx, conn, "numeric_limits", cols)
		copyTuples(t, ctx, conn, "numeric_limits", cols, encodeAll(t, mustCompile(t, cols...), evs))
		var bad int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM numeric_limits WHERE n <> src::numeric OR n::text <> src::numeric::text").Scan(&bad); err != nil || bad != 0 {
			t.Fatalf("%d disagreements (%v)", bad, err)
		}
		// jsonb stores its numbers as numeric: the same limits hold inside it.
		jcols := []Column{{Name: "j", From: "payload", Type: TypeJSONB}, {Name: "k", From: "json:a", Type: TypeJSONB}}
		createTable(t, ctx, conn, "jsonb_limits", jcols)
		copyTuples(t, ctx, conn, "jsonb_limits", jcols, encodeAll(t, mustCompile(t, jcols...),
			[]Event{{Data: []byte(`{"a":[1e131071,-1e-16383,"1e999999"]}`)},
				// numericFits takes these without measuring them: a mantissa
				// under 64 characters, an exponent of at most 4 digits
				{Data: []byte(`{"a":[-0.` + strings.Repeat("0", 59) + `1e-9999,` + strings.Repeat("9", 63) + `e+9999,-` + strings.Repeat("9", 30) + `.` + strings.Repeat("9", 31) + `E-9999]}`)}}))
		for _, s := range []string{"1e131072", "1e-16384"} {
			_, err := mustCompile(t, cols...).NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{"v":` + s + `}`)})
			if de, ok := err.(*DecodeError); !ok || de.Code != CodeOutOfRange {
				t.Errorf("%s: %v, want out_of_range", s, err)
			}
			if _, err := conn.Exec(ctx, "SELECT $1::numeric", s); err == nil {
				t.Errorf("%s: PostgreSQL accepts it, the encoder does not", s)
			}
		}
	})

	// bool from a string: the encoder takes exactly what PostgreSQL's bool
	// input takes, with the same value.
	t.Run("bool agrees with text input", func(t *testing.T) {
		m := mustCompile(t, Column{Name: "b", From: "header:B", Type: TypeBool})
		var inputs []string
		for _, w := range []string{"true", "false", "yes", "no", "on", "off", "1", "0", "truth", "nope", "onn", "10", "y", "n", "o", "of", "offf", "ye", "yess", "2", "tru e"} {
			for i := 0; i <= len(w); i++ {
				inputs = append(inputs, w[:i], strings.ToUpper(w[:i]), strings.ToUpper(w[:1])+w[min(1, i):i])
			}
		}
		inputs = append(inputs, " t", "t ", "\tyes\n", "\v0\f", "\r1", "\u00a0t", "t\x00", "+1", "00", " ", "tRuE", "FaLsE")
		for _, in := range inputs {
			tuple, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{}`), Header: map[string][]string{"B": {in}}})
			var pgVal *bool
			pgErr := conn.QueryRow(ctx, "SELECT $1::text::bool", in).Scan(&pgVal)
			switch {
			case err != nil && pgErr == nil:
				t.Errorf("%q: PostgreSQL reads %v, the encoder refuses it: %v", in, *pgVal, err)
			case err == nil && pgErr != nil:
				t.Errorf("%q: the encoder takes it, PostgreSQL refuses it: %v", in, pgErr)
			case err == nil && (tuple[len(tuple)-1] == 1) != *pgVal:
				t.Errorf("%q: the encoder writes %d, PostgreSQL reads %v", in, tuple[len(tuple)-1], *pgVal)
			}
		}
	})

	// Numbers in strings (a header, or a JSON string): the encoder takes
	// what PostgreSQL's text input for each number type takes, white space
	// and a '+' included, with the same value. NaN and Infinity, which
	// PostgreSQL reads, are refused on purpose (documented); PostgreSQL
	// 16's 1_000 and 0x1F are left out, as 15 refuses them.
	t.Run("number strings agree with text input", func(t *testing.T) {
		inputs := []string{"42", " 42", "42 ", "\t\n\v\f\r42\r\n", "+42", "-42", "+-42", "-+42", "+", "-", "", " ", "4 2",
			"+ 42", "- 42", "042", "-0", "+0", "1.5", ".5", "-.5", "+.5", "5.", "-5.", ".", "-.", "+.", "1.e3", ".5e1", "1e",
			"1e+", "e3", ".e3", "1.5e-3 ", " +1.5E+3", "1..5", "1.5.", "--1", "++1", "1-", "9223372036854775807",
			"+9223372036854775808", " -9223372036854775808 ", "32767", "+32768", "2147483648", "\u00a01", "1\u00a0", "\x001",
			// numeric_in reads the exponent with strtol, which skips white space and then a sign; float8in does not
			"1e 5", "1.50E\t-2", " 2e\n\v+3 ", "1e+ 5", "1e ", "1 e5", "1e 5.5", "1e \u00a05"}
		for _, typ := range []Type{TypeInt2, TypeInt4, TypeInt8, TypeFloat8, TypeNumeric} {
			cols := []Column{{Name: "src", From: "header:V", Type: TypeText}, {Name: "v", From: "header:V", Type: typ}}
			m := mustCompile(t, cols...)
			var tuples [][]byte
			for _, in := range inputs {
				in, _ = strconv.Unquote(`"` + in + `"`)
				tuple, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{}`), Header: map[string][]string{"V": {in}}})
				_, pgErr := conn.Exec(ctx, "SELECT $1::text::"+string(typ), in)
				switch {
				case err != nil && pgErr == nil:
					t.Errorf("%s %q: PostgreSQL reads it, the encoder refuses it: %v", typ, in, err)
				case err == nil && pgErr != nil:
					t.Errorf("%s %q: the encoder takes it, PostgreSQL refuses it: %v", typ, in, pgErr)
				case err == nil && !strings.ContainsRune(in, 0):
					tuples = append(tuples, tuple)
				}
			}
			table := "number_strings_" + string(typ)
			createTable(t, ctx, conn, table, cols)
			copyTuples(t, ctx, conn, table, cols, tuples)
			bad := queryRows(t, ctx, conn, fmt.Sprintf(`SELECT src, v::text, src::%[1]s::text FROM %[2]s
				WHERE v::text <> src::%[1]s::text`, typ, table))
			for _, b := range bad {
				t.Errorf("%s: disagreement: %v", typ, b)
			}
		}
	})

	// bytea from base64: every length of the last group (0, 1 and 2
	// padding bytes), every byte value, the same bytes PostgreSQL's own
	// decode(..., 'base64') reads from the text.
	t.Run("bytea agrees with decode", func(t *testing.T) {
		cols := []Column{{Name: "src", From: "json:v", Type: TypeText}, {Name: "b", From: "json:v", Type: TypeBytea}}
		r := rand.New(rand.NewPCG(5, 6))
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		raws := [][]byte{{}, {0}, {0xff}, {0, 0}, {0xff, 0xff}, all}
		for n := range 40 {
			raw := make([]byte, n)
			for i := range raw {
				raw[i] = byte(r.IntN(256))
			}
			raws = append(raws, raw)
		}
		evs := make([]Event, len(raws))
		for i, raw := range raws {
			evs[i] = Event{Data: []byte(`{"v":"` + base64.StdEncoding.EncodeToString(raw) + `"}`)}
		}
		createTable(t, ctx, conn, "bytea_b64", cols)
		copyTuples(t, ctx, conn, "bytea_b64", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT src, encode(b, 'hex') FROM bytea_b64 WHERE b IS DISTINCT FROM decode(src, 'base64')`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
	})

	t.Run("timestamps agree", func(t *testing.T) {
		cols := []Column{{Name: "src", From: "json:v", Type: TypeText}, {Name: "ts", From: "json:v", Type: TypeTimestamptz},
			{Name: "d", From: "json:d", Type: TypeDate}, {Name: "dsrc", From: "json:d", Type: TypeText}}
		r := rand.New(rand.NewPCG(3, 4))
		var evs []Event
		for _, s := range []string{"0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2000-01-01T00:00:00Z", "1999-12-31T23:59:59.999999-15:59",
			"2024-02-29T12:00:00.5+14:00", "1970-01-01T00:00:00.000001Z",
			// finer than microseconds, ties among them: PostgreSQL rounds in binary, ties to even
			"2026-01-01T00:00:00.0000005Z", "2026-01-01T00:00:00.0000015Z", "2026-01-01T00:00:00.0000025Z",
			"2026-01-01T00:00:00.1234565Z", "2026-01-01T00:00:00.12345650000000001Z", "2026-01-01T00:00:00.9999995Z",
			"2026-01-01T23:59:59.9999996+01:00", "9999-12-31T23:59:59.9999994Z", "2026-01-01T00:00:00.00000049999Z",
			// a leap second, and second 60 of any minute: the next minute's first
			"2016-12-31T23:59:60Z", "2026-01-01T12:30:60.5+01:00",
			// ISO 8601 forms beside RFC 3339: a space, no seconds, ±HH and ±HHMM offsets
			"2026-11-29 19:59:15Z", "2026-11-29 19:59:15.123+00", "2026-11-29T10:15Z", "2026-11-29t10:15+05:30",
			"2026-11-29T19:59:15-08", "2026-11-29T19:59:15.5+0530", "2016-12-31 23:59:60-0100", "0001-01-01 00:00-00",
			// local mean time: offsets with seconds
			"1850-01-01T00:00:00+00:19:32", "1850-01-01T00:00+00:19:32", "1905-06-01 12:00:00.5-05:53:28"} {
			evs = append(evs, Event{Data: []byte(`{"v":"` + s + `","d":"` + s[:10] + `"}`)})
		}
		for range 300 { // nanoseconds, and the ties at the seventh digit
			frac := r.Int64N(1e9)
			if r.IntN(2) == 0 {
				frac = frac/1000*1000 + 500
			}
			s := fmt.Sprintf("20%02d-06-15T12:34:56.%09dZ", r.IntN(100), frac)
			evs = append(evs, Event{Data: []byte(`{"v":"` + s + `","d":"` + s[:10] + `"}`)})
		}
		for i := range 600 {
			tm := time.Unix(r.Int64N(300e9)-62e9, r.Int64N(1e9)).In(time.FixedZone("", (r.IntN(48)-24)*1800))
			tm = tm.Truncate(time.Microsecond)
			s := tm.Format(time.RFC3339Nano)
			if i%2 == 1 { // the same instant in one of the other forms
				layout := []string{"2006-01-02 15:04:05.999999Z07:00", "2006-01-02T15:04:05.999999-0700", "2006-01-02 15:04:05-07",
					"2006-01-02T15:04Z07:00", "2006-01-02 15:04-0700"}[r.IntN(5)]
				if strings.Contains(layout, ":04Z") || strings.Contains(layout, ":04-") {
					tm = tm.Truncate(time.Minute)
				} else if strings.HasSuffix(layout, "-07") {
					tm = tm.Truncate(time.Second).In(time.FixedZone("", (r.IntN(30)-15)*3600))
				}
				s = tm.Format(layout)
			}
			evs = append(evs, Event{Data: []byte(`{"v":"` + s + `","d":"` + s[:10] + `"}`)})
		}
		createTable(t, ctx, conn, "stamps", cols)
		copyTuples(t, ctx, conn, "stamps", cols, encodeAll(t, mustCompile(t, cols...), evs))
		bad := queryRows(t, ctx, conn, `SELECT src, ts::text FROM stamps WHERE ts <> src::timestamptz OR d <> dsrc::date`)
		for _, b := range bad {
			t.Errorf("disagreement: %v", b)
		}
	})
}

// randJSON writes a random JSON value nested up to depth levels.
func randJSON(r *rand.Rand, b *strings.Builder, depth int) {
	k := r.IntN(7)
	if depth == 0 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		randString(r, b)
	case 1:
		randNumber(r, b)
	case 2:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	case 3, 4:
		randString(r, b)
	case 5:
		b.WriteString("[")
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteString(" , ")
			}
			randJSON(r, b, depth-1)
		}
		b.WriteString("]")
	default:
		b.WriteString("{")
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteString(",")
			}
			randString(r, b)
			b.WriteString(" :\t")
			randJSON(r, b, depth-1)
		}
		b.WriteString("}")
	}
}

// randString writes a JSON string with escapes and multi-byte characters.
func randString(r *rand.Rand, b *strings.Builder) {
	parts := []string{"a", "Z", "é", "日本", "😀", `\"`, `\\`, `\/`, `\n`, `\t`, `\b`, `\f`, `\r`, `\u00e9`, `\u0001`,
		`\u001F`, `\ud83d\ude00`, `\uFFFF`, " ", "\u2028", "~", "'"}
	b.WriteString(`"`)
	for range r.IntN(8) {
		b.WriteString(parts[r.IntN(len(parts))])
	}
	b.WriteString(`"`)
}

// randNumber writes a JSON number, sometimes with a fraction or exponent.
func randNumber(r *rand.Rand, b *strings.Builder) {
	if r.IntN(2) == 0 {
		b.WriteString("-")
	}
	if r.IntN(5) == 0 {
		b.WriteString("0")
	} else {
		b.WriteString(strconv.FormatUint(r.Uint64()>>r.IntN(64), 10))
	}
	if r.IntN(2) == 0 {
		b.WriteString("." + strconv.Itoa(r.IntN(1e6)))
	}
	if r.IntN(3) == 0 {
		b.WriteString([]string{"e", "E", "e+", "e-", "E-"}[r.IntN(5)] + strconv.Itoa(r.IntN(400)))
	}
}

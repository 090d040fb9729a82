// Package pipeline is jetsink's middle stage: it turns JetStream events into
// table rows already encoded in PostgreSQL's binary COPY tuple format, in
// parallel, so the sink only has to write bytes.
//
// # Data flow and goroutines
//
// The consumer pushes each Event into a ringq.Dispatch keyed by Key (a hash
// of the subject), so every subject lands on one worker and keeps its order.
// Pipeline.Run starts one worker goroutine per dispatch ring and waits for
// all of them before it returns; no goroutine outlives Run. Worker i is the
// only consumer of the dispatch's ring i and the only producer of the
// ringq.Merge's ring i, which it closes when it stops (whoever sends
// closes). RunHandoff does the same over any Handoff: RingHandoff is those
// rings, ChanHandoff buffered channels to measure them against (config key
// pipeline.handoff). A worker pops events in batches of 64, encodes each with its own
// Encoder, pushes the rows in one batch (or, before it waits for room for
// its dead letters, the rows decoded so far), and blocks when its
// output ring is full: back-pressure goes from the sink through the workers to the
// consumer. It stops when its input ring is closed and drained (Run then
// returns nil) or when ctx ends (Run returns ctx.Err()).
//
// An event that cannot become a row (invalid JSON, a required value
// missing, a value of the wrong type or out of range, NUL in text, a
// payload over max_event_bytes) is handed to the DeadLetterer with
// StageDecode and the DecodeError's code. An event the consumer marked
// Exhausted (delivered past nats.max_deliver) is not decoded at all: it is
// handed to the DeadLetterer with StageDeliver and CodeMaxDeliver
// (MaxDeliverDeadLetter); Causes, first on the dead-letter path, gives
// such a letter the cause of an earlier letter of the event that failed.
// The worker does not wait for the letter (a publish and its PubAck, a
// round trip or more): it hands it to one of its 16 lanes, goroutines
// chosen by the subject's key, so that one subject's letters are stored
// in order, and goes on with the next event; it waits only when its
// letters reach their limit (SetLetterLimit). The events waiting in the
// lanes get InProgress (SetHeartbeat). Run waits for the lanes. If the
// DeadLetterer fails it has nak'ed the event, so it is not lost; the lane
// logs a warning and goes on with the next letter. An event whose stream
// was re-created since it was taken cannot be nak'ed (the nak would land
// on the new stream's event with its sequence) and is delivered by
// nothing again: the consumer's DeadLetterer publishes its letter again
// until it is stored, holding the lane, and fails (FailedDeadLetter
// "stale") only when ctx, the hard stop, ends first, or at once when the
// letter is over the server's max_payload; then the event is lost, and
// the DeadLetterer logs it at Error. At a hard stop the letters still
// waiting in the lanes are not handed on: their events come back after
// ack_wait, but for stale ones, lost with their stream (logged at Error,
// with how many).
//
// A panic while an event is encoded (a bug of jetsink's that this event's
// bytes reach) is recovered for that event alone: the worker logs it at
// Error with the stack (at most once a second, counting the rest), starts
// over with a fresh Encoder, and dead-letters the event with StageDecode
// and CodeInternal, instead of ending the process, which the event, once
// redelivered, would end again until max_deliver. A panic anywhere else
// in a worker (its rings, the slabs, the DeadLetterer) is not recovered:
// it leaves state shared with other goroutines in an unknown state, and
// ends the process as Go does (exit status 2, the stack on stderr).
//
// Each Row.Tuple is a slice of its own that nothing rewrites while the row
// is held: tuples are carved out of 64 KiB slabs, and a slab is carved again
// only after its worker has filled it and every row carved from it has been
// given back with ReleaseRows. The sink keeps rows until their transaction
// commits and releases them once settled; a row that is never released is
// left to the garbage collector. Reusing slabs spares the collector a
// quarter of the bytes a drain allocates (BENCHMARKS.md, session 10). In
// race-detector builds a slab given back is overwritten with a pattern no
// tuple starts with, so that a tuple read after its release fails loudly.
//
// # Mapping
//
// Compile checks a column list once and returns an immutable Mapper. The
// hot call is Encoder.AppendTuple. It reads a JSON payload in one pass of
// its own scanner (scan.go), which validates the payload and records where
// the json: paths' values lie without building a tree; header values bound
// for jsonb go through the same scanner. fastjson only words some syntax
// errors of a refused text, and a refusal's reason names the byte offset
// and quotes none of the text (BENCHMARKS.md has the comparison). An Encoder allocates nothing
// per event once warm. Sources: "payload"; "meta:<field>" for stream,
// stream_seq, consumer_seq, subject, published_at, received_at, delivered
// and msg_id; "header:<Name>" (case-sensitive, first value, as
// nats.Header.Get); "json:<dotted.path>" (numeric keys index arrays) or an
// RFC 6901 JSON pointer "/a/b~1c" (also written "json:/a/b~1c"). In both,
// a key that Atoi reads as an index ("1", and unlike RFC 6901 also "01",
// "+1") indexes an array, as fastjson's Get does, and names an object's
// member as written; a negative key ("-1") only ever names a member, never
// an array element (PostgreSQL's #> counts it from the end). A missing value or JSON null is SQL
// NULL, or CodeRequiredMissing when the column is required. A header sent
// with an empty value is not missing: it is the empty string, which a
// typed column (uuid, the integers, timestamptz, ...) refuses as it
// refuses "" in JSON; meta:msg_id alone is NULL for an empty Nats-Msg-Id.
// meta:delivered may go to an int2 column, which refuses a delivery count
// above 32767 (possible only with max_deliver -1 or above 32767).
//
// When any column reads JSON, or the payload goes to a jsonb column, the
// whole payload must be valid UTF-8 and strict JSON (RFC 8259; no NaN, no
// raw control characters) without lone UTF-16 surrogate escapes, as
// PostgreSQL's jsonb input demands, and nested at most 300 deep, a value
// inside the innermost array or object counting as one level more
// (fastjson's count: a number inside 300 arrays is refused). One empty
// body is taken for JSON null: a NATS KV bucket's delete or purge marker,
// whose KV-Operation header (first value, exact name, as a header: column
// reads it) is DEL or PURGE. Its json: columns are NULL (a required one
// refuses it with CodeRequiredMissing, the reason naming the marker), a
// jsonb payload column is SQL NULL (not jsonb 'null'; raw mode's is
// required), and a text or bytea payload column stores the empty body as
// in any mapping. Any other empty body, such as nats.go's kv Put of an
// empty value (no header), is refused with CodeInvalidJSON. With
// duplicate keys the last one wins when a json: path is looked up, as in
// jsonb (and in JavaScript's JSON.parse and Go's encoding/json), so that a
// column never reads a member the payload stored beside it as jsonb
// dropped. Scalars are read as json_populate_record reads them, not as
// jsonb normalizes them: 1E2 and -0 into a text column stay 1E2 and -0,
// and a float column keeps -0 (jsonb holds 100 and 0). An object itself is written out with its members as they came,
// duplicates included; jsonb drops all but the last of them, but a text
// column keeps them: with {"a":{"b":1,"b":null}}, json:a stores
// {"b":1,"b":null} as text and {"b": null} as jsonb (json:a.b is NULL).
//
// Type rules, for a JSON value (headers and metadata strings follow the
// string rules):
//
//   - text: strings as they are; numbers and booleans as their JSON text;
//     objects and arrays as compact JSON, their strings' escapes decoded
//     but for those JSON needs, written as jsonb's output writes them (\",
//     \\, \b, \f, \n, \r, \t; \u00XX for the other control characters).
//     NUL and invalid UTF-8 are refused.
//   - uuid: the canonical 8-4-4-4-12 hex form, either case. Braces and the
//     32-digit form are refused.
//   - int2, int4, int8: JSON integers, or strings holding one ("42");
//     range-checked. A fraction or exponent (1.5, 1e3) is wrong_type.
//   - float4, float8: JSON numbers or strings holding one; NaN and
//     Infinity are refused, as are overflow and underflow to zero.
//   - numeric: JSON numbers or strings holding one, exact, with the
//     display scale the text shows (1.50 stays 1.50); PostgreSQL's limits
//     (131072 digits before the point, 16383 after) apply.
//   - A number in a string is read as PostgreSQL 15's text input for its
//     type reads it: white space around it and a leading '+' are skipped,
//     for float and numeric a point may have digits on one side only
//     (".5", "1."), and for numeric white space may follow the exponent's
//     e ("1e 5"). NaN, Infinity, hex and PostgreSQL 16's "1_000" are
//     refused with invalid_format.
//   - bool: true or false, or a string PostgreSQL's bool input reads:
//     "true", "false", "t", "yes", "on", "1", "off", "0", "True" (case and
//     surrounding white space do not matter, and any prefix of true, yes,
//     false and no counts). Numbers are refused.
//   - timestamptz: RFC 3339 strings (T or t, Z or ±hh:mm, any number of
//     fraction digits, where PostgreSQL's own text input stops at about
//     128, rounded to microseconds as PostgreSQL rounds that input: in
//     binary floating point, ties to even), and the ISO 8601 variants
//     common libraries write, read as PostgreSQL reads them: a space for
//     the T, no seconds ("10:15Z", as Java's OffsetDateTime writes second
//     0; then no fraction, which PostgreSQL would take for minutes and
//     seconds), offsets ±hh, ±hhmm and ±hh:mm:ss (local mean time before
//     ~1900, as Java's OffsetDateTime and Python's isoformat write it:
//     Amsterdam's +00:19:32), the zones UTC and GMT (any case), and
//     spaces before the zone ("2026-11-29 19:59:15 UTC" and "... +0000",
//     as Ruby's Time#to_s writes). A zone is required (without one
//     PostgreSQL would use its session's), and zones named otherwise
//     ("EST", "Europe/Paris") are refused: their meaning is the server's
//     setting. White space around the value is skipped, as PostgreSQL
//     skips it. Numbers are
//     refused: epoch seconds and milliseconds are too easy to confuse.
//     Second 60 (a leap second) is the next minute's first, as in
//     PostgreSQL. Four-digit years always lie inside PostgreSQL's range;
//     where PostgreSQL's text input is stricter, the RFC 3339 / ISO 8601
//     meaning is stored: year 0000 is 1 BC (PostgreSQL refuses year 0),
//     offsets up to ±23:59 are taken (PostgreSQL's stop at ±15:59), and
//     so is a fraction of a leap second at 23:59:60 local time, which
//     PostgreSQL refuses there (time_overflows) but not at another hour:
//     2016-12-31T23:59:60.5Z is 2017-01-01T00:00:00.5Z, as
//     2016-12-31T18:59:60.5-05:00 is in PostgreSQL too. Hour 24 with
//     nothing but zeros after it is the next day's midnight, as in ISO 8601
//     and PostgreSQL; "infinity" and "-infinity" (any case) are
//     PostgreSQL's infinite timestamps.
//     meta:published_at and meta:received_at are rounded to the nearest
//     microsecond (a half away from zero).
//   - date: "YYYY-MM-DD" (0000 is 1 BC, as above), "infinity" or
//     "-infinity"; also a date followed by a time of day and a zone as
//     timestamptz reads them, or no zone: the date is kept as written,
//     as PostgreSQL keeps it (2026-11-29T23:30:00-05:00 is 2026-11-29).
//   - jsonb: any JSON value, written compactly (the payload column keeps the
//     payload's bytes); \u0000 anywhere in it is refused with nul_in_text
//     (PostgreSQL refuses it with SQLSTATE 22P05), and a number beyond
//     numeric's range with out_of_range (PostgreSQL: SQLSTATE 22003). A
//     header value must be JSON as the payload must, nested at most 300
//     deep in arrays and objects, not counting a value inside the
//     innermost (a number inside 300 arrays is taken, as PostgreSQL takes
//     it).
//   - bytea: JSON strings in standard base64 (RFC 4648 section 4, "+/")
//     with padding, strictly: no line breaks or other white space, and the
//     unused bits of the last group zero ("QQ==" is "A"; "QR==" is
//     refused, where PostgreSQL's decode(..., 'base64') would read "A"),
//     else invalid_format. The payload and header values as their raw
//     bytes.
//
// # Concurrency
//
// Mapper, Key, PhysicalCores and Pipeline.Stats are safe for concurrent use.
// An Encoder belongs to one goroutine. Pipeline.Run or RunHandoff may be
// called once.
//
// # Errors
//
// Compile returns errors wrapping ErrInvalidMapping; Config.Validate and New
// return errors wrapping ErrInvalidConfig, naming the config key
// (pipeline.workers, pipeline.pin, pipeline.ring_size,
// pipeline.max_event_bytes, pipeline.handoff). AppendTuple returns a *DecodeError whose Code
// is one of the Code* constants.
//
// # Pinning
//
// Config.Pin "thread" locks each worker to an OS thread; "cpu" also binds
// that thread to one CPU of the process's affinity mask, round-robin. The
// default is "none"; BENCHMARKS.md has the measurements.
package pipeline

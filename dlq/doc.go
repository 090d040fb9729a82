// Package dlq reads jetsink's dead-letter stream and replays dead letters to
// the subjects they came from, once whatever refused them has been fixed.
//
// A dead letter (see consumer.DeadLetter) is the original body and headers
// plus Jetsink-* headers: Jetsink-Subject, Jetsink-Stream,
// Jetsink-Stream-Seq, Jetsink-Stage, Jetsink-Code, Jetsink-SQLState,
// Jetsink-Delivered, Jetsink-Reason, Jetsink-Msg-Id (the original
// Nats-Msg-Id), Jetsink-Consumer (the durable consumer that gave it up),
// and Jetsink-Omitted-Headers when the original had header names nats.go
// cannot write (left out of the letter, so not replayed).
//
// Replay walks the dead-letter stream in order, as jetstream's ordered
// consumer does (each fetch a new ephemeral consumer without acks, deleted
// after it) but under Replay's contexts, from the first sequence the Filter
// allows up to the stream's last sequence when Replay started, so that it
// ends even while new dead letters arrive. It stops at that sequence, at the
// first letter stored at or after Filter.Until (the stream stores its
// letters in time order), or as soon as the stream holds nothing more up
// to it, whether or not the last letter matches. A fetch that brings nothing while letters up to it remain is a
// stall, retried with longer waits and then reported as ErrStalled, never
// taken for the end.
//
// With Options.Subject it reads only that subject's messages of the stream
// (a dead-letter stream may hold the letters of several jetsinks); with
// Options.Consumer it leaves the letters another consumer wrote
// (Report.Others); Options.WrittenBy replays those of another consumer
// instead, such as the durable's old name after a rename. Either way it
// leaves the letters that name no consumer, which a jetsink from before
// Jetsink-Consumer wrote, perhaps another one reading the same stream
// (Report.Unnamed), unless Options.IncludeUnnamed. With
// Options.EventStream it leaves the letters of another stream's events
// too (jetsinks on two streams share the default dead-letter subject).
//
// For each dead letter the Filter matches it first checks, with
// Options.Consumer, that the durable consumer that reads the event stream
// is there and takes the letter's subject (ErrNoReader: the letter stays,
// and Replay goes on), and that Jetsink-Subject is a subject the event
// stream captures and no service's (ErrNoReader again: see target), and
// not one the stream's subject transform would change again: it is the
// subject as stored, after the transform (see readers.window). A letter
// whose event stream's config it cannot read (the server refuses the user
// STREAM.INFO on it, a timeout) is not re-published either (ErrPublish):
// the letter stays, and a refused lookup is not asked again. Nor is one
// whose event stream drops a subject's oldest message to store a new one
// (max_msgs_per_subject, unless with discard new and
// discard_new_per_subject), without Options.AllowMaxMsgsPerSubject
// (ErrNoReader): each replayed event would push out the oldest of its
// subject, perhaps one jetsink has not read yet (the event of the letter
// replayed just before), while the letters are deleted. Nor is one whose
// event stream, at its max_msgs or max_bytes with discard old, would drop
// a message its reader has not acked to store the event, without
// Options.AllowDiscardOld (ErrNoReader): the reader is Options.Consumer,
// or else the consumer the letters name if the stream has it, and the
// messages after its ack floor are the ones kept (all of them, without a
// reader). Under max_bytes the stream drops its oldest messages until it
// is under the limit again: Replay reads them one by one from the first
// (STREAM.MSG.GET, which the user needs then: refused, the letter stays,
// ErrPublish naming the subject to allow), as far as the letter needs,
// adding their stored sizes as the store counts them, and refuses the
// letter if that reaches past the floor, or past 256 messages read (see
// room); a replayed event
// counts as its subject, headers and body plus what the store adds (34
// bytes in a file store, 16 in memory), and, in a stream that sources
// others (where it arrives through the origin that captures its subject),
// plus an upper bound of the Nats-Stream-Source header the stream writes
// into its copy (the source's name, filter and transforms, the subject, a
// sequence of up to 20 digits: tens of bytes). Publishers fill the stream meanwhile:
// within 256 letters of its limit, the stream's state and the ack floor
// are read again before a letter is let through (else every 256 letters,
// or every second), so only a publisher that fills the stream between a
// reading and the publish (one letter's round trip near the limit, else
// up to a second or 256 letters) can still push out an unread event; a
// letter the last reading has no room for is refused on it, without
// reading again, for up to a second. A dry run checks the event stream
// too, counting the letters it would replay. Nor is a letter of a key-value bucket's event (its
// Jetsink-Subject under $KV., or a KV-Operation header) re-published, with
// or without options (ErrKeyValue, Report.KeyValue): it would be written
// into the bucket again, a delete or purge removing the key's current
// value, a put standing over a newer one; the letter stays, for whoever
// puts back by hand what the bucket should hold. Nor, for the same
// reason, is a letter of an object store's event (its Jetsink-Subject
// under $O.: an object's chunk, $O.<bucket>.C.<nuid>, or its meta,
// $O.<bucket>.M.<name>; ErrObjectStore, Report.ObjectStore): a chunk would
// be added to its object's data, which would then no longer match its
// digest, and a meta would stand over the object's newer one, bringing
// back a deleted object or an older version without its chunks, or
// deleting the object put since; the letter stays, for whoever puts the
// object again by hand. Report.Refusals lists the letters refused, store
// by store, with each Store's words (what a replay would do there, and
// the command that puts back by hand what it should hold), the ones its
// letters' errors use. An object store's messages carry no
// header of their own, so one stored under another subject (a source's
// subject transform) is not recognized. Then
// it publishes the original body to
// Jetsink-Subject with the original headers minus every Jetsink-* header
// and with the Nats-Msg-Id "<original msg id>:replay:<the dead letter's
// Nats-Msg-Id>" (Letter.ReplayMsgID): not the original id, which the event
// stream may still remember and would drop as a duplicate, but one that is
// the same for every replay of that dead letter, and for the two dead
// letters one event may have. It waits for the PubAck, checks that the stream that stored it is
// the Jetsink-Stream the event came from, and only then, unless
// Options.Keep is set, deletes the dead letter from the dead-letter stream,
// retrying a failed delete a few times with backoff.
//
// A re-publish that gets no answer (a timeout, a connection lost: the
// stream may have stored it and the answer was lost) is sent again with the
// same Nats-Msg-Id, while Options.LetterTimeout lasts and the attempt would
// end within the event stream's duplicate window (read from the stream) of
// the first: within it the stream acknowledges a copy it already holds as
// a duplicate, after it the stream would store the copy again.
//
// A re-publish the server refuses the connection's user answers nothing:
// it tells the connection (nats.ErrPermissionViolation), which Replay reads
// after the attempt's wait, and takes as a refusal. So is the creation of
// a consumer to read the dead-letter stream: Replay returns the refusal
// after the fetch's wait instead of taking the silence for a stall.
//
// A letter it cannot settle for sure (below) ends Replay, with
// ErrUnsettled: the letters after it would likely end the same way, and it
// can be replayed again at once, within the duplicate window. Not one that
// another stream stored (ErrWrongStream): its event is stored, and another
// run would store it again.
//
// An event is therefore never lost, but it can be stored twice: a failure
// before the PubAck leaves the dead letter in place, and when no answer came
// at all, or another stream stored the event (one the original may source
// or mirror), the event may be stored nonetheless (Report.Unsure names
// those); a failure to delete after the PubAck leaves both the event and its
// dead letter (Report.Undeleted names them), and so does Options.Keep, for
// every letter. Replaying such a letter again within the event stream's duplicate
// window (duplicate_window, 2 minutes by default) is dropped by JetStream as
// a duplicate; after the window, the event is stored again under a new
// stream sequence, and jetsink writes a second row, in exactly-once mode
// too, whose key is (stream, stream_seq). Delete such letters instead
// (nats stream rmm <dead-letter stream> <seq>), or replay them only within
// the window.
//
// Replay takes two contexts: ending intake stops it between letters, while
// the letter under way is re-published and deleted under hard with a
// timeout, so that a stop cannot fall between the PubAck and the delete;
// ending hard gives that letter up too, and ends any wait on NATS at once,
// whether the server answers or not.
//
// A message of the dead-letter stream without Jetsink-Subject or
// Jetsink-Stream is no dead letter: it is skipped and counted
// (Report.Skipped, Report.NotLetters), but for the subject delete markers
// the server itself stores in a stream with subject_delete_marker_ttl
// where a subject's last letter aged out (an empty body and a
// Nats-Marker-Reason header), counted apart (Report.Markers).
//
// DryRun lists what would be replayed and changes nothing.
//
// Replay is called by one goroutine and starts none that outlive it.
package dlq

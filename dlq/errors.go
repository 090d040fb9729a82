package dlq

import "errors"

// Sentinel errors. Replay wraps them with the dead-letter sequence and the
// underlying error.
var (
	// ErrInvalidOptions: the Options cannot be used (no stream, a bad
	// subject pattern, an empty or reversed range).
	ErrInvalidOptions = errors.New("dlq: invalid options")
	// ErrNotDeadLetter: a message of the dead-letter stream lacks the
	// Jetsink-Subject or Jetsink-Stream header, so there is nowhere to
	// replay it. Replay counts it as skipped and goes on.
	ErrNotDeadLetter = errors.New("dlq: not a jetsink dead letter")
	// ErrPublish: the re-publish was not acknowledged; the dead letter is
	// left in place. With Outcome.Unsure no answer came at all, and the
	// event may have been stored.
	ErrPublish = errors.New("dlq: re-publish failed")
	// ErrWrongStream: the re-published event was stored by another stream
	// than the one it came from (the subjects changed since, or the
	// original sources or mirrors that stream); the dead letter is left in
	// place, and Report.Unsure names it.
	ErrWrongStream = errors.New("dlq: re-published to another stream")
	// ErrDelete: the event was re-published but its dead letter could not
	// be deleted (Report.Undeleted lists it). A later replay of it is
	// de-duplicated only within the event stream's duplicate window; after
	// it, the event is stored twice.
	ErrDelete = errors.New("dlq: delete replayed dead letter failed")
	// ErrNoReader: the letter was not re-published, because the consumer
	// that reads its stream (Options.Consumer) is not there or does not
	// take its subject: stored, the event would wait where nothing reads
	// it, or, in a stream with interest retention, be dropped at once
	// although the stream acknowledges it. Replay wraps it too when the
	// event would not be stored as it was, or could be dropped before
	// jetsink reads it (Options.AllowMaxMsgsPerSubject), or would push
	// out one not read yet (Options.AllowDiscardOld), or the letter's
	// subject is not one to publish to. The dead letter stays.
	ErrNoReader = errors.New("dlq: nothing would read the replayed event")
	// ErrKeyValue: the letter's event is a key-value bucket's (its
	// subject is under $KV., or it carries the KV-Operation header), and
	// re-published it would be written into the bucket again: a delete
	// would remove the key's current value, a put stand over a newer one.
	// The letter stays (Report.KeyValue), and Replay goes on.
	ErrKeyValue = errors.New("dlq: a key-value bucket's event is not replayed")
	// ErrObjectStore: the letter's event is an object store's (its
	// subject is under $O.: an object's chunk, $O.<bucket>.C.<nuid>, or
	// its meta, $O.<bucket>.M.<name>), and re-published it would be
	// written into the store again: a chunk would be added to the
	// object's data, which would no longer match its digest, a meta would
	// stand over a newer one. The letter stays (Report.ObjectStore), and
	// Replay goes on.
	ErrObjectStore = errors.New("dlq: an object store's event is not replayed")
	// ErrUnsettled: Replay stopped after a letter it could not settle for
	// sure (Report.Unsure or Report.Undeleted names it), so that the ones
	// after it do not end the same way and the letter can be replayed
	// again at once, within the event stream's duplicate window.
	ErrUnsettled = errors.New("dlq: stopped after a dead letter left unsettled")
	// ErrStalled: the dead-letter stream still holds letters up to where
	// the replay ends, but several fetches in a row brought none; they stay
	// in place.
	ErrStalled = errors.New("dlq: reading the dead-letter stream stalled")
)

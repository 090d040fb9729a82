// Package config loads jetsink's configuration: a YAML file, overridden by
// JETSINK_* environment variables, overridden by command-line settings.
//
// Every key has a documented default (see Default and the README). Any key
// can be set from the environment by upper-casing its dotted path and
// replacing dots with underscores: nats.ack_wait is JETSINK_NATS_ACK_WAIT,
// postgres.batch.max_rows is JETSINK_POSTGRES_BATCH_MAX_ROWS. A few keys have
// shorter aliases (JETSINK_DATABASE_URL for postgres.url). List values take
// commas (JETSINK_NATS_SUBJECTS="a.>,b.>"); postgres.columns is file-only.
// Keys whose name ends in "bytes" take sizes such as 4MiB, 1.5KiB or 512KB
// (KB is 1000 bytes, KiB 1024) as well as plain integers; a fraction of a
// byte written in bytes (0.5), a size that rounds down to none (0.0001KiB)
// and one holding a comma (1,5MiB) are refused, and a larger unit's
// fraction of a byte is dropped (1.2GiB is 1288490188). Whole numbers, and sizes without a unit, are decimal wherever
// they are written: 010 is 10 (YAML 1.1 would read 8), and 0x10, 0o10 and
// 1_000 are refused. Durations are Go durations (20ms, 30s).
//
// Unknown keys are errors, so a typo never silently leaves a default in
// place. Validate checks every value and the rules that span sections; its
// errors wrap ErrInvalidConfig (or the section's own sentinel) and name the
// key and the fix. Nothing here logs, and no error contains a password:
// a value that YAML reads as syntax, not as the value (an alias *x of no
// anchor, a tag !x, a tag its value does not fit), is refused with its
// line and key, not its text, and so is nats.user or nats.password left
// empty by a one-word comment (#x) or an anchor (&x) where the value
// would be, or cut short by one: a plain value followed by a one-word
// comment (abc #def, of which YAML keeps abc), or an anchor that no alias
// in the file uses (&abc def, of which YAML keeps def). A comment with a
// space after its # (pw # rotated monthly) is a comment.
package config

package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts every environment variable jetsink reads.
const EnvPrefix = "JETSINK_"

// envAliases are short names for keys users set most.
var envAliases = map[string]string{
	"JETSINK_DATABASE_URL": "postgres.url",
}

// envIgnored are JETSINK_ variables that are not config keys.
var envIgnored = map[string]bool{
	"JETSINK_CONFIG":     true, // the config file path, read by the CLI
	"JETSINK_JAEGER_BIN": true, // the Jaeger binary of tools/jaeger and the tracing test (README)
}

// fileOnlyEnv returns the file-only key (postgres.columns) whose variable
// name is, "" if none.
func fileOnlyEnv(fileOnly map[string]reflect.Type, name string) string {
	for path := range fileOnly {
		if EnvName(path) == name {
			return path
		}
	}
	return ""
}

// kubernetesServiceVar reports whether name=value is one of the variables
// Kubernetes puts into every container for each Service of its namespace
// (enableServiceLinks, on by default): for a Service "jetsink" or
// "jetsink-metrics", JETSINK_SERVICE_HOST, JETSINK_METRICS_SERVICE_PORT,
// JETSINK_PORT=tcp://10.0.0.1:9464, JETSINK_PORT_9464_TCP_ADDR and so on.
// They are not settings, and taking them for misspelt ones would stop
// every pod of the namespace from starting once such a Service exists.
// No key's variable ends in _SERVICE_HOST, _SERVICE_PORT or _PORT.
func kubernetesServiceVar(name, value string) bool {
	if strings.HasSuffix(name, "_SERVICE_HOST") || strings.HasSuffix(name, "_SERVICE_PORT") || strings.Contains(name, "_SERVICE_PORT_") {
		return true
	}
	if strings.HasSuffix(name, "_PORT") && (strings.HasPrefix(value, "tcp://") || strings.HasPrefix(value, "udp://") || strings.HasPrefix(value, "sctp://")) {
		return true
	}
	// <NAME>_PORT_<port>_<PROTO>[_ADDR|_PORT|_PROTO]
	_, rest, ok := strings.Cut(name, "_PORT_")
	for ok {
		port, proto, _ := strings.Cut(rest, "_")
		proto, _, _ = strings.Cut(proto, "_")
		if port != "" && strings.Trim(port, "0123456789") == "" && (proto == "TCP" || proto == "UDP" || proto == "SCTP") {
			return true
		}
		_, rest, ok = strings.Cut(rest, "_PORT_")
	}
	return false
}

// Source says where to load from. Zero fields are skipped.
type Source struct {
	// File is the YAML file's path; "" loads defaults only.
	File string
	// FileFrom is what gave File, as errors name it: "--config" or
	// "JETSINK_CONFIG"; "" names it "config file".
	FileFrom string
	// Env is the environment as os.Environ returns it.
	Env []string
	// Flags are the values of a command's shortcut flags (--nats-url for
	// nats.url, ...), applied after the environment.
	Flags []Flag
	// Set holds "key=value" overrides (--set), applied last in order.
	Set []string
}

// Flag is a shortcut flag's value for a key: Name is the flag as typed
// ("--nats-url"), which errors name as where the value came from.
type Flag struct{ Name, Key, Value string }

// Load builds the configuration from defaults, the file, the environment
// and the overrides, in that order of precedence (later wins), and
// validates it. Errors wrap ErrInvalidConfig (or a section's sentinel) and
// name the key at fault; errors in a value also say where it came from:
// the file's line, the environment variable or --set. Every key at fault
// is reported, joined (Problems splits them): unknown keys, values of the
// wrong form ("four" for a number), unknown JETSINK_ variables, values
// validation refuses. An error the reading cannot go on past (YAML that
// does not parse, an alias that contains itself, a --set that is not
// key=value or names no key) ends it, after the problems found before it.
func Load(src Source) (Config, error) {
	cfg, _, err := LoadOrigins(src)
	return cfg, err
}

// LoadOrigins is Load that also says where each key src sets got its
// value: "line 4 of jetsink.yaml", the environment variable
// ("JETSINK_DATABASE_URL" for postgres.url, as set), the flag as typed
// ("--nats-url") or "--set". Keys left at their default are absent. Its
// errors are Load's.
func LoadOrigins(src Source) (Config, map[string]string, error) {
	var raw []byte
	if src.File != "" {
		b, err := os.ReadFile(src.File)
		if err != nil {
			from := "config file " + src.File
			switch src.FileFrom {
			case "":
			case "JETSINK_CONFIG":
				from = "JETSINK_CONFIG=" + src.File
			default:
				from = src.FileFrom + " " + src.File
			}
			if fi, serr := os.Stat(src.File); serr == nil && fi.IsDir() {
				return Config{}, nil, fmt.Errorf("%w: %s is a directory (Docker makes one when the file to mount does not exist: create the file first)", ErrInvalidConfig, from)
			}
			return Config{}, nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, from, err)
		}
		raw = b
	}
	cfg, where, err := parse(raw, src.Env, src.Flags, src.Set)
	if err != nil {
		return Config{}, nil, eachProblem(err, func(e error) error {
			if msg := e.Error(); src.File != "" && (strings.Contains(msg, "config: line ") || strings.Contains(msg, "yaml: line ")) {
				return fmt.Errorf("%w (in %s)", e, src.File)
			}
			return e
		})
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, nil, eachProblem(err, func(e error) error { return whence(e, where, src.File) })
	}
	origins := make(map[string]string, len(where))
	for path, o := range where {
		switch {
		case o == "":
		case strings.HasPrefix(o, "line ") && src.File != "":
			origins[path] = o + " of " + src.File
		default:
			origins[path] = o
		}
	}
	return cfg, origins, nil
}

// eachProblem is err with f applied to each of its problems (Problems).
func eachProblem(err error, f func(error) error) error {
	var errs []error
	for _, e := range Problems(err) {
		errs = append(errs, f(e))
	}
	return errors.Join(errs...)
}

// whence adds to a validation error where the value of a key it names
// came from: "(line 4 of jetsink.yaml)", "(JETSINK_POSTGRES_MODE)" or
// "(--set)", for the key named first among those whose origin is known,
// the longest at one place (postgres.columns[2] over postgres.columns).
// Keys left at their default have none: a message naming only those adds
// nothing. A key set in the file only (postgres.columns) has its key's
// line, and each entry of its list the entry's.
func whence(err error, where map[string]string, file string) error {
	msg := err.Error()
	first, long, from := len(msg), 0, ""
	for path, o := range where {
		if o == "" {
			continue
		}
		// A whole key: not postgres.url inside postgres.url_file.
		for i := 0; i <= first; {
			j := strings.Index(msg[i:], path)
			if j < 0 {
				break
			}
			j += i
			if j > first || j == first && len(path) <= long {
				break // an earlier key, or a longer one here, has it
			}
			end := j + len(path)
			if (j == 0 || !keyByte(msg[j-1])) && (end == len(msg) || !keyByte(msg[end])) {
				first, long, from = j, len(path), o
				break
			}
			i = end
		}
	}
	switch {
	case from == "":
		return err
	case strings.HasPrefix(from, "line ") && file != "":
		from += " of " + file
	}
	return fmt.Errorf("%w (%s)", err, from)
}

// keyByte reports whether c may be part of a key path.
func keyByte(c byte) bool {
	return c == '.' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// Parse is Load without validation and without the file system: raw is the
// YAML text. It is what Load and the fuzz test share.
func Parse(raw []byte, env, set []string) (Config, error) {
	cfg, _, err := parse(raw, env, nil, set)
	return cfg, err
}

// parse also returns where each key's value came from, as schema.at says
// it without its colon.
func parse(raw []byte, env []string, flags []Flag, set []string) (Config, map[string]string, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	if len(bytes.TrimSpace(raw)) > 0 {
		var doc yaml.Node
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) { // EOF: comments only
			return Config{}, nil, fmt.Errorf("%w: %w", ErrInvalidConfig, unknownAlias(raw, err))
		}
		// yaml.Unmarshal would read the first document and ignore the
		// rest, unchecked: settings after a --- line would silently
		// keep their defaults.
		for {
			var more yaml.Node
			err := dec.Decode(&more)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return Config{}, nil, fmt.Errorf("%w: %w", ErrInvalidConfig, unknownAlias(raw, err))
			}
			if !emptyDocument(&more) {
				return Config{}, nil, fmt.Errorf("%w: the config file holds more than one YAML document (a second at line %d, after a --- or ... line): jetsink reads one; merge them into one mapping",
					ErrInvalidConfig, more.Line)
			}
		}
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
			switch doc.Content[0].Kind {
			case yaml.MappingNode:
				root = doc.Content[0]
			case yaml.ScalarNode:
				if doc.Content[0].Tag != "!!null" {
					return Config{}, nil, fmt.Errorf("%w: the config file must be a YAML mapping of sections (nats:, pipeline:, postgres:, ...)", ErrInvalidConfig)
				}
			default:
				return Config{}, nil, fmt.Errorf("%w: the config file must be a YAML mapping of sections (nats:, pipeline:, postgres:, ...)", ErrInvalidConfig)
			}
		}
	}
	sc := newSchema()
	// Before the probe decode below, which would stop at the first with
	// yaml.v3's message, naming neither the key's path nor the problems
	// after it.
	duplicateKeys(root, "", &sc.problems)
	// The file's own aliases, before a variable or flag replaces a value
	// holding one: its anchor was still meant for reuse.
	sc.aliased = aliasTargets(root, map[*yaml.Node]bool{})
	// Environment, then flags: later overrides win.
	envKeys := make(map[string]string, len(sc.keys))
	for path := range sc.keys {
		envKeys[EnvName(path)] = path
	}
	for alias, path := range envAliases {
		envKeys[alias] = path
	}
	envValues := map[string]string{} // path -> the value a variable gave it
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || envIgnored[name] || strings.HasPrefix(name, "JETSINK_TEST_") {
			continue
		}
		path, ok := envKeys[name]
		if !ok {
			if kubernetesServiceVar(name, value) {
				continue
			}
			if fo := fileOnlyEnv(sc.fileOnly, name); fo != "" {
				sc.problems = append(sc.problems, fmt.Errorf("%w: environment variable %s: %s can only be set in the config file", ErrInvalidConfig, name, fo))
				continue
			}
			if sec := sc.sectionOfEnv(name); sec != "" {
				sc.problems = append(sc.problems, fmt.Errorf("%w: environment variable %s: %s is a section, not a key: set its keys, e.g. %s (`jetsink keys` lists them)",
					ErrInvalidConfig, name, sec, EnvName(sc.exampleKey(sec))))
				continue
			}
			sc.problems = append(sc.problems, fmt.Errorf("%w: environment variable %s is not a jetsink setting%s (a key's variable is JETSINK_ plus its dotted path in capitals with _ for dots, e.g. JETSINK_NATS_URL; `jetsink keys` lists them)",
				ErrInvalidConfig, name, suggestion("", name, slices.Collect(maps.Keys(envKeys)))))
			continue
		}
		if kind := sc.keys[path].Kind; value == "" && kind != reflect.String && kind != reflect.Slice {
			// Empty for a number, boolean or duration: unset, as a
			// compose file's ${VAR:-} leaves it. The file's value, else
			// the default, stays (replaced by "", YAML's null, it was
			// the default, whatever the file said).
			continue
		}
		if other, ok := sc.origin[path]; ok && envValues[path] != value {
			// An alias and the key's own variable: which one wins would
			// depend on the order of the environment.
			sc.problems = append(sc.problems, fmt.Errorf("%w: %s and %s both set %s, to different values: set one", ErrInvalidConfig, other, name, path))
			continue
		}
		sc.origin[path], envValues[path] = name, value
		if err := setPath(root, path, value, sc.keys[path].Kind); err != nil && !errors.Is(err, errNotSection) {
			return Config{}, nil, sc.fail(fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err))
		}
	}
	for _, f := range flags {
		k, ok := sc.keys[f.Key]
		if !ok {
			return Config{}, nil, sc.fail(fmt.Errorf("%w: %s sets %s, which is no key", ErrInvalidConfig, f.Name, f.Key))
		}
		sc.origin[f.Key] = f.Name
		if err := setPath(root, f.Key, f.Value, k.Kind); err != nil && !errors.Is(err, errNotSection) {
			return Config{}, nil, sc.fail(fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.Name, err))
		}
	}
	for _, kv := range set {
		path, value, ok := strings.Cut(kv, "=")
		if !ok {
			// Not quoted whole: it may be a key and its secret value
			// with another separator (postgres.url:postgres://u:pw@...).
			return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: want key=value, e.g. --set postgres.batch.max_rows=1000", ErrInvalidConfig, keyPart(kv)))
		}
		path = strings.TrimSpace(path)
		if kp := keyPart(path); kp != path {
			return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: not a key (a key is letters, digits, _ and dots; want key=value, e.g. --set postgres.batch.max_rows=1000)", ErrInvalidConfig, kp))
		}
		k, ok := sc.keys[path]
		if !ok {
			if _, ok := sc.fileOnly[path]; ok {
				return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: this key can only be set in the config file", ErrInvalidConfig, path))
			}
			if sc.sections[path] {
				return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: a section, not a key: set its keys, e.g. --set %s=VALUE (`jetsink keys` lists them)",
					ErrInvalidConfig, path, sc.exampleKey(path)))
			}
			parent, last := "", path
			if i := strings.LastIndexByte(path, '.'); i >= 0 {
				parent, last = path[:i], path[i+1:]
			}
			return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: no such key%s (`jetsink keys` lists them)", ErrInvalidConfig, path, sc.suggest(parent, last)))
		}
		sc.origin[path] = "--set"
		if err := setPath(root, path, value, k.Kind); err != nil && !errors.Is(err, errNotSection) {
			return Config{}, nil, sc.fail(fmt.Errorf("%w: --set %s: %w", ErrInvalidConfig, path, err))
		}
	}
	// Before the probe decode, which would stop at the first value that
	// its tag does not fit, with yaml.v3's message, which quotes it.
	badTags(root, "", &sc.problems)
	// Decoded once as plain YAML first: most aliases that contain
	// themselves or multiply without bound fail here, with yaml.v3's own
	// checks; the walks below guard against the rest (walkGuard).
	if err := root.Decode(new(any)); err != nil {
		return Config{}, nil, sc.fail(fmt.Errorf("%w: %s", ErrInvalidConfig, describeYAMLError(err)))
	}
	if err := sc.check(root, ""); err != nil {
		return Config{}, nil, sc.fail(err)
	}
	if len(sc.problems) > 0 {
		return Config{}, nil, errors.Join(sc.problems...)
	}
	// The checked tree is decoded as it is, not written out and read
	// again: its nodes keep the file's lines for the decoder's errors, and
	// aliases keep their anchors after a variable replaced an anchored
	// value. check has rejected unknown keys everywhere.
	cfg := Default()
	if err := root.Decode(&cfg); err != nil {
		return Config{}, nil, sc.fail(fmt.Errorf("%w: %s", ErrInvalidConfig, describeYAMLError(err)))
	}
	return cfg, sc.where, nil
}

// duplicateKeys notes each key that a mapping of the file sets twice,
// naming its path and both lines, and drops the second, so that the
// reading goes on to the file's other problems. Aliases are not followed:
// each mapping is visited once, where it is written. A key that a merge
// (<<) brings in and the mapping sets too is no duplicate: the mapping's
// own value wins, as YAML has it.
func duplicateKeys(n *yaml.Node, path string, problems *[]error) {
	switch n.Kind {
	case yaml.SequenceNode:
		for i, e := range n.Content {
			duplicateKeys(e, fmt.Sprintf("%s[%d]", path, i), problems)
		}
	case yaml.MappingNode:
		first := map[string]int{} // key -> its line
		kept := n.Content[:0]
		for j := 0; j+1 < len(n.Content); j += 2 {
			kn, val := n.Content[j], n.Content[j+1]
			if kn.ShortTag() == "!!merge" {
				for _, m := range merge(val) {
					duplicateKeys(m, path, problems)
				}
				kept = append(kept, kn, val)
				continue
			}
			p := kn.Value
			if path != "" {
				p = path + "." + kn.Value
			}
			if kn.Kind == yaml.ScalarNode {
				if line, ok := first[kn.Value]; ok {
					*problems = append(*problems, fmt.Errorf("%w: line %d: %s: already set at line %d; set it once", ErrInvalidConfig, kn.Line, p, line))
					continue
				}
				first[kn.Value] = kn.Line
			}
			duplicateKeys(val, p, problems)
			kept = append(kept, kn, val)
		}
		clear(n.Content[len(kept):])
		n.Content = kept
	}
}

// merge is the mappings written in a merge key's value, which is one or a
// list of them (aliases among them are visited where their anchors are).
func merge(val *yaml.Node) []*yaml.Node {
	if val.Kind == yaml.SequenceNode {
		return val.Content
	}
	return []*yaml.Node{val}
}

// describeYAMLError keeps yaml's message (it names the line and the field)
// but drops its multi-line framing, and the value it quotes (`...`, or
// its first 7 bytes), which may be a password: the line names it.
func describeYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return yamlQuoted.ReplaceAllString(strings.Join(te.Errors, "; "), "")
	}
	return yamlQuoted.ReplaceAllString(err.Error(), "")
}

// yamlQuoted is a value as yaml.v3's messages quote it: " `x`".
var yamlQuoted = regexp.MustCompile(" `[^`]*`")

// quoteHint ends the errors about a value that YAML read as syntax.
const quoteHint = "put a value beginning with #, !, &, * or % in quotes"

// unknownAlias is err, an error of yaml.v3's parser, or, when it is about
// an alias (*name) of an anchor (&name) that no value sets before it, one
// that names its line and key and says to quote the value, without the
// name: it is most often a generated password or token that begins with
// *, written without quotes (password: *Xy9abc), and yaml.v3's message
// ("unknown anchor 'Xy9abc' referenced") quotes it, without a line, on
// stderr and into every log that keeps it. yaml.v3 has no type for this
// error: its message is the only sign of it.
func unknownAlias(raw []byte, err error) error {
	const pre, post = "yaml: unknown anchor '", "' referenced"
	msg := err.Error()
	if !strings.HasPrefix(msg, pre) || !strings.HasSuffix(msg, post) || len(msg) <= len(pre)+len(post) {
		return err
	}
	name := msg[len(pre) : len(msg)-len(post)]
	const what = "YAML reads a value beginning with * as an alias of an anchor (&) set before it, and no anchor of this one's name is set: "
	line, path := aliasAt(raw, name)
	switch {
	case line == 0:
		return errors.New("the config file has " + what + quoteHint)
	case path == "":
		return fmt.Errorf("line %d: %s%s", line, what, quoteHint)
	}
	key := path[strings.LastIndexByte(path, '.')+1:]
	return fmt.Errorf("line %d: %s: %s%s (%s: \"*...\")", line, path, what, quoteHint, key)
}

// aliasAt finds the first alias of anchor name in raw, the YAML text: a *
// then the name, where a value may begin (after a key's colon, a list's
// dash, a bracket, a brace or a comma, or at the start of a line), not in
// a comment. It returns its line (0 if none is found) and the dotted path
// of the block mapping's key whose value it is, as far as indentation
// tells it ("" if it does not: a list's entry, a flow mapping's value, a
// list on the way).
func aliasAt(raw []byte, name string) (line int, path string) {
	lines := strings.Split(string(raw), "\n")
	for i, l := range lines {
		if c := commentAt(l); c >= 0 {
			l = l[:c]
		}
		for j := 0; ; {
			k := strings.Index(l[j:], "*"+name)
			if k < 0 {
				break
			}
			k += j
			j = k + 1
			end := k + 1 + len(name)
			if end < len(l) && anchorByte(l[end]) {
				continue // a longer name
			}
			before := strings.TrimRight(l[:k], " \t")
			if before != "" && !strings.ContainsRune(":-[{,?", rune(before[len(before)-1])) {
				continue
			}
			if m := blockKey.FindString(l); m == "" || strings.TrimRight(m, " \t") != before {
				return i + 1, "" // not a block mapping's value (a list's entry, a flow mapping's)
			}
			return i + 1, blockPath(lines[:i+1])
		}
	}
	return 0, ""
}

// anchorByte reports whether c may be part of an anchor's name, as
// yaml.v3 scans one.
func anchorByte(c byte) bool {
	return c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// commentAt is the index of the # that begins a comment in the line l, -1
// if none: one at its start or after a space or tab, outside quotes.
func commentAt(l string) int {
	var quote byte
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return i
		}
	}
	return -1
}

// blockKey matches a line of a block mapping's key, and its value if any:
// indentation, the key, a colon.
var blockKey = regexp.MustCompile(`^( *)([A-Za-z0-9_]+):(?:[ \t]|$)`)

// blockPath is the dotted path of the key on the last of lines, by the
// keys above it with less indentation, when every one of them is a block
// mapping's key alone on its line (a section); "" when the last line is
// no key's, or a line on the way is something else (a list's entry).
func blockPath(lines []string) string {
	m := blockKey.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		return ""
	}
	path, indent := m[2], len(m[1])
	for i := len(lines) - 2; i >= 0 && indent > 0; i-- {
		l := lines[i]
		if c := commentAt(l); c >= 0 {
			l = l[:c]
		}
		t := strings.TrimLeft(l, " ")
		if strings.TrimSpace(t) == "" || len(l)-len(t) >= indent {
			continue
		}
		m := blockKey.FindStringSubmatch(l)
		if m == nil || strings.TrimSpace(l[len(m[0]):]) != "" {
			return ""
		}
		path, indent = m[2]+"."+path, len(m[1])
	}
	if indent > 0 {
		return ""
	}
	return path
}

// badTags notes each value in n, at path, whose tag YAML cannot read it
// as (password: !!int x) and each with a tag of its own (!abc), which
// YAML drops: jetsink knows none, and a password beginning with ! loses
// it so (!abc is then the empty string, !abc def is def). It names the
// line and the key, not the value, which may be a password, nor a tag of
// one's own, which may be its start, and makes the value null, so that
// the decoders do not quote it and the default stays. Aliases are not
// followed: each value is visited once, where it is written.
func badTags(n *yaml.Node, path string, problems *[]error) {
	switch n.Kind {
	case yaml.SequenceNode:
		for i, e := range n.Content {
			badTags(e, fmt.Sprintf("%s[%d]", path, i), problems)
		}
	case yaml.MappingNode:
		for j := 0; j+1 < len(n.Content); j += 2 {
			kn, val := n.Content[j], n.Content[j+1]
			p := path
			if kn.ShortTag() != "!!merge" {
				if p != "" {
					p += "."
				}
				p += kn.Value
			}
			badTags(kn, p, problems)
			badTags(val, p, problems)
		}
	case yaml.ScalarNode:
		if n.Style&yaml.TaggedStyle == 0 {
			return
		}
		var why string
		switch tag := n.ShortTag(); tag {
		case "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!binary":
			if n.Decode(new(any)) == nil {
				return
			}
			why = "the value does not read as the " + tag + " its tag asks for: drop the tag, or, if it is part of the value, " + quoteHint
		case "!!seq", "!!map", "!!merge":
			why = "the tag " + tag + " does not fit a single value: drop it, or, if it is part of the value, " + quoteHint
		default: // named not even in part: it may be a password's start
			why = "a value beginning with ! is a tag to YAML, which jetsink does not read, and the value would be read without it: " + quoteHint
		}
		if path == "" {
			*problems = append(*problems, fmt.Errorf("%w: line %d: %s", ErrInvalidConfig, n.Line, why))
		} else {
			*problems = append(*problems, fmt.Errorf("%w: line %d: %s: %s", ErrInvalidConfig, n.Line, path, why))
		}
		n.Tag, n.Value, n.Style = "!!null", "", 0
	}
}

// credentialKeys are the keys that hold a credential of their own: a
// value that YAML took for syntax and left empty (swallowedCredential)
// would otherwise show only as the server refusing jetsink.
var credentialKeys = map[string]bool{"nats.user": true, "nats.password": true}

// swallowedCredential says why the null value raw of kn, a key at path,
// is a credential that YAML read as syntax, "" if it is not one or not
// so: an anchor with nothing after it (password: &Xy9) or a comment of one
// word right after the key (password: #Xy9; a comment such as "# set by
// JETSINK_NATS_PASSWORD" keeps the default, empty, as any null does).
func swallowedCredential(path string, kn, raw *yaml.Node) string {
	if !credentialKeys[path] {
		return ""
	}
	key := kn.Value
	switch c := kn.LineComment + raw.LineComment; {
	case raw.Kind == yaml.ScalarNode && raw.Anchor != "":
		return fmt.Sprintf("a value beginning with & is an anchor's name to YAML, and the key is left empty: %s (%s: \"&...\"), or write %s: \"\" for none", quoteHint, key, key)
	case oneWordComment(c):
		return fmt.Sprintf("a value beginning with # is a comment to YAML, and the key is left empty: %s (%s: \"#...\"), or write %s: \"\" for none", quoteHint, key, key)
	}
	return ""
}

// cutCredential says why raw, the value of kn, a key at path, is a
// credential that YAML read in part as syntax, "" if it is not one or not
// so: a plain (unquoted) value followed by a comment of one word
// (password: abc #def, of which YAML keeps abc; a tab before the # counts
// as a space), or one after an anchor that no alias in the file uses
// (password: &abc def, of which YAML keeps def). aliased holds the nodes
// the file's aliases name: an anchor one of them uses is YAML's reuse,
// kept. A comment with a space after its # (pw # rotated monthly) is a
// comment. Neither the value, the comment nor the anchor's name is said.
func cutCredential(path string, kn, raw *yaml.Node, aliased map[*yaml.Node]bool) string {
	if !credentialKeys[path] || raw.Kind != yaml.ScalarNode {
		return "" // an alias (*x) names a whole value
	}
	key := kn.Value
	switch {
	case raw.Anchor != "" && !aliased[raw]:
		return fmt.Sprintf("a value beginning with & is an anchor's name to YAML, which no alias (*) in the file uses, and the key keeps only what follows it: %s (%s: \"&...\")", quoteHint, key)
	case raw.Style&^yaml.TaggedStyle == 0 && oneWordComment(raw.LineComment):
		return fmt.Sprintf("a # after a space or a tab begins a comment to YAML, and a comment of one word right after the value cuts it short there: %s, and one holding a # after a space or a tab too (%s: \"... #...\"); a comment with a space after its # (# like this) is read as one", quoteHint, key)
	}
	return ""
}

// oneWordComment reports whether c, a line comment as yaml.v3 keeps it,
// is a # and one word right after it (#Xy9): most likely the rest of a
// value that YAML took for a comment, where "# set by ..." reads as one.
func oneWordComment(c string) bool {
	return len(c) > 1 && c[0] == '#' && c[1] != '#' && !strings.ContainsAny(c, " \t")
}

// aliasTargets is the set of the nodes that the aliases in n name. Aliases
// are not followed: each node is visited once, where it is written.
func aliasTargets(n *yaml.Node, targets map[*yaml.Node]bool) map[*yaml.Node]bool {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		targets[n.Alias] = true
	}
	for _, c := range n.Content {
		aliasTargets(c, targets)
	}
	return targets
}

// listItems reads a list key's value from a variable or flag: items
// separated by commas (a.>, b.>), or the file's flow form ([a.>, "b.>"]).
// An item that starts or ends with a bracket or a quote is refused: it
// would be kept in the value (a subject "[a.>" captures nothing sent to
// a.>).
func listItems(value string) ([]string, error) {
	var items []string
	if t := strings.TrimSpace(value); strings.HasPrefix(t, "[") {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(t), &n); err != nil || len(n.Content) != 1 || n.Content[0].Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%q is not a list: give items separated by commas (a.>,b.>) or a YAML flow list ([a.>, b.>])", value)
		}
		for _, item := range n.Content[0].Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("%q: a list of plain items, not of lists or mappings", value)
			}
			items = append(items, item.Value)
		}
	} else {
		items = strings.Split(value, ",")
	}
	out := items[:0]
	for _, item := range items {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		if strings.ContainsAny(item[:1], `[]"'`) || strings.ContainsAny(item[len(item)-1:], `[]"'`) {
			return nil, fmt.Errorf("list item %q: quotes and brackets would stay in the value; give items separated by commas (a.>,b.>) or a YAML flow list ([a.>, b.>])", item)
		}
		out = append(out, item)
	}
	return out, nil
}

// errNotSection is setPath's error for a path through a value of the file
// that is no mapping (nats: foo): the value is left as it is, for check to
// report with its line, beside the file's other problems.
var errNotSection = errors.New("not a section")

// setPath sets the scalar (or, for lists, sequence) at a dotted path,
// creating mappings on the way. It returns errNotSection, setting nothing,
// when a section on the way holds a single value or a list.
func setPath(root *yaml.Node, path, value string, kind reflect.Kind) error {
	parts := strings.Split(path, ".")
	node := root
	for i, part := range parts {
		at := -1 // index of the value in node.Content
		for j := 0; j+1 < len(node.Content); j += 2 {
			if node.Content[j].Value == part {
				at = j + 1
				break
			}
		}
		if at < 0 {
			node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: part}, &yaml.Node{Kind: yaml.MappingNode})
			at = len(node.Content) - 1
		}
		// Values are replaced, never written through: the file's node may
		// be an anchor that aliases elsewhere still name.
		if i == len(parts)-1 {
			v := &yaml.Node{Kind: yaml.ScalarNode, Value: value}
			switch kind {
			case reflect.Slice:
				items, err := listItems(value)
				if err != nil {
					return err
				}
				v = &yaml.Node{Kind: yaml.SequenceNode}
				for _, item := range items {
					v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: item, Tag: "!!str"})
				}
			case reflect.String:
				v.Tag = "!!str" // "on", "null", "0755" stay strings
			}
			node.Content[at] = v
			return nil
		}
		child := deref(node.Content[at])
		switch {
		case child.Kind == yaml.ScalarNode && child.ShortTag() == "!!null":
			child = &yaml.Node{Kind: yaml.MappingNode} // "postgres:" with every key commented out
		case child.Kind == yaml.MappingNode:
			cp := *child // a copy to add to: the section may be an anchor, or an alias of one
			cp.Anchor, cp.Content = "", slices.Clone(child.Content)
			child = &cp
		default:
			return fmt.Errorf("%s: %w", strings.Join(parts[:i+1], "."), errNotSection)
		}
		node.Content[at] = child
		node = child
	}
	return nil
}

// schema is what parse knows of the keys, to check the merged tree and
// name the key, and where its value came from, in every error (the
// decoder names Go types and fields, not keys, and knows nothing of
// variables and flags).
type schema struct {
	guard    walkGuard
	keys     map[string]Key
	sections map[string]bool         // paths that hold keys (nats, postgres.batch, ...)
	fileOnly map[string]reflect.Type // keys only the file sets (postgres.columns), and their types
	origin   map[string]string       // key path -> the variable or flag that set it last
	where    map[string]string       // key path -> where its value came from ("line 4", "JETSINK_X", "--set"), for the keys set
	problems []error                 // the keys check refused, in the order met
	aliased  map[*yaml.Node]bool     // the nodes the file's aliases name (aliasTargets), for cutCredential
}

func newSchema() *schema {
	sc := &schema{keys: map[string]Key{}, sections: map[string]bool{}, fileOnly: map[string]reflect.Type{}, origin: map[string]string{}, where: map[string]string{}}
	var keys []Key
	walkKeys(reflect.TypeOf(Config{}), "", &keys, sc.fileOnly)
	for _, k := range keys {
		sc.keys[k.Path] = k
	}
	for _, paths := range []iter.Seq[string]{maps.Keys(sc.keys), maps.Keys(sc.fileOnly)} {
		for p := range paths {
			for i := strings.LastIndexByte(p, '.'); i > 0; i = strings.LastIndexByte(p[:i], '.') {
				sc.sections[p[:i]] = true
			}
		}
	}
	return sc
}

// at says where path's value came from: "JETSINK_X: ", "--set ", or
// "line N: " for the file: the line of a single value or of the alias
// that names it, else the key's (a block's first line is its first
// child's). raw is the value before aliases are followed.
func (sc *schema) at(path string, key, raw *yaml.Node) string {
	switch o := sc.origin[path]; {
	case o == "--set":
		return "--set "
	case o != "":
		return o + ": "
	}
	line := key.Line
	if (raw.Kind == yaml.ScalarNode || raw.Kind == yaml.AliasNode) && raw.Line > 0 {
		line = raw.Line
	}
	if line > 0 {
		return fmt.Sprintf("line %d: ", line)
	}
	return ""
}

// whereOf is at's answer ("line 4: ", "JETSINK_X: ", "--set ") as where
// keeps it: "line 4", "JETSINK_X", "--set".
func whereOf(at string) string { return strings.TrimSuffix(strings.TrimSuffix(at, ": "), " ") }

// check walks a mapping of the merged tree: every key must exist, a
// section must hold a mapping, a list key a list of single values and any
// other key a single value, which scalar checks and normalizes. A key with
// a null value (nothing after it) is removed, so that it keeps its
// default. sc.guard stops aliases that contain themselves or multiply
// without bound.
func (sc *schema) check(node *yaml.Node, prefix string) error {
	if err := sc.guard.enter(node); err != nil {
		return err
	}
	defer sc.guard.leave(node)
	// A key's problem is noted, its pair dropped, and the walk goes on, so
	// that one attempt reports every key at fault; only walkGuard's
	// errors end it.
	refuse := func(err error) error {
		if errors.Is(err, errAliasWalk) {
			return err
		}
		sc.problems = append(sc.problems, err)
		return nil
	}
	kept := node.Content[:0] // pairs are kept in place; kept never passes the pair being read
	for j := 0; j+1 < len(node.Content); j += 2 {
		kn, raw := node.Content[j], node.Content[j+1]
		val := deref(raw)
		if kn.ShortTag() == "!!merge" { // <<: *anchor
			if err := merged(val, prefix, sc.check); err != nil {
				return err
			}
			kept = append(kept, kn, raw)
			continue
		}
		path := kn.Value
		if prefix != "" {
			path = prefix + "." + kn.Value
		}
		if strings.Contains(kn.Value, ".") { // only the file can have one: setPath splits paths
			if err := refuse(fmt.Errorf("%w: line %d: %s: a key in the file is one name; nest each part under the one before", ErrInvalidConfig, kn.Line, path)); err != nil {
				return err
			}
			continue
		}
		k, isKey := sc.keys[path]
		t, isFileOnly := sc.fileOnly[path]
		if !isKey && !isFileOnly && !sc.sections[path] {
			if err := refuse(fmt.Errorf("%w: %s%s: no such key%s", ErrInvalidConfig, sc.at(path, kn, kn), path, sc.suggest(prefix, kn.Value))); err != nil {
				return err
			}
			continue
		}
		if val.Kind == yaml.ScalarNode && val.ShortTag() == "!!null" {
			if what := swallowedCredential(path, kn, raw); what != "" {
				if err := refuse(fmt.Errorf("%w: line %d: %s: %s", ErrInvalidConfig, kn.Line, path, what)); err != nil {
					return err
				}
			}
			continue // dropped: the default stays (aliases still reach an anchored null)
		}
		if what := cutCredential(path, kn, raw, sc.aliased); what != "" {
			if err := refuse(fmt.Errorf("%w: line %d: %s: %s", ErrInvalidConfig, raw.Line, path, what)); err != nil {
				return err
			}
			continue
		}
		switch {
		case isFileOnly:
			// The key's line (its value is a block), and each entry's
			// of a list, for validation's problems (whence).
			sc.where[path] = whereOf(sc.at(path, kn, kn))
			if val.Kind == yaml.SequenceNode {
				for i, e := range val.Content {
					sc.where[fmt.Sprintf("%s[%d]", path, i)] = fmt.Sprintf("line %d", e.Line)
				}
			}
			problems, err := checkFileOnly(&sc.guard, val, path, t)
			sc.problems = append(sc.problems, problems...)
			if err != nil {
				return err
			}
			if len(problems) > 0 {
				continue
			}
		case sc.sections[path]:
			if val.Kind != yaml.MappingNode {
				if err := refuse(fmt.Errorf("%w: %s%s is a section: write its keys under it", ErrInvalidConfig, sc.at(path, kn, raw), path)); err != nil {
					return err
				}
				continue
			}
			if err := sc.check(val, path); err != nil {
				return err
			}
		case k.Kind == reflect.Slice:
			if val.Kind != yaml.SequenceNode {
				if err := refuse(fmt.Errorf("%w: %s%s takes a list, e.g. [a, b]", ErrInvalidConfig, sc.at(path, kn, raw), path)); err != nil {
					return err
				}
				continue
			}
			if i := slices.IndexFunc(val.Content, func(item *yaml.Node) bool { return deref(item).Kind != yaml.ScalarNode }); i >= 0 {
				if err := refuse(fmt.Errorf("%w: %s%s takes a list of single values, e.g. [a, b]", ErrInvalidConfig, sc.at(path, kn, val.Content[i]), path)); err != nil {
					return err
				}
				continue
			}
			// The key's line (or variable): an empty list has no entry
			// to name, and a rule about the list must not be traced to a
			// key that the same message names after it. From the file,
			// each entry's line too, for a rule about one entry
			// (nats.subjects[1]).
			sc.where[path] = whereOf(sc.at(path, kn, raw))
			if sc.origin[path] == "" {
				for i, e := range val.Content {
					sc.where[fmt.Sprintf("%s[%d]", path, i)] = fmt.Sprintf("line %d", e.Line)
				}
			}
		case val.Kind != yaml.ScalarNode:
			if err := refuse(fmt.Errorf("%w: %s%s takes a single value (%s), not a list or a section", ErrInvalidConfig, sc.at(path, kn, raw), path, k.Type)); err != nil {
				return err
			}
			continue
		default:
			var err error
			if raw, err = sc.scalar(path, k, kn, raw); err != nil {
				if err := refuse(err); err != nil {
					return err
				}
				continue
			}
		}
		kept = append(kept, kn, raw)
	}
	clear(node.Content[len(kept):])
	node.Content = kept
	return nil
}

// fail is err, after the problems noted so far: an error that ends the
// reading does not hide them.
func (sc *schema) fail(err error) error {
	return errors.Join(append(sc.problems, err)...)
}

// exampleKey is the first key under section, in the order Keys lists
// them.
func (sc *schema) exampleKey(section string) string {
	for _, k := range Keys() {
		if strings.HasPrefix(k.Path, section+".") {
			return k.Path
		}
	}
	return section
}

// sectionOfEnv is the section whose variable name would be, "" if none.
func (sc *schema) sectionOfEnv(name string) string {
	for sec := range sc.sections {
		if EnvName(sec) == name {
			return sec
		}
	}
	return ""
}

// suggest returns " (did you mean X?)" for the key or section under prefix
// whose last element is nearest to name, if it is near enough to be a typo.
func (sc *schema) suggest(prefix, name string) string {
	var siblings []string
	for _, paths := range []iter.Seq[string]{maps.Keys(sc.keys), maps.Keys(sc.sections), maps.Keys(sc.fileOnly)} {
		for p := range paths {
			parent, last := "", p
			if i := strings.LastIndexByte(p, '.'); i >= 0 {
				parent, last = p[:i], p[i+1:]
			}
			if parent == prefix {
				siblings = append(siblings, last)
			}
		}
	}
	if prefix != "" {
		prefix += "."
	}
	return suggestion(prefix, name, siblings)
}

// suggestion returns " (did you mean <prefix><c>?)" for the candidate
// nearest to name, if it is near enough to be a typo, or "". name itself
// is never suggested; letters differing only in case count as the same.
func suggestion(prefix, name string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if c == name {
			continue
		}
		// In one case: NATS and URL are nats and url in the wrong one.
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestD || d == bestD && c < best {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > len(name)/2 {
		return ""
	}
	return " (did you mean " + prefix + best + "?)"
}

// checkFileOnly checks a file-only key's value (postgres.columns) against
// its Go type: field names, with the file's line numbers, then the values,
// by decoding the subtree alone, so that the error names the key (and the
// entry of a list). It returns every problem found, once each, in the
// order of their lines, and apart from them the walkGuard error that ended
// the check, if one did.
func checkFileOnly(g *walkGuard, val *yaml.Node, path string, t reflect.Type) ([]error, error) {
	var found []lineProblem
	err := checkFields(g, val, path, t, &found)
	if err == nil {
		found = append(found, decodeProblems(val, path, t)...)
	}
	slices.SortStableFunc(found, func(a, b lineProblem) int { return a.line - b.line })
	var problems []error
	seen := map[string]bool{} // an anchored entry that aliases repeat fails once
	for _, p := range found {
		if msg := p.err.Error(); !seen[msg] {
			seen[msg] = true
			problems = append(problems, p.err)
		}
	}
	return problems, err
}

// lineProblem is a problem of a file-only key and the line it is on (0
// when unknown).
type lineProblem struct {
	line int
	err  error
}

// decodeProblems decodes val, at path, into a t and returns each value of
// the wrong form, naming its line and, when val is a list and the line is
// in one of its entries, the entry.
func decodeProblems(val *yaml.Node, path string, t reflect.Type) []lineProblem {
	err := val.Decode(reflect.New(t).Interface())
	if err == nil {
		return nil
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []lineProblem{{err: fmt.Errorf("%w: %s: %s", ErrInvalidConfig, path, err)}}
	}
	var out []lineProblem
	for _, e := range te.Errors { // "line 4: cannot unmarshal ..."
		at, rest, _ := strings.Cut(e, ": ")
		line, err := strconv.Atoi(strings.TrimPrefix(at, "line "))
		if err != nil || !strings.HasPrefix(at, "line ") {
			out = append(out, lineProblem{err: fmt.Errorf("%w: %s: %s", ErrInvalidConfig, path, e)})
			continue
		}
		where := path
		if val.Kind == yaml.SequenceNode {
			// The last entry that starts on or before the line; an entry
			// an alias names is read where its anchor is.
			for i, n := range val.Content {
				if n.Kind != yaml.AliasNode && n.Line <= line {
					where = fmt.Sprintf("%s[%d]", path, i)
				}
			}
		}
		out = append(out, lineProblem{line, fmt.Errorf("%w: line %d: %s: %s", ErrInvalidConfig, line, where, rest)})
	}
	return out
}

// checkFields adds to found every mapping key in n that t has no field
// for, naming its path and line, and every single value of a boolean field
// that is not one (replaced by false, so that the decoder does not report
// it again); other values of the wrong shape are left to the decoder. It
// returns only walkGuard's errors, which end the check.
func checkFields(g *walkGuard, n *yaml.Node, path string, t reflect.Type, found *[]lineProblem) error {
	n = deref(n)
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		if err := g.enter(n); err != nil {
			return err
		}
		defer g.leave(n)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, e := range n.Content {
			if err := checkFields(g, e, fmt.Sprintf("%s[%d]", path, i), t.Elem(), found); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for j := 0; j+1 < len(n.Content); j += 2 {
			if err := checkFields(g, n.Content[j+1], path+"."+n.Content[j].Value, t.Elem(), found); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
			return nil
		}
		fields := yamlFields(t)
		for j := 0; j+1 < len(n.Content); j += 2 {
			kn := n.Content[j]
			if kn.ShortTag() == "!!merge" {
				if err := merged(deref(n.Content[j+1]), path, func(m *yaml.Node, p string) error { return checkFields(g, m, p, t, found) }); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[kn.Value]
			if !ok {
				*found = append(*found, lineProblem{kn.Line, fmt.Errorf("%w: line %d: %s.%s: no such key%s", ErrInvalidConfig, kn.Line, path, kn.Value,
					suggestion(path+".", kn.Value, slices.Collect(maps.Keys(fields))))})
				continue
			}
			if ft.Kind() == reflect.Bool {
				// Said as a key's boolean is (scalarWants), not as the
				// decoder would: "cannot unmarshal !!str `maybe` into
				// bool", naming no field.
				if v := deref(n.Content[j+1]); v.Kind == yaml.ScalarNode && v.Decode(new(bool)) != nil {
					*found = append(*found, lineProblem{v.Line, fmt.Errorf("%w: line %d: %s.%s: %s", ErrInvalidConfig, v.Line, path, kn.Value, notValue(v, scalarWants[reflect.Bool].typ, scalarWants[reflect.Bool].want))})
					// Reported: the decoder is not to report it again,
					// nor this walk where an alias repeats the entry.
					n.Content[j+1] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "false", Line: v.Line}
				}
				continue
			}
			if err := checkFields(g, n.Content[j+1], path+"."+kn.Value, ft, found); err != nil {
				return err
			}
		}
	}
	return nil
}

// yamlFields maps the YAML names of struct t's fields (as yaml.v3 names
// them: the tag's, or the field's name in lower case; inline structs
// flattened) to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, inline, ok := yamlName(f)
		switch {
		case !ok:
		case inline:
			maps.Copy(out, yamlFields(f.Type))
		default:
			out[name] = f.Type
		}
	}
	return out
}

// editDistance is the number of single-byte insertions, deletions,
// substitutions and swaps of neighbours that turn a into b (optimal string
// alignment), so that "ulr" is one edit from "url".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// walkGuard stops a walk through aliases that re-enters a node it is
// inside (an alias that contains itself) or visits too many nodes (aliases
// that multiply): the probe decode in parse does not see values a merge
// key brings in under keys the mapping sets itself.
type walkGuard struct {
	inside map[*yaml.Node]bool
	visits int
}

// maxWalk bounds the nodes a walk visits; a config file has hundreds.
const maxWalk = 100_000

// errAliasWalk marks walkGuard's errors, which end a walk at once: the
// others are each one key's problem, and the walk goes on to report the
// rest. Its text is empty: the message is the error it is wrapped in.
var errAliasWalk = errors.New("")

func (g *walkGuard) enter(n *yaml.Node) error {
	if g.inside == nil {
		g.inside = map[*yaml.Node]bool{}
	}
	g.visits++
	switch {
	case g.inside[n]:
		return fmt.Errorf("%w: line %d: a YAML alias contains itself%w", ErrInvalidConfig, n.Line, errAliasWalk)
	case g.visits > maxWalk:
		return fmt.Errorf("%w: line %d: YAML aliases expand to more than %d values%w", ErrInvalidConfig, n.Line, maxWalk, errAliasWalk)
	}
	g.inside[n] = true
	return nil
}

func (g *walkGuard) leave(n *yaml.Node) { delete(g.inside, n) }

// deref follows YAML aliases (*anchor) to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// merged applies f to the mappings a merge key (<<) brings in: one, or a
// list of them.
func merged(val *yaml.Node, prefix string, f func(*yaml.Node, string) error) error {
	ms := []*yaml.Node{val}
	if val.Kind == yaml.SequenceNode {
		ms = val.Content
	}
	for _, m := range ms {
		if m = deref(m); m.Kind == yaml.MappingNode {
			if err := f(m, prefix); err != nil {
				return err
			}
		}
	}
	return nil
}

// scalar checks and normalizes the single value of key k (at path) and
// returns the node to keep in its place: human sizes under keys ending in
// "bytes" (and memory_limit, whose "auto" becomes MemoryLimitAuto) become
// plain integers (parseSize), and a duration written as the number 0
// becomes 0s (YAML refuses to decode a number into a duration); another
// number for a duration is an error that asks for a unit, a number for any
// other key is read in decimal (decimal), and every other number and
// boolean must read as one. A value that an alias names, or that is an
// anchor, is rewritten as a copy, so that other keys sharing it keep it.
func (sc *schema) scalar(path string, k Key, kn, raw *yaml.Node) (*yaml.Node, error) {
	at := sc.at(path, kn, raw)
	sc.where[path] = whereOf(at)
	val := deref(raw)
	if raw != val || val.Anchor != "" {
		cp := *val
		cp.Anchor = ""
		val = &cp
	}
	key := kn.Value
	if k.Type == "duration" {
		// A number as YAML reads one (0x10, 1_000, .inf too); a
		// quoted "0" is a string, which time.ParseDuration takes.
		switch val.ShortTag() {
		case "!!int", "!!float":
			var f float64
			if err := val.Decode(&f); err != nil || f != 0 {
				return nil, fmt.Errorf("%w: %s%s: %q has no unit (use e.g. 20ms, 5s or 1m30s)", ErrInvalidConfig, at, path, val.Value)
			}
			val.Value, val.Tag, val.Style = "0s", "!!str", 0
		case "!!str":
			if _, err := time.ParseDuration(val.Value); err != nil {
				return nil, fmt.Errorf("%w: %s%s: %q is not a duration (use e.g. 20ms, 5s or 1m30s)", ErrInvalidConfig, at, path, val.Value)
			}
		default:
			return nil, fmt.Errorf("%w: %s%s: %q is not a duration (use e.g. 20ms, 5s or 1m30s)", ErrInvalidConfig, at, path, val.Value)
		}
		return val, nil
	}
	if isSizeKey(key) {
		if n, err := strconv.ParseInt(val.Value, 10, 64); err == nil {
			// "1024" in quotes too; written back so that 08 is 8
			val.Value, val.Tag, val.Style = strconv.FormatInt(n, 10), "!!int", 0
			return val, nil
		}
		if key == "memory_limit" && strings.EqualFold(val.Value, "auto") {
			val.Value, val.Tag, val.Style = strconv.Itoa(MemoryLimitAuto), "!!int", 0
			return val, nil
		}
		n, err := parseSize(val.Value)
		switch {
		case errors.Is(err, errSizeComma):
			return nil, fmt.Errorf("%w: %s%s: %q has a comma, which may be a decimal point or a thousands separator: write the size without it (e.g. 1.5MiB, or 1000 for 1,000)", ErrInvalidConfig, at, path, val.Value)
		case errors.Is(err, errSizeNotWhole):
			return nil, fmt.Errorf("%w: %s%s: %q is not a whole number of bytes (use e.g. 4MiB, 1.5KiB or a number of bytes)", ErrInvalidConfig, at, path, val.Value)
		case err != nil:
			return nil, fmt.Errorf("%w: %s%s: %q is not a size (use e.g. 4MiB, 512KiB or a number of bytes)", ErrInvalidConfig, at, path, val.Value)
		}
		val.Value, val.Tag, val.Style = strconv.FormatUint(n, 10), "!!int", 0
		return val, nil
	}
	if val.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		if err := decimal(val, k.Kind); err != nil {
			return nil, fmt.Errorf("%w: %s%s: %w", ErrInvalidConfig, at, path, err)
		}
	}
	if w, ok := scalarWants[k.Kind]; ok {
		if err := val.Decode(reflect.New(w.typ).Interface()); err != nil {
			return nil, fmt.Errorf("%w: %s%s: %s", ErrInvalidConfig, at, path, notValue(val, w.typ, w.want))
		}
	}
	return val, nil
}

// decimal reads val, the value of a key of kind k, in decimal when YAML
// reads it as a number, and writes it back so, whether it comes from the
// file, a variable or --set: a whole number is a sign, if any, and decimal
// digits, and a leading zero changes nothing (010 is 10, as for a size;
// yaml.v3 follows YAML 1.1, where 010 is 8 and 08 a fraction). Another
// form YAML reads as a whole number (0x10, 0o10, 0b10, 1_000) is refused
// with the number to write; so are a fraction and an exponent (YAML would
// truncate 2.5 into an int; 1e3 and 8.0 are whole but written as
// fractions). A number key (float64) reads 010 as 10 too, and refuses
// 0x10 and 1_0. Other kinds, and values YAML reads as strings, are left to
// scalarWants.
func decimal(val *yaml.Node, k reflect.Kind) error {
	tag := val.ShortTag()
	switch {
	case (k == reflect.Int || k == reflect.Int64) && (tag == "!!int" || tag == "!!float"):
		n, err := strconv.ParseInt(val.Value, 10, 64)
		if err == nil {
			val.Value, val.Tag, val.Style = strconv.FormatInt(n, 10), "!!int", 0
			return nil
		}
		var yn int64
		if tag == "!!int" && val.Decode(&yn) == nil {
			return fmt.Errorf("%q is not a whole number written in decimal digits: write %d", val.Value, yn)
		}
		if errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("%q is not a whole number jetsink can hold", val.Value)
		}
		return fmt.Errorf("%q is not a whole number written in decimal digits", val.Value)
	case k == reflect.Float64 && tag == "!!int":
		f, err := strconv.ParseFloat(val.Value, 64)
		if err != nil || strings.ContainsFunc(strings.TrimLeft(val.Value, "+-"), func(r rune) bool { return r < '0' || r > '9' }) {
			return fmt.Errorf("%q is not a number written in decimal digits", val.Value)
		}
		val.Value, val.Tag, val.Style = strconv.FormatFloat(f, 'g', -1, 64), "!!float", 0
	}
	return nil
}

// scalarWants says, for each kind of number or boolean config's keys have,
// what a value must decode as and how to ask for it.
var scalarWants = map[reflect.Kind]struct {
	typ  reflect.Type
	want string
}{
	reflect.Int:     {reflect.TypeFor[int](), "a whole number"},
	reflect.Int64:   {reflect.TypeFor[int64](), "a whole number"},
	reflect.Float64: {reflect.TypeFor[float64](), "a number"},
	reflect.Bool:    {reflect.TypeFor[bool](), "true or false"},
}

// notValue says why val, which did not decode into typ, is not want (as
// scalarWants asks for it): a value in quotes that would decode without them
// is a string to YAML, which is said, where "true" is not true or false
// would leave the reader puzzled.
func notValue(val *yaml.Node, typ reflect.Type, want string) string {
	if val.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
		plain := yaml.Node{Kind: yaml.ScalarNode, Value: val.Value}
		if decimal(&plain, typ.Kind()) == nil && plain.Decode(reflect.New(typ).Interface()) == nil {
			return fmt.Sprintf("%q is in quotes, which makes it a string: write %s without them", val.Value, val.Value)
		}
	}
	return fmt.Sprintf("%q is not %s", val.Value, want)
}

// keyPart is s up to its first character that cannot be in a key (letters,
// digits, _ and dots), followed by "..." when it was cut: what an error may
// quote of a --set argument, whose value may be a password.
func keyPart(s string) string {
	for i := range len(s) {
		if !keyByte(s[i]) {
			return s[:i] + "..."
		}
	}
	return s
}

// emptyDocument reports whether doc, a YAML document, holds nothing: what a
// trailing --- line with nothing after it decodes to.
func emptyDocument(doc *yaml.Node) bool {
	if doc.Kind != yaml.DocumentNode {
		return false
	}
	for _, n := range doc.Content {
		if !(n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
			return false
		}
	}
	return true
}

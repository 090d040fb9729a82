package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
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
	"JETSINK_CONFIG": true, // the config file path, read by the CLI
}

// Source says where to load from. Zero fields are skipped.
type Source struct {
	// File is the YAML file's path; "" loads defaults only.
	File string
	// Env is the environment as os.Environ returns it.
	Env []string
	// Set holds "key=value" overrides (flags), applied last in order.
	Set []string
}

// Load builds the configuration from defaults, the file, the environment
// and the overrides, in that order of precedence (later wins), and
// validates it. Errors wrap ErrInvalidConfig (or a section's sentinel) and
// name the key at fault.
func Load(src Source) (Config, error) {
	var raw []byte
	if src.File != "" {
		b, err := os.ReadFile(src.File)
		if err != nil {
			return Config{}, fmt.Errorf("%w: read config file: %w", ErrInvalidConfig, err)
		}
		raw = b
	}
	cfg, err := parse(raw, src.Env, src.Set)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Parse is Load without validation and without the file system: raw is the
// YAML text. It is what Load and the fuzz test share.
func Parse(raw []byte, env, set []string) (Config, error) { return parse(raw, env, set) }

func parse(raw []byte, env, set []string) (Config, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	if len(bytes.TrimSpace(raw)) > 0 {
		var doc yaml.Node
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
			switch doc.Content[0].Kind {
			case yaml.MappingNode:
				root = doc.Content[0]
			case yaml.ScalarNode:
				if doc.Content[0].Tag != "!!null" {
					return Config{}, fmt.Errorf("%w: the config file must be a YAML mapping of sections (nats:, pipeline:, postgres:, ...)", ErrInvalidConfig)
				}
			default:
				return Config{}, fmt.Errorf("%w: the config file must be a YAML mapping of sections (nats:, pipeline:, postgres:, ...)", ErrInvalidConfig)
			}
		}
	}
	keys := Keys()
	known := make(map[string]reflect.Kind, len(keys))
	for _, k := range keys {
		known[k.Path] = k.Kind
	}
	// Environment, then flags: later overrides win.
	envKeys := make(map[string]string, len(keys))
	for _, k := range keys {
		envKeys[EnvName(k.Path)] = k.Path
	}
	for alias, path := range envAliases {
		envKeys[alias] = path
	}
	var fromEnv []string
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || envIgnored[name] || strings.HasPrefix(name, "JETSINK_TEST_") {
			continue
		}
		path, ok := envKeys[name]
		if !ok {
			return Config{}, fmt.Errorf("%w: environment variable %s is not a jetsink setting (a key's variable is JETSINK_ plus its dotted path in capitals with _ for dots, e.g. JETSINK_NATS_URL)", ErrInvalidConfig, name)
		}
		fromEnv = append(fromEnv, name)
		if err := setPath(root, path, value, known[path]); err != nil {
			return Config{}, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err)
		}
	}
	sort.Strings(fromEnv)
	for _, kv := range set {
		path, value, ok := strings.Cut(kv, "=")
		if !ok {
			return Config{}, fmt.Errorf("%w: --set %q: want key=value, e.g. --set postgres.batch.max_rows=1000", ErrInvalidConfig, kv)
		}
		path = strings.TrimSpace(path)
		kind, ok := known[path]
		if !ok {
			return Config{}, fmt.Errorf("%w: --set %s: no such key (see `jetsink run --help` for the keys)", ErrInvalidConfig, path)
		}
		if err := setPath(root, path, value, kind); err != nil {
			return Config{}, fmt.Errorf("%w: --set %s: %w", ErrInvalidConfig, path, err)
		}
	}
	durations := map[string]bool{}
	for _, k := range keys {
		if k.Type == "duration" {
			durations[k.Path] = true
		}
	}
	if err := normalizeScalars(root, "", durations); err != nil {
		return Config{}, err
	}
	text, err := yaml.Marshal(root)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg := Default()
	dec := yaml.NewDecoder(bytes.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalidConfig, describeYAMLError(err))
	}
	return cfg, nil
}

// describeYAMLError keeps yaml's message (it names the line and the field)
// but drops its multi-line framing.
func describeYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return strings.Join(te.Errors, "; ")
	}
	return err.Error()
}

// setPath sets the scalar (or, for lists, sequence) at a dotted path,
// creating mappings on the way.
func setPath(root *yaml.Node, path, value string, kind reflect.Kind) error {
	parts := strings.Split(path, ".")
	node := root
	for i, part := range parts {
		var child *yaml.Node
		for j := 0; j+1 < len(node.Content); j += 2 {
			if node.Content[j].Value == part {
				child = node.Content[j+1]
				break
			}
		}
		last := i == len(parts)-1
		if child == nil {
			child = &yaml.Node{Kind: yaml.MappingNode}
			node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: part}, child)
		}
		if last {
			if kind == reflect.Slice {
				*child = yaml.Node{Kind: yaml.SequenceNode}
				for _, item := range strings.Split(value, ",") {
					if item = strings.TrimSpace(item); item != "" {
						child.Content = append(child.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: item, Tag: "!!str"})
					}
				}
				return nil
			}
			*child = yaml.Node{Kind: yaml.ScalarNode, Value: value}
			if kind == reflect.String {
				child.Tag = "!!str" // "on", "null", "0755" stay strings
			}
			return nil
		}
		if child.Kind != yaml.MappingNode {
			return fmt.Errorf("%s is not a section", strings.Join(parts[:i+1], "."))
		}
		node = child
	}
	return nil
}

// normalizeScalars turns human sizes under keys ending in "bytes" (and
// memory_limit, whose "auto" becomes MemoryLimitAuto) into plain integers,
// and a duration written as the number 0 into 0s (YAML refuses to decode a
// number into a duration); another number for a duration is an error that
// asks for a unit.
func normalizeScalars(node *yaml.Node, prefix string, durations map[string]bool) error {
	if node.Kind != yaml.MappingNode {
		return nil
	}
	for j := 0; j+1 < len(node.Content); j += 2 {
		key, val := node.Content[j].Value, node.Content[j+1]
		path := key
		if prefix != "" {
			path = prefix + "." + key
		}
		if val.Kind == yaml.MappingNode {
			if err := normalizeScalars(val, path, durations); err != nil {
				return err
			}
			continue
		}
		if val.Kind == yaml.ScalarNode && durations[path] {
			// A number as YAML reads one (0x10, 1_000, .inf too); a
			// quoted "0" is a string, which time.ParseDuration takes.
			// (Checked here so that the error names the key.)
			switch val.ShortTag() {
			case "!!int", "!!float":
				var f float64
				if err := val.Decode(&f); err != nil || f != 0 {
					return fmt.Errorf("%w: %s: %q has no unit (use e.g. 20ms, 5s or 1m30s)", ErrInvalidConfig, path, val.Value)
				}
				val.Value, val.Tag, val.Style = "0s", "!!str", 0
			case "!!str":
				if _, err := time.ParseDuration(val.Value); err != nil {
					return fmt.Errorf("%w: %s: %q is not a duration (use e.g. 20ms, 5s or 1m30s)", ErrInvalidConfig, path, val.Value)
				}
			}
			continue
		}
		if val.Kind != yaml.ScalarNode || !isSizeKey(key) {
			continue
		}
		if _, err := strconv.ParseInt(val.Value, 10, 64); err == nil {
			continue
		}
		if key == "memory_limit" && strings.EqualFold(val.Value, "auto") {
			val.Value, val.Tag, val.Style = strconv.Itoa(MemoryLimitAuto), "!!int", 0
			continue
		}
		n, err := humanize.ParseBytes(val.Value)
		if err != nil || n > 1<<53 {
			return fmt.Errorf("%w: %s: %q is not a size (use e.g. 4MiB, 512KiB or a number of bytes)", ErrInvalidConfig, path, val.Value)
		}
		val.Value, val.Tag, val.Style = strconv.FormatUint(n, 10), "!!int", 0
	}
	return nil
}

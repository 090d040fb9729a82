package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Key is one settable configuration key.
type Key struct {
	Path string       // dotted path, e.g. postgres.batch.max_rows
	Kind reflect.Kind // reflect.String, Int, Bool, Float64, Slice (of strings), ...
	Type string       // Go type, for help text
}

// Keys lists every key that the environment and --set can set, in a stable
// order (postgres.columns is file-only).
func Keys() []Key {
	var out []Key
	walkKeys(reflect.TypeOf(Config{}), "", &out, nil)
	return out
}

var durationType = reflect.TypeOf(time.Duration(0))

// walkKeys appends t's settable keys under prefix to out, and adds the
// paths and types of its file-only keys (lists of structs, maps) to
// fileOnly unless it is nil.
func walkKeys(t reflect.Type, prefix string, out *[]Key, fileOnly map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, inline, ok := yamlName(f)
		if !ok {
			continue
		}
		if inline {
			walkKeys(f.Type, prefix, out, fileOnly)
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		ft := f.Type
		switch {
		case ft == durationType:
			*out = append(*out, Key{Path: path, Kind: reflect.Int64, Type: "duration"})
		case ft.Kind() == reflect.Struct:
			walkKeys(ft, path, out, fileOnly)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.String:
			*out = append(*out, Key{Path: path, Kind: reflect.Slice, Type: "list"})
		case ft.Kind() == reflect.Slice || ft.Kind() == reflect.Map || ft.Kind() == reflect.Pointer:
			// file-only (postgres.columns)
			if fileOnly != nil {
				fileOnly[path] = ft
			}
		case name == "memory_limit":
			*out = append(*out, Key{Path: path, Kind: ft.Kind(), Type: "size|auto"})
		case isSizeKey(name):
			*out = append(*out, Key{Path: path, Kind: ft.Kind(), Type: "size"})
		default:
			*out = append(*out, Key{Path: path, Kind: ft.Kind(), Type: ft.Kind().String()})
		}
	}
}

// yamlName is the key yaml.v3 reads struct field f from: its tag's name,
// or its name in lower case; inline for a struct whose fields are read as
// the parent's; ok false for a field yaml.v3 skips.
func yamlName(f reflect.StructField) (name string, inline, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return "", false, false
	}
	if slices.Contains(strings.Split(opts, ","), "inline") {
		return "", true, true
	}
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, false, true
}

// isSizeKey reports whether a key (its last path element) takes sizes
// such as 4MiB: the keys ending in "bytes", and memory_limit.
func isSizeKey(name string) bool {
	return strings.HasSuffix(name, "bytes") || name == "memory_limit"
}

// EnvName is the environment variable that sets a key.
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// EnvAliases are the other variables that set a key, sorted
// (JETSINK_DATABASE_URL for postgres.url); none for most.
func EnvAliases(path string) []string {
	var names []string
	for name, p := range envAliases {
		if p == path {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// KeyOfEnv is the key the environment variable name sets: the inverse of
// EnvName, and the aliases (JETSINK_DATABASE_URL for postgres.url). ok is
// false for a name that sets no key.
func KeyOfEnv(name string) (path string, ok bool) {
	if path, ok := envAliases[name]; ok {
		return path, true
	}
	for _, k := range Keys() {
		if EnvName(k.Path) == name {
			return k.Path, true
		}
	}
	return "", false
}

// DefaultValue renders a key's default as it would be written in the file.
func DefaultValue(path string) string {
	v := reflect.ValueOf(Default())
	for _, part := range strings.Split(path, ".") {
		f, ok := fieldByYAML(v, part)
		if !ok {
			return ""
		}
		v = f
	}
	if d, ok := v.Interface().(time.Duration); ok {
		return d.String()
	}
	if path == "memory_limit" && v.Int() == MemoryLimitAuto {
		return "auto"
	}
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(v.Index(i).Interface())
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v.Interface())
}

func fieldByYAML(v reflect.Value, name string) (reflect.Value, bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag, inline, ok := yamlName(t.Field(i))
		if !ok {
			continue
		}
		if inline {
			if got, ok := fieldByYAML(v.Field(i), name); ok {
				return got, true
			}
			continue
		}
		if tag == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

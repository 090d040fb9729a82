package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/net/http/httpguts"

	"github.com/jetsink/jetsink/pipeline"
)

// ErrInvalidConfig is wrapped by the errors New and NewTracing return for a
// configuration they cannot use (a bad endpoint URL or protocol).
var ErrInvalidConfig = errors.New("invalid telemetry config")

// Scope is the instrumentation scope of jetsink's tracer and meter.
const Scope = "github.com/jetsink/jetsink"

// Config says where traces go and how many are kept. The zero value means
// tracing is off unless the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) variable names a collector.
type Config struct {
	// ServiceName is service.name; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it. Default "jetsink".
	ServiceName string
	// OTLPEndpoint is the collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT:
	// http://host:4318 (OTLP/HTTP, /v1/traces is appended to the path
	// unless it ends so already), https://... (with TLS), grpc://host:4317 or grpcs://...
	// (OTLP/gRPC). With http(s) URLs, OTEL_EXPORTER_OTLP_PROTOCOL=grpc
	// selects gRPC; a protocol other than grpc or http/protobuf is refused
	// either way. Empty: the OTEL_EXPORTER_OTLP_* variables decide, and
	// when they name no endpoint tracing is off (a no-op provider).
	OTLPEndpoint string
	// SampleRatio is the share of root traces kept (0..1); messages whose
	// publisher sent a traceparent follow the publisher's decision
	// (parent-based sampling). OTEL_TRACES_SAMPLER, when set, overrides it
	// (see samplerFromEnv). A negative ratio leaves sampling to the SDK's
	// own sampler, which reads OTEL_TRACES_SAMPLER itself, for the spans
	// started with Tracer (publish uses that); StartMessage then samples no
	// root.
	SampleRatio float64
	// MaxLinks bounds the links of one span (a batch span links every
	// sampled message). Default 128, at most maxLinks; jetsink passes
	// postgres.batch.max_rows. OTEL_SPAN_LINK_COUNT_LIMIT, when set,
	// replaces it, lower or higher (at most maxLinks too): see linkLimit.
	MaxLinks int
	// Log gets, at Warn level and at most one line a minute, the errors the
	// OpenTelemetry SDK reports on its own (failed exports), which it would
	// otherwise print to stderr with the standard log package; nil means
	// slog.Default(). The SDK's error handler is process-wide: see
	// sdkErrors for which Tracing's logger gets them.
	Log *slog.Logger
}

// Tracing owns the tracer provider and starts jetsink's spans. A nil
// *Tracing, or one built without an endpoint, traces nothing at the cost of
// a nil check. All methods are safe for concurrent use.
type Tracing struct {
	tp     *sdktrace.TracerProvider // nil when off
	exp    *stoppable               // tp's exporter; nil when off
	errs   *errRoute                // where the SDK's errors go; nil when off
	tracer trace.Tracer
	prop   propagation.TraceContext
	// rootBound: a trace is sampled when the last 8 bytes of its trace id,
	// shifted right by one, are below it (the rule of
	// sdktrace.TraceIDRatioBased); a root, when a random 63-bit number is
	// (sampleRoot).
	rootBound uint64
	// anyParent: the ratio applies to every message, whatever its
	// traceparent's sampled flag says (OTEL_TRACES_SAMPLER without the
	// parentbased_ prefix), decided from the traceparent's trace id
	// (sampleTrace).
	anyParent bool
	sampler   string // what decides sampling, for the start-up log
	// envSampler is OTEL_TRACES_SAMPLER when it decides (samplerFromEnv),
	// "" when telemetry.sample_ratio does; sdkSampler: the SDK's own
	// sampler decides (Config.SampleRatio < 0), and envSampler is then
	// OTEL_TRACES_SAMPLER as the SDK reads it (lower case; "" when unset,
	// the SDK's parentbased_always_on). For dropAdvice.
	envSampler string
	sdkSampler bool
	// parentSeen, rootSeen: a message was traced because its publisher
	// sampled it (parent-based), or as a root at the ratio; dropAdvice
	// names what samples fewer of those.
	parentSeen, rootSeen atomic.Bool
	maxLinks             int        // links kept on a batch span
	queue                *spanQueue // nil when off
	// dests are the subject patterns messages come from, each with its
	// span name (SetDestinations).
	dests      []destination
	streamSpan string // "process <stream>", or "process" before SetDestinations
}

// destination is a subject pattern a message span is named after.
type destination struct{ pattern, span string }

// SetDestinations gives the stream jetsink consumes and the subject
// patterns it takes messages from (the consumer's filter subject, or the
// stream's subjects). A message span is named "process <pattern>" after
// the first pattern its subject matches, which is also its
// messaging.destination.template: the OpenTelemetry messaging conventions
// name a span after a low-cardinality destination, and subjects that
// carry a device or customer id would give a tracing backend one
// operation per id. A subject no pattern matches (a stream that transforms
// subjects, mirrors or sources others, or was changed since) gives
// "process <stream>". Call it before the first StartMessage, not
// concurrently with it.
func (t *Tracing) SetDestinations(stream string, patterns []string) {
	if t == nil {
		return
	}
	t.dests = t.dests[:0]
	for _, p := range patterns {
		t.dests = append(t.dests, destination{pattern: p, span: "process " + p})
	}
	t.streamSpan = "process " + stream
}

// destination returns the pattern that subject matches and the span name
// it gives, or "" and "process <stream>".
func (t *Tracing) destination(subject string) (pattern, span string) {
	for _, d := range t.dests {
		if pipeline.SubjectsOverlap(d.pattern, subject) {
			return d.pattern, d.span
		}
	}
	return "", t.streamSpan
}

// forceKey marks a context whose root span the sampler must keep: jetsink
// decides root sampling before it builds anything for a message, so that an
// unsampled one costs one random number.
type forceKey struct{}

var forced = context.WithValue(context.Background(), forceKey{}, true)

// forceSampler keeps the spans started under forced (or a context derived
// from it) and leaves the rest to next.
type forceSampler struct{ next sdktrace.Sampler }

func (s forceSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.ParentContext.Value(forceKey{}) != nil {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample,
			Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return s.next.ShouldSample(p)
}

func (s forceSampler) Description() string { return "JetsinkForced{" + s.next.Description() + "}" }

// maxLinks bounds the links of a batch span, whatever max_rows is: each
// takes about 35 bytes in OTLP, and an export over 4 MiB (the default limit
// of a gRPC receiver, Jaeger's and the Collector's) is refused whole, with
// the other spans of its batch.
const maxLinks = 10000

// linkLimit is the links a span keeps: OTEL_SPAN_LINK_COUNT_LIMIT when it
// is set, lower or higher than maxRows (the user's choice), else maxRows
// but at least the SDK's default, 128; at most maxLinks either way (a
// negative limit, which the SDK reads as none, is maxLinks). A value that
// is not a whole number is an error wrapping ErrInvalidConfig: the SDK
// would use its default.
func linkLimit(maxRows int) (int, error) {
	v := env("OTEL_SPAN_LINK_COUNT_LIMIT")
	if v == "" {
		return min(max(maxRows, sdktrace.DefaultLinkCountLimit), maxLinks), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: OTEL_SPAN_LINK_COUNT_LIMIT %q: a whole number of links a span keeps (at most %d)", ErrInvalidConfig, v, maxLinks)
	}
	if n < 0 || n > maxLinks {
		return maxLinks, nil
	}
	return n, nil
}

// samplerFromEnv reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG as
// the OpenTelemetry specification defines them: the share of messages
// sampled, and whether a message with a traceparent follows its sampled
// flag instead (the parentbased_ samplers). set is false when the variable
// is unset. The ratio of traceidratio is ARG (1 when unset), applied as
// TraceIDRatioBased does: to a message's trace id (sampleTrace), so that
// services sampling at the same ratio keep the same traces; a message
// without a valid traceparent, whose trace id would be new and random,
// takes a random draw instead (sampleRoot). The samplers that need a
// remote service (jaeger_remote, xray) are refused.
func samplerFromEnv() (ratio float64, parentBased, set bool, err error) {
	name := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER"))
	if name == "" {
		return 0, false, false, nil
	}
	base, parentBased := strings.CutPrefix(name, "parentbased_")
	switch base {
	case "always_on":
		return 1, parentBased, true, nil
	case "always_off":
		return 0, parentBased, true, nil
	case "traceidratio":
		arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
		if arg == "" {
			return 1, parentBased, true, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return 0, false, false, fmt.Errorf("%w: OTEL_TRACES_SAMPLER_ARG %q: a ratio between 0 and 1 for %s", ErrInvalidConfig, arg, name)
		}
		return r, parentBased, true, nil
	}
	return 0, false, false, fmt.Errorf("%w: OTEL_TRACES_SAMPLER %q: jetsink takes always_on, always_off, traceidratio and their parentbased_ forms "+
		"(or unset it and use telemetry.sample_ratio)", ErrInvalidConfig, name)
}

// NewTracing builds the tracer provider: OTLP over HTTP or gRPC as Config
// and the standard OTEL_* variables say, batched export, parent-based
// sampling with cfg.SampleRatio for roots. Without an endpoint it returns a
// Tracing that is off (Enabled false). Errors wrap ErrInvalidConfig or the
// exporter's error.
func NewTracing(ctx context.Context, cfg Config) (*Tracing, error) {
	t := &Tracing{tracer: noop.NewTracerProvider().Tracer(Scope)}
	if o, err := off(cfg.Log); o || err != nil {
		return t, err
	}
	exp, err := newExporter(ctx, cfg.OTLPEndpoint)
	if err != nil || exp == nil {
		return t, err
	}
	t, err = newTracing(exp, cfg)
	if err != nil {
		_ = exp.Shutdown(context.WithoutCancel(ctx)) // no export has started: closes idle connections
		return nil, err
	}
	return t, nil
}

// NewTracingTo is NewTracing exporting to exp instead of OTLP, whatever
// the configuration and the OTEL_* variables say of the exporter: for a
// program that embeds jetsink's packages with an exporter of its own, and
// for tests (go.opentelemetry.io/otel/sdk/trace/tracetest).
func NewTracingTo(exp sdktrace.SpanExporter, cfg Config) (*Tracing, error) {
	return newTracing(exp, cfg)
}

// newTracing builds an enabled Tracing exporting to exp. It checks the
// configuration before it starts the batch processor's goroutine, so that
// an error leaves nothing running.
func newTracing(exp sdktrace.SpanExporter, cfg Config) (*Tracing, error) {
	t := &Tracing{exp: newStoppable(exp), sampler: "the SDK's (OTEL_TRACES_SAMPLER)", streamSpan: "process",
		sdkSampler: cfg.SampleRatio < 0}
	res, err := newResource(cfg.ServiceName)
	if err != nil {
		return nil, err
	}
	limits := sdktrace.NewSpanLimits()
	if limits.LinkCountLimit, err = linkLimit(cfg.MaxLinks); err != nil {
		return nil, err
	}
	t.maxLinks = limits.LinkCountLimit
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithRawSpanLimits(limits),
	}
	if cfg.SampleRatio >= 0 {
		ratio, parentBased, set, err := samplerFromEnv()
		switch {
		case err != nil:
			return nil, err
		case set:
			t.anyParent = !parentBased
			t.envSampler = strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER"))
			t.sampler = fmt.Sprintf("OTEL_TRACES_SAMPLER=%s, ratio %g", os.Getenv("OTEL_TRACES_SAMPLER"), ratio)
		default:
			ratio = min(cfg.SampleRatio, 1)
			t.sampler = fmt.Sprintf("parent-based, telemetry.sample_ratio %g for roots", ratio)
		}
		opts = append(opts, sdktrace.WithSampler(forceSampler{sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))}))
		t.rootBound = uint64(ratio * (1 << 63))
		if ratio >= 1 {
			t.rootBound = 1 << 63
		}
	} else {
		// As sdktrace reads it (sampler_env.go), for dropAdvice.
		t.envSampler = strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	}
	t.queue = newSpanQueue(t.exp, cfg.Log, t.dropAdvice)
	opts = append(opts, sdktrace.WithSpanProcessor(t.queue))
	t.tp = sdktrace.NewTracerProvider(opts...)
	t.tracer = t.tp.Tracer(Scope)
	installSDKErrors()
	t.errs = sdkErrs.add(cfg.Log)
	return t, nil
}

// env is the environment variable name trimmed of white space.
func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// off reports whether the standard variables switch tracing off, as the
// OpenTelemetry specification reads them: OTEL_SDK_DISABLED is true only
// when it is "true" (any case, trimmed; a value other than that, "false"
// or empty is logged to log as ignored), and OTEL_TRACES_EXPORTER is a
// comma-separated list of which jetsink knows "otlp" (export, when an
// endpoint is set) and "none" (off). Any other exporter, or "none" with
// another, is an error wrapping ErrInvalidConfig: tracing would otherwise
// go where the variable did not say.
func off(log *slog.Logger) (bool, error) {
	switch v := env("OTEL_SDK_DISABLED"); {
	case strings.EqualFold(v, "true"):
		return true, nil
	case v != "" && !strings.EqualFold(v, "false"):
		if log == nil {
			log = slog.Default()
		}
		log.Warn("OTEL_SDK_DISABLED is neither true nor false: taken as false", "value", v)
	}
	v := env("OTEL_TRACES_EXPORTER")
	none, other := false, false
	for e := range strings.SplitSeq(v, ",") {
		switch e = strings.ToLower(strings.TrimSpace(e)); e {
		case "":
		case "none":
			none = true
		case "otlp":
			other = true
		default:
			return false, fmt.Errorf("%w: OTEL_TRACES_EXPORTER %q: jetsink exports with otlp, or none", ErrInvalidConfig, v)
		}
	}
	if none && other {
		return false, fmt.Errorf("%w: OTEL_TRACES_EXPORTER %q: none with another exporter", ErrInvalidConfig, v)
	}
	return none, nil
}

// newExporter picks the OTLP exporter; nil, nil when no endpoint is known.
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or else OTEL_EXPORTER_OTLP_PROTOCOL)
// must be grpc or http/protobuf when set, whether the endpoint comes from
// endpoint or the variables (an error wrapping ErrInvalidConfig); a grpc or
// grpcs endpoint is gRPC whatever it says.
// The OTEL_ variables are read as the exporters read them: trimmed of
// white space (a value with a trailing newline from a secret file is the
// same value, one of white space none).
func newExporter(ctx context.Context, endpoint string) (sdktrace.SpanExporter, error) {
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	proto := env(protoVar)
	if proto == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		proto = env(protoVar)
	}
	if endpoint == "" {
		if env("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"} {
		if err := checkHeaders(v, os.Getenv(v)); err != nil {
			return nil, err
		}
	}
	// Checked whatever names the endpoint: with telemetry.otlp_endpoint
	// too, a typo (grcp) or a protocol jetsink lacks (http/json) would
	// otherwise be taken for http/protobuf.
	if proto != "" && proto != "grpc" && proto != "http/protobuf" {
		return nil, fmt.Errorf("%w: %s %q; use grpc or http/protobuf", ErrInvalidConfig, protoVar, proto)
	}
	if endpoint == "" {
		// The exporters read every OTEL_EXPORTER_OTLP_* variable themselves,
		// and drop the credentials of an endpoint as CheckEndpoint says.
		for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
			val := env(v)
			if val == "" {
				continue
			}
			u, err := url.Parse(val)
			if err != nil || (proto != "grpc" && u.Host == "") {
				// The exporter would print it whole to stderr (the
				// OpenTelemetry logger, "parse url") and use its default
				// endpoint instead; or, with no host (otel-collector:4318
				// reads as the scheme "otel-collector"), post every
				// batch to https:///v1/traces, which fails, while jetsink
				// said tracing was on.
				return nil, fmt.Errorf("%w: %s %q is not a URL such as http://127.0.0.1:4318 (a scheme and a host)", ErrInvalidConfig, v, redactEndpoint(val))
			}
			if err := droppedParts(v, val, u); err != nil {
				return nil, err
			}
		}
		if proto == "grpc" {
			return wrapExp(otlptracegrpc.New(ctx))
		}
		return wrapExp(otlptracehttp.New(ctx))
	}
	if err := CheckEndpoint(endpoint); err != nil {
		return nil, err
	}
	u, _ := url.Parse(endpoint)
	switch u.Scheme {
	case "grpc", "grpcs":
		proto = "grpc"
		u.Scheme = map[string]string{"grpc": "http", "grpcs": "https"}[u.Scheme]
	}
	if proto == "grpc" {
		return wrapExp(otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(u.String())))
	}
	if !strings.HasSuffix(u.Path, "/v1/traces") {
		// A base URL, as OTEL_EXPORTER_OTLP_ENDPOINT: the exporter
		// posts to its path plus /v1/traces.
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return wrapExp(otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String())))
}

// checkHeaders refuses the value val of the variable name
// (OTEL_EXPORTER_OTLP_HEADERS or ..._TRACES_HEADERS) if the exporters
// would skip a part of it: one without '=', with a key that is not an
// HTTP token, or with a value that does not %-unescape. They log such a
// part whole through OpenTelemetry's logger (to stderr), and it is the
// credentials, often (Authorization: Bearer ...), that the request then
// goes without. The error names the part by its place, quoting nothing of
// it.
func checkHeaders(name, val string) error {
	if val == "" {
		return nil
	}
	for i, part := range strings.Split(val, ",") {
		if strings.TrimSpace(part) == "" {
			continue // a trailing comma: the exporters skip it, quoting nothing
		}
		key, value, ok := strings.Cut(part, "=")
		var why string
		switch _, err := url.PathUnescape(value); {
		case !ok:
			why = "has no '='"
		case !httpguts.ValidHeaderFieldName(strings.TrimSpace(key)):
			why = "has a key that is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
		case err != nil:
			why = "has a value that does not %-unescape (write '%' as %25)"
		default:
			continue
		}
		return fmt.Errorf("%w: %s: its part %d (of %d, comma-separated) %s; the form is key=value,key=value, "+
			"e.g. Authorization=Bearer%%20<token>", ErrInvalidConfig, name, i+1, strings.Count(val, ",")+1, why)
	}
	return nil
}

// CheckEndpoint reports whether endpoint is usable as Config.OTLPEndpoint:
// empty, or an http, https, grpc or grpcs URL with a host and nothing the
// exporters would drop (droppedParts: credentials, a query): the error says
// to send credentials in OTEL_EXPORTER_OTLP_HEADERS, which the exporters do
// read. Its messages quote the endpoint without its userinfo. The error
// wraps ErrInvalidConfig.
func CheckEndpoint(endpoint string) error {
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%w: telemetry.otlp_endpoint %q is not a URL such as http://127.0.0.1:4318 or grpc://127.0.0.1:4317", ErrInvalidConfig, redactEndpoint(endpoint))
	}
	switch u.Scheme {
	case "http", "https", "grpc", "grpcs":
	default:
		return fmt.Errorf("%w: telemetry.otlp_endpoint %q: the scheme must be http, https, grpc or grpcs", ErrInvalidConfig, redactEndpoint(endpoint))
	}
	return droppedParts("telemetry.otlp_endpoint", endpoint, u)
}

// droppedParts refuses an endpoint URL (u, read from endpoint, named name
// in the message) with a part the OTLP exporters drop without a word:
// credentials, so that the collector would see requests without
// authentication, or a query or fragment. It quotes the endpoint without
// its userinfo; the error wraps ErrInvalidConfig.
//
// An '@' after the host is taken for credentials too: url.Parse ends the
// authority at the first '/', '?' or '#', so that a password or token that
// holds one (base64 does) leaves its end, and the real host, in the path,
// query or fragment, and the exporter would send to a host made of the
// token's first part.
func droppedParts(name, endpoint string, u *url.URL) error {
	switch {
	case u.User != nil || strings.Contains(u.Path, "@") || strings.Contains(u.RawQuery, "@") || strings.Contains(u.Fragment, "@"):
		return fmt.Errorf("%w: %s %q: the OTLP exporters ignore credentials in the URL (an '@' after the host is taken for them) and would send none; "+
			"remove them and set OTEL_EXPORTER_OTLP_HEADERS instead, e.g. OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%%20<base64 of user:password>",
			ErrInvalidConfig, name, redactEndpoint(endpoint))
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Errorf("%w: %s %q: the OTLP exporters ignore a query (?...) or fragment (#...) in the URL; "+
			"remove it (request headers go in OTEL_EXPORTER_OTLP_HEADERS)", ErrInvalidConfig, name, redactEndpoint(endpoint))
	}
	return nil
}

// redactEndpoint returns endpoint with its userinfo, whole, replaced by
// "xxxxx". Not url.URL.Redacted: that keeps the user name, which is the
// token itself in https://TOKEN@host, and it needs a URL that parses,
// while an error message must not quote the credentials of one that does
// not (user:pass@host:4318 without a scheme, a space in the password). The
// userinfo is taken to be all that precedes the last '@' after the scheme,
// not the authority's last '@' that url.Parse reads: a password or token
// may hold '/', '?' or '#', which end the authority for url.Parse (see
// droppedParts). An '@' later in a URL without credentials costs the
// message its host, not a secret.
func redactEndpoint(endpoint string) string {
	prefix, rest := "", endpoint
	if i := strings.Index(endpoint, "://"); i >= 0 {
		prefix, rest = endpoint[:i+len("://")], endpoint[i+len("://"):]
	}
	i := strings.LastIndex(rest, "@")
	if i < 0 {
		return endpoint
	}
	return prefix + "xxxxx" + rest[i:]
}

func wrapExp[E sdktrace.SpanExporter](e E, err error) (sdktrace.SpanExporter, error) {
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	return e, nil
}

// newResource is service.name (overridable by OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES) plus the SDK's own attributes.
func newResource(service string) (*resource.Resource, error) {
	if service == "" {
		service = "jetsink"
	}
	base := resource.NewSchemaless(attribute.String("service.name", service))
	res, err := resource.Merge(resource.Default(), base)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	env, err := resource.New(context.Background(), resource.WithFromEnv())
	if err != nil {
		// A part without "=": the SDK would keep the rest. Refused, as a
		// bad OTEL_TRACES_SAMPLER is, rather than warned of.
		return nil, fmt.Errorf("%w: OTEL_RESOURCE_ATTRIBUTES: %w", ErrInvalidConfig, err)
	}
	res, err = resource.Merge(res, env)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	return res, nil
}

// serviceName is res's service.name.
func serviceName(res *resource.Resource) string {
	v, _ := res.Set().Value("service.name")
	return v.AsString()
}

// Enabled reports whether spans are exported.
func (t *Tracing) Enabled() bool { return t != nil && t.tp != nil }

// Tracer is jetsink's tracer: a no-op one when tracing is off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return noop.NewTracerProvider().Tracer(Scope)
	}
	return t.tracer
}

// Provider is the tracer provider, nil when tracing is off.
func (t *Tracing) Provider() *sdktrace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// Sampler says what decides which messages are traced, for the start-up
// log line.
func (t *Tracing) Sampler() string {
	if !t.Enabled() {
		return "off"
	}
	return t.sampler
}

// SpanStats counts the spans ended so far and where they went; zero when
// tracing is off.
func (t *Tracing) SpanStats() SpanStats {
	if !t.Enabled() {
		return SpanStats{}
	}
	return t.queue.stats()
}

// Flush exports the spans ended so far, within ctx. It returns ctx's error
// or the exporter's.
func (t *Tracing) Flush(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if err := t.tp.ForceFlush(ctx); err != nil {
		return fmt.Errorf("flush spans: %w", err)
	}
	return nil
}

// Shutdown flushes and stops the provider within ctx; spans started later
// are dropped. It returns ctx's error or the exporter's. When ctx ends
// first (a collector that takes the connection and never answers), it
// cancels the export under way and waits up to stopGrace for the exporter
// to shut down, so that no export goes on after Shutdown: the spans not
// exported yet are lost. The errors the SDK reports on its own go to
// Config.Log until Shutdown returns, those of the exports it cuts short
// included (unless an export outlasts stopGrace).
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	// Removed last: the exports cut short below report their errors
	// before the exporter's Shutdown returns, and Shutdown waits for that.
	defer t.logLost() // last: the count of every span the errors above lost
	defer sdkErrs.remove(t.errs)
	// The SDK's Shutdown gives up before it stops anything when its ctx
	// is done on entry, and marks itself shut down all the same, so that
	// no later call does it: the batch processor's goroutine and the
	// exporter would stay. It gets a context that ends only stopGrace
	// after ctx does, once the exports have been cancelled.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, func() {
		t.exp.cancel()
		grace := time.NewTimer(stopGrace)
		defer grace.Stop()
		select {
		case <-grace.C:
			cancel()
		case <-sctx.Done():
		}
	})()
	err := t.tp.Shutdown(sctx)
	if ctx.Err() != nil {
		// The exports were cut short: spans may be lost, whatever the
		// SDK says (it reports export errors on its own, not here).
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("shut down tracing: %w", err)
	}
	return nil
}

// logLost logs, at Warn, the spans that were never exported, if any.
func (t *Tracing) logLost() {
	st := t.queue.stats()
	left := st.Ended - st.Exported - st.ExportFailed - st.Dropped
	if st.Dropped+st.ExportFailed+left == 0 {
		return
	}
	t.queue.logger().LogAttrs(context.Background(), slog.LevelWarn, "spans not exported",
		slog.Uint64("dropped_queue_full", st.Dropped), slog.Uint64("export_failed", st.ExportFailed),
		slog.Uint64("left_at_shutdown", left), slog.Uint64("exported", st.Exported))
}

// stopGrace is how long Shutdown waits for a cancelled export to return and
// the exporter to shut down.
const stopGrace = time.Second

// stoppable is an exporter whose exports cancel cuts short. The batch span
// processor waits for the export under way before it shuts the exporter
// down, whatever its Shutdown's context says, and an OTLP export to a
// collector that never answers ends only when the exporter's timeouts and
// retries run out (30 s and more).
type stoppable struct {
	sdktrace.SpanExporter
	stop   context.Context // cancelled by cancel: Shutdown's ctx ended
	cancel context.CancelFunc
	queue  *spanQueue // counts what is exported; nil in tests that build no queue
}

func newStoppable(exp sdktrace.SpanExporter) *stoppable {
	stop, cancel := context.WithCancel(context.Background())
	return &stoppable{SpanExporter: exp, stop: stop, cancel: cancel}
}

func (s *stoppable) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stop, cancel)()
	if s.queue == nil {
		return s.SpanExporter.ExportSpans(ctx, spans)
	}
	s.queue.taken(len(spans))
	err := s.SpanExporter.ExportSpans(ctx, spans)
	s.queue.exported(len(spans), err)
	return err
}

// sampleRoot decides whether a message without a valid traceparent is
// traced: a random number, where TraceIDRatioBased would read the random
// trace id the SDK is yet to make for it. Nothing else sees that id before
// the decision (jetsink passes no trace context on), so the share kept is
// the same, and an unsampled root costs no span.
func (t *Tracing) sampleRoot() bool {
	switch t.rootBound {
	case 0:
		return false
	case 1 << 63:
		return true
	}
	return rand.Uint64()>>1 < t.rootBound
}

// sampleTrace decides whether the ratio keeps the message whose
// traceparent is tp, whatever tp's sampled flag says (anyParent): from the
// trace id, as sdktrace.TraceIDRatioBased does, so that jetsink keeps the
// traces that a publisher or another service sampling at the same ratio
// keeps; a tp that is not valid makes the message a root (sampleRoot).
func (t *Tracing) sampleTrace(tp string) bool {
	if !validTraceparent(tp) {
		return t.sampleRoot()
	}
	return traceIDLow(tp)>>1 < t.rootBound
}

// StartMessage starts the CONSUMER span "process <pattern>" of one message
// (see SetDestinations),
// to be stored in ev.Span, parented on the publisher's traceparent header
// when there is one. It returns nil, and allocates nothing, when tracing is
// off or the message is not sampled: a traceparent whose sampled flag is
// clear (parent-based), a trace id the ratio does not keep (the samplers
// without parentbased_: sampleTrace), or a root that loses the ratio's
// draw. The span starts at
// ev.Received; whoever settles the message ends it (see EndMessage). ev
// goes by value so that the caller's event does not escape to the heap.
func (t *Tracing) StartMessage(ev pipeline.Event) trace.Span {
	if t == nil || t.tp == nil {
		return nil
	}
	parent := forced
	switch tp := traceparent(ev.Header, ev.Msg); {
	case tp == "":
		if !t.sampleRoot() {
			return nil
		}
		mark(&t.rootSeen)
	case t.anyParent:
		// The ratio decides from the trace id, whatever the publisher
		// did; the span is still its child.
		if !t.sampleTrace(tp) {
			return nil
		}
		if p := t.prop.Extract(context.Background(), carrier(ev.Header, ev.Msg, tp)); trace.SpanContextFromContext(p).IsValid() {
			parent = context.WithValue(p, forceKey{}, true)
		}
	case !sampledFlag(tp):
		return nil // parent-based: the publisher did not sample it
	default:
		parent = t.prop.Extract(context.Background(), carrier(ev.Header, ev.Msg, tp))
		if !trace.SpanContextFromContext(parent).IsValid() {
			if !t.sampleRoot() {
				return nil
			}
			mark(&t.rootSeen)
			parent = forced
		} else {
			mark(&t.parentSeen)
		}
	}
	pattern, name := t.destination(ev.Subject)
	// The strings are copied: consumer/wire's alias the message's one
	// allocation, payload and all, and the span outlives the message's
	// settling (and its hold on max_in_flight_bytes) in the export
	// queue, up to defaultQueueSpans of them.
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", strings.Clone(ev.Subject)),
		attribute.Int("messaging.message.body.size", len(ev.Data)),
		attribute.String("messaging.nats.stream", strings.Clone(ev.Stream)),
		attribute.Int64("messaging.nats.stream_sequence", int64(ev.StreamSeq)),
		attribute.Int64("messaging.nats.delivery_count", int64(ev.Delivered)),
	)
	if pattern != "" {
		attrs = append(attrs, attribute.String("messaging.destination.template", pattern))
	}
	if ev.MsgID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", strings.Clone(ev.MsgID)))
	}
	_, sp := t.tracer.Start(parent, name,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(ev.Received),
		trace.WithAttributes(attrs...))
	return sp
}

// mark sets b, writing only the first time: the workers that trace
// messages then share the flag's cache line without taking it from each
// other.
func mark(b *atomic.Bool) {
	if !b.Load() {
		b.Store(true)
	}
}

// dropAdvice says what makes jetsink sample fewer messages, under the
// sampler in force and for the messages it has traced, for the log line of
// dropped spans. Under parent-based sampling (telemetry.sample_ratio, or a
// parentbased_ OTEL_TRACES_SAMPLER) a message whose publisher sampled it
// is traced whatever the ratio says: only a sampler without parentbased_
// (traceidratio), which applies its ratio to every message, or a
// publisher that samples fewer, makes fewer of those. Under the SDK's own
// sampler (publish) a ratio sampler in force is lowered through its ARG;
// any other is replaced by traceidratio.
func (t *Tracing) dropAdvice() string {
	const sampleAll = "OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG the share of messages to trace, which applies to every message whatever its publisher decided"
	switch {
	case t.sdkSampler && (t.envSampler == "traceidratio" || t.envSampler == "parentbased_traceidratio"):
		return "to sample fewer spans, lower OTEL_TRACES_SAMPLER_ARG (" + t.envSampler + " keeps that share of the traces it starts)"
	case t.sdkSampler && t.envSampler != "":
		return "to sample fewer spans, set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG the share of them to keep (not " + t.envSampler + ")"
	case t.sdkSampler:
		return "to sample fewer spans, set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG the share of them to keep"
	case t.anyParent && t.envSampler == "traceidratio":
		return "to sample fewer messages, lower OTEL_TRACES_SAMPLER_ARG (traceidratio applies it to every message)"
	case t.anyParent:
		return "to sample fewer messages, set " + sampleAll + " (not " + t.envSampler + ")"
	}
	var advice []string
	if t.parentSeen.Load() {
		var why string
		switch t.envSampler {
		case "":
			why = "whatever telemetry.sample_ratio says (parent-based sampling)"
		case "parentbased_traceidratio":
			why = "whatever OTEL_TRACES_SAMPLER_ARG says (parent-based sampling)"
		default: // parentbased_always_on or _off: no ratio to name
			why = "by " + t.envSampler + ", which follows the publisher's decision"
		}
		advice = append(advice, "messages whose publisher sampled them (a traceparent with the sampled flag) are traced "+why+
			": to trace fewer of them, set "+sampleAll+", or sample fewer in the publisher")
	}
	if t.rootSeen.Load() {
		switch t.envSampler {
		case "":
			advice = append(advice, "messages without a traceparent are traced at telemetry.sample_ratio: lower it")
		case "parentbased_traceidratio":
			advice = append(advice, "messages without a traceparent are traced at OTEL_TRACES_SAMPLER_ARG: lower it")
		default:
			advice = append(advice, "messages without a traceparent are all traced ("+t.envSampler+
				"): to trace fewer, set OTEL_TRACES_SAMPLER=parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG the share of them to trace")
		}
	}
	if len(advice) == 0 {
		return "to sample fewer spans, set " + sampleAll
	}
	return strings.Join(advice, "; ")
}

// EndMessage ends ev's life in the process (pipeline.Event.End): its
// hold on the in-flight budget, and its span, if it has one, with how the
// message was settled (see pipeline.Event.EndSpan). Call it once for
// every event; without a span or a budget it is a type check and a nil
// check.
func EndMessage(ev *pipeline.Event, outcome string, err error) { ev.End(outcome, err) }

// StartCopy starts the CLIENT span "copy <table>" of one batch, linked to
// the span of every sampled message in rows up to the span's limit of
// links (the first ones; jetsink.batch.links_dropped counts the rest), or
// returns nil when no message of the batch is sampled (then the batch
// costs one pass over rows). The span is a new root, always kept. The
// caller ends it with EndCopy, after any LinkCopy.
func (t *Tracing) StartCopy(table string, rows []pipeline.Row) trace.Span {
	if t == nil || t.tp == nil {
		return nil
	}
	n := 0
	for i := range rows {
		if rows[i].Event.Span != nil {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	links := make([]trace.Link, 0, min(n, t.maxLinks))
	for i := range rows {
		if sp := rows[i].Event.Span; sp != nil && len(links) < t.maxLinks {
			links = append(links, trace.Link{SpanContext: sp.SpanContext()})
		}
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs,
		attribute.String("db.system.name", "postgresql"),
		attribute.String("db.collection.name", table),
		attribute.String("db.operation.name", "COPY"),
		attribute.String("messaging.system", "nats"),
		attribute.Int("messaging.batch.message_count", len(rows)))
	if n > len(links) {
		// The spans of the messages past the limit are exported, but
		// the batch does not point at them.
		attrs = append(attrs, attribute.Int("jetsink.batch.links_dropped", n-len(links)))
	}
	_, sp := t.tracer.Start(forced, "copy "+table,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithNewRoot(),
		trace.WithLinks(links...),
		trace.WithAttributes(attrs...))
	return &copySpan{Span: sp, links: len(links), dropped: n - len(links)}
}

// copySpan is a batch span with the count of its links, for LinkCopy: at
// its limit, the SDK's AddLink would evict the span's first link (the
// batch's own messages' first) to make room for the new one, shifting its
// queue of links on every add.
type copySpan struct {
	trace.Span
	links   int // links the span holds
	dropped int // sampled messages not linked: jetsink.batch.links_dropped
}

// LinkCopy links the batch span sp to the sampled messages of rows, which
// joined its batch after it started (a committer retrying a batch takes
// the next ones into it), and sets its messaging.batch.message_count to
// total. With sp nil (no message of the batch was sampled) it starts the
// span as StartCopy does, if one of rows is. It returns the span, to be
// passed to the next LinkCopy and to EndCopy.
//
// The span keeps its first links, up to its limit (as StartCopy): the
// batch's own messages, then those taken in, in the order they came; the
// sampled messages past the limit are not linked, and
// jetsink.batch.links_dropped counts them with those StartCopy left out.
// sp is nil or a span StartCopy or LinkCopy returned (another span's links
// are counted as the SDK holds them, at each call); LinkCopy must not be
// called for the same span concurrently.
func (t *Tracing) LinkCopy(sp trace.Span, table string, rows []pipeline.Row, total int) trace.Span {
	if t == nil || t.tp == nil {
		return sp
	}
	if sp == nil {
		sp = t.StartCopy(table, rows)
	} else {
		cs, ok := sp.(*copySpan)
		if !ok {
			// Not StartCopy's: its links as the SDK holds them.
			cs = &copySpan{Span: sp}
			if ro, ok := sp.(sdktrace.ReadOnlySpan); ok {
				cs.links = len(ro.Links())
			}
			sp = cs
		}
		dropped := cs.dropped
		for i := range rows {
			m := rows[i].Event.Span
			switch {
			case m == nil:
			case cs.links < t.maxLinks:
				cs.AddLink(trace.Link{SpanContext: m.SpanContext()})
				cs.links++
			default:
				cs.dropped++
			}
		}
		if cs.dropped != dropped {
			cs.SetAttributes(attribute.Int("jetsink.batch.links_dropped", cs.dropped))
		}
	}
	if sp != nil {
		sp.SetAttributes(attribute.Int("messaging.batch.message_count", total))
	}
	return sp
}

// CopyCounts are a batch's rows as its span reports them at its end
// (EndCopy).
type CopyCounts struct {
	// Settled: the rows acked, stored by the batch or before it
	// (jetsink.batch.rows).
	Settled int
	// Inserted: the rows the batch's commits inserted into the table
	// (db.response.returned_rows).
	Inserted int
	// Duplicates: the rows acked as stored before (exactly-once's
	// redeliveries, which its INSERT skipped): jetsink.batch.duplicates.
	// Negative: not known (at-least-once mode, which stores every row it
	// settles), and the attribute is left out.
	Duplicates int
	// DeadLettered: the rows dead-lettered (jetsink.batch.dead_lettered).
	DeadLettered int
}

// EndCopy ends a batch span from StartCopy (nil does nothing) with its
// rows (n), the bytes committed, the attempts retried and the error that
// stopped it, if any.
func EndCopy(sp trace.Span, n CopyCounts, bytes int, retries uint64, err error) {
	if sp == nil {
		return
	}
	sp.SetAttributes(
		attribute.Int("db.response.returned_rows", n.Inserted),
		attribute.Int("jetsink.batch.rows", n.Settled),
		attribute.Int("jetsink.batch.bytes", bytes),
		attribute.Int64("jetsink.batch.retries", int64(retries)),
		attribute.Int("jetsink.batch.dead_lettered", n.DeadLettered),
	)
	if n.Duplicates >= 0 {
		sp.SetAttributes(attribute.Int("jetsink.batch.duplicates", n.Duplicates))
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// traceparent returns the message's traceparent header: "traceparent" as
// W3C and most NATS clients write it, "Traceparent" as
// propagation.HeaderCarrier does, or the key in any other case, as Carrier
// finds it for Extract. With h nil the headers are msg's own
// (pipeline.RawHeader). It allocates nothing unless the key is in another
// case.
func traceparent(h map[string][]string, msg pipeline.Msg) string {
	if h == nil {
		return rawHeaderFold(msg, "traceparent")
	}
	if v := h["traceparent"]; len(v) > 0 {
		return v[0]
	}
	if v := h["Traceparent"]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(k) == len("traceparent") && len(v) > 0 && strings.EqualFold(k, "traceparent") {
			return v[0]
		}
	}
	return ""
}

// rawHeaderFold returns the first value of key in msg's header block, if
// msg is a pipeline.RawHeader: matched exactly, or else ignoring case.
func rawHeaderFold(msg pipeline.Msg, key string) string {
	rh, ok := msg.(pipeline.RawHeader)
	if !ok {
		return ""
	}
	return rh.HeaderFold(key)
}

// carrier is what Extract reads a sampled message's trace context from: h,
// or, h nil, the traceparent tp and tracestate of msg's own header block.
func carrier(h map[string][]string, msg pipeline.Msg, tp string) Carrier {
	if h != nil {
		return Carrier(h)
	}
	c := Carrier{"traceparent": {tp}}
	if ts := rawHeaderFold(msg, "tracestate"); ts != "" {
		c["tracestate"] = []string{strings.Clone(ts)} // the span context keeps it: see StartMessage
	}
	return c
}

// sampledFlag reads the sampled bit of a valid version-00 traceparent
// ("00-<32 hex>-<16 hex>-<2 hex>", ids not all zero, lower-case hex). A
// value of another shape, or an invalid one, counts as sampled so that
// Extract decides: it drops an invalid value, and the message is then
// sampled as a root is (W3C Trace Context: a receiver that cannot parse
// traceparent starts a new trace), whatever its sampled bit says.
//
// Version 00 has exactly 55 characters and flags up to 03 (the otel
// propagator refuses others); a later version may add fields after a '-'.
func sampledFlag(tp string) bool { return !validTraceparent(tp) || unhex(tp[54])&1 == 1 }

// validTraceparent reports whether tp is a traceparent that Extract takes:
// "<version>-<32 hex>-<16 hex>-<2 hex>", version not ff, ids not all zero,
// lower-case hex (see sampledFlag).
func validTraceparent(tp string) bool {
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || !isHex(tp[:2]) || tp[:2] == "ff" || !isHex(tp[53:55]) {
		return false
	}
	// The ids as the propagator reads them: lower-case hex, not all zero.
	if _, err := trace.TraceIDFromHex(tp[3:35]); err != nil {
		return false
	}
	if _, err := trace.SpanIDFromHex(tp[36:52]); err != nil {
		return false
	}
	return !(tp[:2] == "00" && (len(tp) != 55 || tp[53] != '0' || unhex(tp[54]) > 3) || len(tp) > 55 && tp[55] != '-')
}

// traceIDLow is the last 8 bytes of the trace id of tp, a valid
// traceparent (validTraceparent), big-endian, as sdktrace.TraceIDRatioBased
// reads them (binary.BigEndian.Uint64(traceID[8:16])), decoded from its 16
// hex digits without allocating.
func traceIDLow(tp string) uint64 {
	var v uint64
	for i := 19; i < 35; i++ {
		v = v<<4 | uint64(unhex(tp[i]))
	}
	return v
}

// isHex reports whether s is lower-case hex digits.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if unhex(s[i]) > 15 {
			return false
		}
	}
	return true
}

// unhex is c's value as a lower-case hex digit, 255 if it is none.
func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return 255
}

// Carrier adapts NATS headers (nats.Header's underlying map) to
// propagation.TextMapCarrier. Set writes the key as the propagator names it
// (lower case: "traceparent", "tracestate", as other NATS clients expect,
// NATS headers being case-sensitive); Get finds a key in that form or in
// the canonical MIME form ("Traceparent") that propagation.HeaderCarrier
// writes.
type Carrier map[string][]string

// Get returns the first value of key, "" if absent.
func (c Carrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces key's values with value.
func (c Carrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the keys.
func (c Carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// InjectTrace writes ctx's span context into NATS headers h as W3C
// traceparent/tracestate, so that jetsink parents its process span on the
// publisher's span. h must be non-nil (nats.Header{} or msg.Header). It
// first removes the traceparent and tracestate h had, in any case, so that
// headers taken over from another message carry no part of its trace; it
// writes nothing, and removes nothing, when ctx carries no valid span
// context. Any Go publisher can do the same:
//
//	msg := nats.NewMsg(subject)
//	telemetry.InjectTrace(ctx, msg.Header)
//	// or, without jetsink: propagation.TraceContext{}.Inject(ctx, telemetry.Carrier(msg.Header))
func InjectTrace(ctx context.Context, h map[string][]string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	for k := range h {
		if strings.EqualFold(k, "traceparent") || strings.EqualFold(k, "tracestate") {
			delete(h, k)
		}
	}
	propagation.TraceContext{}.Inject(ctx, Carrier(h))
}

// ExtractTrace returns ctx with the span context found in NATS headers h
// (as InjectTrace or propagation.HeaderCarrier wrote it), or ctx unchanged.
func ExtractTrace(ctx context.Context, h map[string][]string) context.Context {
	return propagation.TraceContext{}.Extract(ctx, Carrier(h))
}

// Acked adds an "ack" event to a batch span (nil does nothing): n messages
// acked after the commit, failed of them refused by the server.
func Acked(sp trace.Span, n, failed int) {
	if sp == nil {
		return
	}
	sp.AddEvent("ack", trace.WithAttributes(
		attribute.Int("messaging.batch.message_count", n),
		attribute.Int("jetsink.ack.failed", failed)))
}

// CopyRetry adds a "retry" event to the batch span sp (nil does nothing):
// an attempt to commit the batch failed, and the batch is retried. The
// caller adds one at the batch's first failure and then as often as it logs
// that the batch still fails, not at every attempt. errType is the
// failure's error.type (a SQLSTATE, or a kind: "connect", "timeout",
// "_OTHER"), sqlstate the server's SQLSTATE if it answered with one
// (db.response.status_code), attempts the attempts made so far
// (jetsink.batch.attempts).
func CopyRetry(sp trace.Span, errType, sqlstate string, attempts int) {
	if sp == nil {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, attribute.String("error.type", errType), attribute.Int("jetsink.batch.attempts", attempts))
	if sqlstate != "" {
		attrs = append(attrs, attribute.String("db.response.status_code", sqlstate))
	}
	sp.AddEvent("retry", trace.WithAttributes(attrs...))
}

package telemetrytest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Span is a span as the collector received it.
type Span struct {
	Name     string
	TraceID  string // hex
	SpanID   string // hex
	ParentID string // hex; empty for a root span
	// Attributes are the span's, values as text; Resource its resource's.
	Attributes, Resource map[string]string
	// Links are the spans it links to, as trace id (hex) "-" span id (hex).
	Links []string
	// Texts are every string the span carries besides its name: attribute
	// values, event names and attributes, the status message, link
	// attributes.
	Texts []string
}

// Collector keeps the spans exported to it. Safe for concurrent use.
type Collector struct {
	// Endpoint is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string

	mu    sync.Mutex
	spans []Span
}

// NewHTTP starts a collector serving OTLP/HTTP with protobuf bodies.
func NewHTTP(t testing.TB) *Collector {
	c := &Collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req collectorpb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "want an OTLP protobuf export on /v1/traces", http.StatusBadRequest)
			return
		}
		c.add(&req)
		b, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	c.Endpoint = srv.URL
	return c
}

// NewGRPC starts a collector serving OTLP/gRPC, without TLS.
func NewGRPC(t testing.TB) *Collector {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &Collector{Endpoint: "http://" + lis.Addr().String()}
	g := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(g, grpcService{c: c})
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return c
}

type grpcService struct {
	collectorpb.UnimplementedTraceServiceServer
	c *Collector
}

func (s grpcService) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	s.c.add(req)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// Spans returns the spans received so far, in the order received.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

func (c *Collector) add(req *collectorpb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := texts(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, convert(s, res))
			}
		}
	}
}

func convert(s *tracepb.Span, res map[string]string) Span {
	out := Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
		ParentID: hex.EncodeToString(s.GetParentSpanId()), Attributes: texts(s.GetAttributes()), Resource: res}
	for _, v := range out.Attributes {
		out.Texts = append(out.Texts, v)
	}
	for _, e := range s.GetEvents() {
		out.Texts = append(out.Texts, e.GetName())
		for _, v := range texts(e.GetAttributes()) {
			out.Texts = append(out.Texts, v)
		}
	}
	for _, l := range s.GetLinks() {
		out.Links = append(out.Links, hex.EncodeToString(l.GetTraceId())+"-"+hex.EncodeToString(l.GetSpanId()))
		for _, v := range texts(l.GetAttributes()) {
			out.Texts = append(out.Texts, v)
		}
	}
	out.Texts = append(out.Texts, s.GetStatus().GetMessage())
	return out
}

func texts(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = text(kv.GetValue())
	}
	return m
}

func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case nil:
		return ""
	default:
		return protojson.Format(v)
	}
}

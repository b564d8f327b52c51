package egress_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/connector-svc/connector-svc/internal/egress"
	"github.com/connector-svc/connector-svc/internal/egress/egresstest"
)

// wantDenied checks that err is a refusal by the rule on prefix rule, or,
// if rule is empty, that err is nil.
func wantDenied(t *testing.T, what string, err error, rule string) {
	t.Helper()
	var d *egress.DeniedError
	switch {
	case rule == "" && err != nil:
		t.Errorf("%s: %v, want allowed", what, err)
	case rule == "":
	case !errors.Is(err, egress.ErrDenied) || !errors.As(err, &d):
		t.Errorf("%s: %v, want denied by %s", what, err, rule)
	case d.Rule.Prefix.String() != rule:
		t.Errorf("%s: denied by %s, want %s", what, d.Rule.Prefix, rule)
	case !strings.Contains(err.Error(), rule):
		t.Errorf("%s: message %q does not name the rule", what, err)
	}
}

func TestDefaults(t *testing.T) {
	p := egress.New(egress.Config{})
	for addr, rule := range map[string]string{
		"169.254.169.254":        "169.254.0.0/16",
		"169.254.170.2":          "169.254.0.0/16",
		"::ffff:169.254.169.254": "169.254.0.0/16", // IPv4-mapped
		"64:ff9b::a9fe:a9fe":     "169.254.0.0/16", // NAT64 of 169.254.169.254
		"fe80::1":                "fe80::/10",
		"fe80::1%eth0":           "fe80::/10", // a zone does not hide it
		"fd00:ec2::254":          "fd00:ec2::254/128",
		"fd20:ce::254":           "fd20:ce::254/128",
		"100.100.100.200":        "100.100.100.200/32",
		"168.63.129.16":          "168.63.129.16/32",
		"0.0.0.0":                "0.0.0.0/8",
		"0.1.2.3":                "0.0.0.0/8",
		"::":                     "::/128",
		"127.0.0.1":              "", // loopback: local MCP servers and sidecars
		"::1":                    "",
		"::ffff:127.0.0.1":       "",
		"10.1.2.3":               "", // private networks: MCP servers in the same VPC
		"192.168.1.1":            "",
		"8.8.8.8":                "",
		"fd00:ec2::253":          "", // next to a metadata address, not one
		"64:ff9b::808:808":       "",
		"100.100.100.201":        "",
	} {
		wantDenied(t, addr, p.Check(netip.MustParseAddr(addr)), rule)
	}
	if err := p.Check(netip.Addr{}); !errors.Is(err, egress.ErrDenied) {
		t.Errorf("Check(zero Addr) = %v, want denied", err)
	}
}

func TestOperatorLists(t *testing.T) {
	p := egress.New(egress.Config{
		Allow: egresstest.Prefixes(t, "169.254.170.2, 0.0.0.0/8, 127.0.0.1"),
		Deny:  egresstest.Prefixes(t, "127.0.0.0/8, ::1, ::ffff:10.0.0.0/104"),
	})
	for addr, rule := range map[string]string{
		"169.254.170.2":    "",               // the allow entry opens exactly that address
		"169.254.169.254":  "169.254.0.0/16", // but not its neighbours
		"0.0.0.0":          "",
		"127.0.0.1":        "127.0.0.0/8", // deny wins over allow
		"127.9.9.9":        "127.0.0.0/8",
		"::ffff:127.0.0.1": "127.0.0.0/8",
		"::1":              "::1/128",
		"10.9.8.7":         "10.0.0.0/8", // a mapped CIDR is read as IPv4
		"192.168.0.1":      "",
	} {
		wantDenied(t, addr, p.Check(netip.MustParseAddr(addr)), rule)
	}
	var d *egress.DeniedError
	if !errors.As(p.Check(netip.MustParseAddr("127.0.0.1")), &d) || d.Rule.Default {
		t.Errorf("a deny-list refusal = %+v, want Rule.Default false", d)
	}
	if !errors.As(p.Check(netip.MustParseAddr("169.254.169.254")), &d) || !d.Rule.Default {
		t.Errorf("a default refusal = %+v, want Rule.Default true", d)
	}
}

func TestCheckHost(t *testing.T) {
	dns := egresstest.NewResolver()
	dns.Set("metadata.test", "169.254.169.254")
	dns.Set("mixed.test", "93.184.216.34", "fd00:ec2::254")
	dns.Set("good.test", "93.184.216.34", "2606:2800:220:1::1")
	p := egress.New(egress.Config{Resolver: dns})
	ctx := context.Background()

	wantDenied(t, "metadata.test", p.CheckHost(ctx, "metadata.test"), "169.254.0.0/16")
	wantDenied(t, "mixed.test", p.CheckHost(ctx, "mixed.test"), "fd00:ec2::254/128")
	wantDenied(t, "good.test", p.CheckHost(ctx, "good.test"), "")
	wantDenied(t, "a literal", p.CheckHost(ctx, "169.254.169.254"), "169.254.0.0/16")
	if n := dns.Lookups("169.254.169.254"); n != 0 {
		t.Errorf("a literal address was looked up %d times", n)
	}
	err := p.CheckHost(ctx, "metadata.test")
	if !strings.Contains(err.Error(), "metadata.test (169.254.169.254)") {
		t.Errorf("message %q does not name the host and the address", err)
	}
	err = p.CheckHost(ctx, "nowhere.test")
	var dnsErr *net.DNSError
	if errors.Is(err, egress.ErrDenied) || !errors.As(err, &dnsErr) {
		t.Errorf("CheckHost(unknown host) = %v, want the resolver's error, not a refusal", err)
	}
}

// listen accepts connections on loopback and counts them.
func listen(t *testing.T) (port string, accepted <-chan struct{}) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
			ch <- struct{}{}
		}
	}()
	_, port, _ = net.SplitHostPort(lis.Addr().String())
	return port, ch
}

func TestDialContextDialsWhatItChecked(t *testing.T) {
	port, accepted := listen(t)
	dns := egresstest.NewResolver()
	dns.Set("mcp.test", "127.0.0.1")
	dial := egress.New(egress.Config{Resolver: dns}).DialContext(&net.Dialer{Timeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// mcp.test exists only in the fake DNS: connecting proves the dial went
	// to the address checked, not to the name resolved again.
	c, err := dial(ctx, "tcp", net.JoinHostPort("mcp.test", port))
	if err != nil {
		t.Fatalf("dial mcp.test: %v", err)
	}
	c.Close()
	<-accepted

	// The name now answers with the metadata address, as after a DNS
	// rebinding: refused before any socket is opened.
	dns.Set("mcp.test", "169.254.169.254")
	_, err = dial(ctx, "tcp", net.JoinHostPort("mcp.test", port))
	wantDenied(t, "after rebinding", err, "169.254.0.0/16")
	if err != nil && !strings.Contains(err.Error(), "mcp.test (169.254.169.254)") {
		t.Errorf("message %q does not name the host and the address", err)
	}
	// One good address beside a refused one does not make it through.
	dns.Set("mcp.test", "127.0.0.1", "169.254.169.254")
	_, err = dial(ctx, "tcp", net.JoinHostPort("mcp.test", port))
	wantDenied(t, "a mixed answer", err, "169.254.0.0/16")
	if n := dns.Lookups("mcp.test"); n != 3 {
		t.Errorf("mcp.test looked up %d times for 3 dials, want 3", n)
	}

	// Unresolvable: the resolver's error, not a refusal.
	_, err = dial(ctx, "tcp", net.JoinHostPort("nowhere.test", port))
	if err == nil || errors.Is(err, egress.ErrDenied) {
		t.Errorf("dial nowhere.test = %v, want a lookup error", err)
	}
}

func TestDialContextTriesEachAddress(t *testing.T) {
	port, accepted := listen(t)
	dns := egresstest.NewResolver()
	// 127.0.0.2 refuses the connection (nothing listens there); the next
	// address answers.
	dns.Set("two.test", "127.0.0.2", "127.0.0.1")
	dial := egress.New(egress.Config{Resolver: dns}).DialContext(&net.Dialer{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", net.JoinHostPort("two.test", port))
	if err != nil {
		t.Fatalf("dial two.test: %v", err)
	}
	c.Close()
	<-accepted
}

func TestControlChecksTheResolvedAddress(t *testing.T) {
	port, accepted := listen(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The system resolver answers "localhost"; Control sees the address
	// it resolved to, whatever the name.
	open := &net.Dialer{ControlContext: egress.New(egress.Config{}).Control}
	c, err := open.DialContext(ctx, "tcp4", net.JoinHostPort("localhost", port))
	if err != nil {
		t.Fatalf("dial localhost with the default policy: %v", err)
	}
	c.Close()
	<-accepted

	closed := &net.Dialer{ControlContext: egress.New(egress.Config{Deny: egresstest.Prefixes(t, "127.0.0.0/8")}).Control}
	_, err = closed.DialContext(ctx, "tcp4", net.JoinHostPort("localhost", port))
	wantDenied(t, "localhost with loopback denied", err, "127.0.0.0/8")

	if err := egress.New(egress.Config{}).Control(ctx, "tcp", "not an address", nil); !errors.Is(err, egress.ErrDenied) {
		t.Errorf("Control(unparsable address) = %v, want denied", err)
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := egress.ParsePrefixes(" 10.0.0.0/8, ,192.168.1.7,fd00::/8 , ::1,")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.7/32", "fd00::/8", "::1/128"}
	var gotS []string
	for _, p := range got {
		gotS = append(gotS, p.String())
	}
	if diff := cmp.Diff(want, gotS); diff != "" {
		t.Errorf("ParsePrefixes (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "fe80::1%eth0", "10.0.0.0/8;", "1.2.3"} {
		if _, err := egress.ParsePrefixes(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParsePrefixes(%q) = %v, want an error naming it", bad, err)
		}
	}
	if got, err := egress.ParsePrefixes(""); err != nil || len(got) != 0 {
		t.Errorf("ParsePrefixes(\"\") = %v, %v; want nothing", got, err)
	}
}

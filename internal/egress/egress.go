// Package egress decides which network addresses the service's HTTP
// connectors may connect to, and enforces it where connections are made: on
// the address actually dialed, after name resolution, so that a DNS answer
// that changes later (rebinding) cannot lead a connector somewhere its
// create-time check would have refused.
//
// By default it refuses link-local addresses and the cloud metadata
// services (where instance credentials are handed out) and the unspecified
// addresses, which the kernel connects to this host. An operator adds
// ranges to refuse (deny list) and opens default-refused ranges (allow
// list). The deny list always wins; an allow entry opens every default
// rule it covers; anything else is allowed.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// ErrDenied means the policy refuses an address. Errors wrapping it are
// *DeniedError and name the address and the rule.
var ErrDenied = errors.New("egress denied")

// Rule is a range the policy refuses, and why.
type Rule struct {
	Prefix netip.Prefix
	Reason string
	// Default is true for the built-in rules, which an allow entry can
	// open, and false for the operator's deny list, which nothing opens.
	Default bool
}

// DeniedError is an address the policy refused, with the rule that did.
type DeniedError struct {
	Host string     // the host as named (a name or a literal address)
	Addr netip.Addr // the address refused
	Rule Rule
}

func (e *DeniedError) Error() string {
	target := e.Addr.String()
	if e.Host != "" && e.Host != target {
		target = e.Host + " (" + target + ")"
	}
	return fmt.Sprintf("egress to %s denied by rule %s: %s", target, e.Rule.Prefix, e.Rule.Reason)
}

// Unwrap makes errors.Is(err, ErrDenied) true.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// defaultRules are refused unless an allow entry covers them. Sources:
// RFC 3927 and RFC 4291 (link-local), RFC 1122 §3.2.1.3 (this host), and
// each provider's documentation of its metadata endpoints.
var defaultRules = []Rule{
	// 169.254.169.254 on AWS, GCP, Azure, OCI, DigitalOcean, OpenStack;
	// 169.254.170.2 and .23 for AWS ECS and EKS credentials; Tencent's
	// 169.254.0.23, Scaleway's 169.254.42.42.
	rule("169.254.0.0/16", "link-local, where cloud metadata services answer"),
	rule("fe80::/10", "IPv6 link-local"),
	rule("fd00:ec2::254/128", "AWS instance metadata (IPv6)"),
	rule("fd00:ec2::23/128", "AWS EKS Pod Identity credentials (IPv6)"),
	rule("fd20:ce::254/128", "GCP metadata (IPv6)"),
	rule("fd00:42::42/128", "Scaleway metadata (IPv6)"),
	rule("100.100.100.200/32", "Alibaba Cloud metadata"),
	rule("168.63.129.16/32", "Azure WireServer, the host platform's endpoint"),
	rule("192.0.0.192/32", "Oracle Cloud Classic metadata"),
	// Linux connects 0.0.0.0 and :: to the local host: left open, they
	// would reach loopback even where an operator denies 127.0.0.0/8.
	rule("0.0.0.0/8", "this host: 0.0.0.0 reaches the local machine"),
	rule("::/128", "unspecified: :: reaches the local machine"),
}

func rule(cidr, reason string) Rule {
	return Rule{Prefix: netip.MustParsePrefix(cidr), Reason: reason, Default: true}
}

// nat64 is the well-known NAT64 prefix (RFC 6052): 64:ff9b::a9fe:a9fe is
// 169.254.169.254 by another name where a NAT64 gateway translates it.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Resolver looks up a host's addresses. *net.Resolver implements it; tests
// give a fake.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config is a policy's operator settings.
type Config struct {
	// Allow opens the default-refused addresses it covers.
	Allow []netip.Prefix
	// Deny refuses what it covers, whatever Allow says.
	Deny []netip.Prefix
	// Resolver resolves host names, at check and at dial time; nil means
	// net.DefaultResolver.
	Resolver Resolver
}

// Policy is an egress policy. It is immutable and safe for concurrent use.
type Policy struct {
	allow, deny []netip.Prefix
	resolver    Resolver
}

// New returns the policy of cfg.
func New(cfg Config) *Policy {
	p := &Policy{allow: normalize(cfg.Allow), deny: normalize(cfg.Deny), resolver: cfg.Resolver}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	return p
}

// normalize masks each prefix and writes IPv4-mapped ones as IPv4, since
// addresses are checked in that form.
func normalize(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}

// Check returns a *DeniedError if the policy refuses addr. An IPv4-mapped
// IPv6 address is checked as its IPv4 address, a NAT64 one (64:ff9b::/96)
// as itself and as the IPv4 address it embeds, and a zone is ignored.
func (p *Policy) Check(addr netip.Addr) error {
	if d := p.denied(addr); d != nil {
		return d
	}
	return nil
}

func (p *Policy) denied(addr netip.Addr) *DeniedError {
	if !addr.IsValid() {
		return &DeniedError{Addr: addr, Rule: Rule{Reason: "not an IP address"}}
	}
	a := addr.WithZone("").Unmap()
	forms := []netip.Addr{a}
	if nat64.Contains(a) {
		b := a.As16()
		forms = append(forms, netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, f := range forms {
		if r, denied := p.verdict(f); denied {
			return &DeniedError{Addr: addr, Rule: r}
		}
	}
	return nil
}

// verdict applies the rules to one address: the deny list, then the allow
// list, then the defaults.
func (p *Policy) verdict(a netip.Addr) (Rule, bool) {
	for _, pr := range p.deny {
		if pr.Contains(a) {
			return Rule{Prefix: pr, Reason: "on the operator's egress deny list"}, true
		}
	}
	for _, pr := range p.allow {
		if pr.Contains(a) {
			return Rule{}, false
		}
	}
	for _, r := range defaultRules {
		if r.Prefix.Contains(a) {
			return r, true
		}
	}
	return Rule{}, false
}

// CheckHost resolves host (a literal address is checked as it is) and
// returns a *DeniedError if the policy refuses any of its addresses: a
// name that answers with a refused address among good ones is refused, at
// check time as at dial time. A host that does not resolve returns the
// resolver's error, which does not wrap ErrDenied.
func (p *Policy) CheckHost(ctx context.Context, host string) error {
	addrs, err := p.resolve(ctx, "ip", host)
	if err != nil {
		return err
	}
	return p.checkAll(host, addrs)
}

func (p *Policy) checkAll(host string, addrs []netip.Addr) error {
	for _, a := range addrs {
		if d := p.denied(a); d != nil {
			d.Host = host
			return d
		}
	}
	return nil
}

func (p *Policy) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := p.resolver.LookupNetIP(ctx, network, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// Control is a net.Dialer ControlContext function: it refuses to connect a
// socket to an address the policy refuses. address is the resolved
// "ip:port" being connected; one that does not parse is refused.
func (p *Policy) Control(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot check the address %q", ErrDenied, address)
	}
	return p.Check(ap.Addr())
}

// DialContext returns a dial function for an http.Transport that resolves
// the host with the policy's resolver, refuses it if any of its addresses
// is refused, and otherwise dials the checked addresses themselves, in
// turn, with d, never the name again: what was checked is what is
// connected. d's ControlContext is replaced by Control, which checks every
// socket once more. Refusals are *net.OpError wrapping a *DeniedError.
func (p *Policy) DialContext(d *net.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	guarded := *d
	guarded.ControlContext = p.Control
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(address)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		addrs, err := p.resolve(ctx, ipNetwork(network), host)
		if err == nil {
			err = p.checkAll(host, addrs)
		}
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return dialEach(ctx, &guarded, network, addrs, port)
	}
}

func ipNetwork(network string) string {
	switch {
	case strings.HasSuffix(network, "4"):
		return "ip4"
	case strings.HasSuffix(network, "6"):
		return "ip6"
	}
	return "ip"
}

// minAttempt is the least time one address gets while others remain, as
// in package net.
const minAttempt = 2 * time.Second

// dialEach dials addrs in turn until one connects. While more addresses
// remain, one gets its share of the time left before ctx's deadline, so a
// silent first address does not use up all of it.
func dialEach(ctx context.Context, d *net.Dialer, network string, addrs []netip.Addr, port string) (net.Conn, error) {
	var first error
	for i, a := range addrs {
		attempt, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && i < len(addrs)-1 {
			left := time.Until(deadline)
			share := max(left/time.Duration(len(addrs)-i), min(minAttempt, left))
			attempt, cancel = context.WithTimeout(ctx, share)
		}
		c, err := d.DialContext(attempt, network, net.JoinHostPort(a.Unmap().String(), port))
		cancel()
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// ParsePrefixes reads a comma-separated list of CIDR ranges and single
// addresses (a host range: 10.0.0.1 is 10.0.0.1/32). Empty entries are
// skipped.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not a CIDR range (10.0.0.0/8) or an IP address", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

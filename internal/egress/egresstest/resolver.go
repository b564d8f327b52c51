// Package egresstest gives tests a DNS they control: a Resolver whose
// answers a test sets and changes, as a DNS rebinding attacker would.
// Prefixes reads CIDR lists as the operator's settings do.
package egresstest

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/connector-svc/connector-svc/internal/egress"
)

// Resolver answers each host with the addresses last set for it, and
// every other host with "no such host". Safe for concurrent use.
type Resolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	lookups map[string]int
}

// NewResolver returns a Resolver that knows no host.
func NewResolver() *Resolver {
	return &Resolver{answers: map[string][]netip.Addr{}, lookups: map[string]int{}}
}

// Set makes host resolve to addrs (none: "no such host"). It panics on an
// address that does not parse.
func (r *Resolver) Set(host string, addrs ...string) {
	as := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		as[i] = netip.MustParseAddr(a)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[host] = as
}

// Lookups is how many times host was looked up.
func (r *Resolver) Lookups(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups[host]
}

// LookupNetIP implements egress.Resolver. network "ip4" and "ip6" keep
// only addresses of that family.
func (r *Resolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups[host]++
	var out []netip.Addr
	for _, a := range r.answers[host] {
		if network == "ip" || (network == "ip4") == a.Unmap().Is4() {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

// Prefixes parses a comma-separated CIDR list as the operator's settings
// do (egress.ParsePrefixes), failing t if it does not parse.
func Prefixes(t testing.TB, s string) []netip.Prefix {
	t.Helper()
	ps, err := egress.ParsePrefixes(s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

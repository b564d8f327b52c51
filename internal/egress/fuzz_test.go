package egress_test

import (
	"net/netip"
	"testing"

	"github.com/connector-svc/connector-svc/internal/egress"
)

// FuzzCheckForms checks that an IPv4 address gets the same verdict in each
// of its IPv6 spellings (a refused address must not slip through as
// ::ffff:a.b.c.d or 64:ff9b::a.b.c.d), whatever the operator's lists.
func FuzzCheckForms(f *testing.F) {
	f.Add([]byte{169, 254, 169, 254}, "", "")
	f.Add([]byte{127, 0, 0, 1}, "", "127.0.0.0/8")
	f.Add([]byte{0, 0, 0, 0}, "0.0.0.0/8", "")
	f.Add([]byte{169, 254, 170, 2}, "169.254.170.2", "::ffff:169.254.0.0/112")
	f.Add([]byte{10, 1, 2, 3}, "::/0", "10.0.0.0/8,fd00::/8")
	f.Fuzz(func(t *testing.T, b []byte, allow, deny string) {
		if len(b) < 4 {
			return
		}
		a, errA := egress.ParsePrefixes(allow)
		d, errD := egress.ParsePrefixes(deny)
		if errA != nil || errD != nil {
			return
		}
		p := egress.New(egress.Config{Allow: a, Deny: d})
		v4 := netip.AddrFrom4([4]byte(b[:4]))
		mapped := netip.AddrFrom16(v4.As16())
		n := netip.MustParseAddr("64:ff9b::").As16()
		copy(n[12:], b[:4])
		nat := netip.AddrFrom16(n)

		allowed := p.Check(v4) == nil
		if got := p.Check(mapped) == nil; got != allowed {
			t.Errorf("%s allowed=%v but %s allowed=%v", v4, allowed, mapped, got)
		}
		if !allowed && p.Check(nat) == nil {
			t.Errorf("%s is refused but its NAT64 form %s is allowed", v4, nat)
		}
	})
}

package main

import "testing"

// An IPv6 pod's "$(POD_IP):50052" becomes an address a dialer reads; IPv4
// addresses, names and bracketed ones stay as they are.
func TestBracketIPv6(t *testing.T) {
	for in, want := range map[string]string{
		"fd00::5:50052":     "[fd00::5]:50052",
		"[fd00::5]:50052":   "[fd00::5]:50052",
		"10.0.0.5:50052":    "10.0.0.5:50052",
		"replica-a:50052":   "replica-a:50052",
		"2001:db8::1:50052": "[2001:db8::1]:50052",
	} {
		if got := bracketIPv6(in); got != want {
			t.Errorf("bracketIPv6(%q) = %q, want %q", in, got, want)
		}
	}
}

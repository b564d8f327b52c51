package cluster

import (
	"hash/fnv"
	"strconv"
)

// Owner returns the member that should own key among members, by
// rendezvous (highest random weight) hashing: every replica that knows the
// same members computes the same owner, and a member joining or leaving
// moves only about 1/M of the keys (those it wins or held). Returns "" when
// members is empty. The order of members does not matter.
func Owner(key string, members []string) string {
	var best string
	var bestWeight uint64
	for _, m := range members {
		w := weight(key, m)
		if best == "" || w > bestWeight || (w == bestWeight && m > best) {
			best, bestWeight = m, w
		}
	}
	return best
}

// ConnectorKey is the rendezvous key of a connector's row id.
func ConnectorKey(id int64) string { return strconv.FormatInt(id, 10) }

// weight is a 64-bit hash of (key, member), stable across processes and
// versions: FNV-1a, then SplitMix64's finalizer, which spreads FNV's weak
// high bits over the whole word.
func weight(key, member string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(member))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

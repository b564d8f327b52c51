// Package cluster owns how several replicas of the service share one
// Postgres database: which replicas are alive (Membership), which one leads
// the housekeeping that must run once (Elector), and which replica owns
// each connector's owned work (Owners). Postgres is the only coordinator:
// rows with expiries by its clock, and notifications on store.ClusterChannel.
//
// A replica is live while its row's expiry, moved forward on every
// heartbeat, is ahead. Ownership of a connector follows rendezvous hashing
// over the live replicas (Owner), made real by a row with an epoch that
// fences the owner's writes (store.Fence): the hash says who should own,
// the row says who does. A joining replica takes about 1/M of the
// connectors, released by their former owners; a replica that stops
// releases everything at once (Owners.ReleaseAll); one that dies is taken
// over once its row expires, after one TTL.
//
// The package opens no LISTEN connection: the service's one listener passes
// every payload of store.ClusterChannel to Notified of each part, and
// Notified("") after each (re)LISTEN, since notifications sent meanwhile are
// lost.
//
// Each part has a blocking Run(ctx) and starts no goroutine elsewhere.
// Hooks (OnChange, OnLost, OnLead, OnGained, OnLostOwnership) are set before
// Run and are called from Run's goroutine: they must return quickly and must
// not call back into the part that calls them.
package cluster

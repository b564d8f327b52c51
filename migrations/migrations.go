// Package migrations holds the service's schema as plain SQL files, embedded
// so that the binary and the tests apply the same migrations.
package migrations

import "embed"

// FS holds the numbered migration files (NNN_name.sql, tern format).
//
//go:embed *.sql
var FS embed.FS

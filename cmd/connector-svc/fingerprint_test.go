package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/connector-svc/connector-svc/internal/store/storetest"
)

// Two replicas on one database whose LLM_MODEL differs: the one that
// joins second warns, naming LLM_MODEL and the other replica; the other
// warns within a heartbeat. The rows hold hashes of the settings, never a
// value.
func TestReplicaSettingsDiffer(t *testing.T) {
	url := storetest.NewURL(t)
	const llm = "http://127.0.0.1:9/v1?key=url-PLANTED-9e1f"
	env := func(model string) map[string]string {
		return map[string]string{"SECRET_KEY": testKey, "LLM_BASE_URL": llm, "LLM_MODEL": model, "LLM_API_KEY": "api-PLANTED-41c7",
			"REPLICA_TTL": "3s", "STDIO_ALLOWED_COMMANDS": "cmd-PLANTED-77"}
	}
	a := start(t, url, env("model-PLANTED-a"), "-replica-id", "replica-a")
	b := start(t, url, env("model-PLANTED-b"), "-replica-id", "replica-b")
	for name, svc := range map[string]*service{"replica-b": b, "replica-a": a} {
		other := map[string]string{"replica-a": "replica-b", "replica-b": "replica-a"}[name]
		if !poll(10*time.Second, func() bool { return strings.Contains(settingsWarning(svc.out.String()), `"other_replica":"`+other+`"`) }) {
			t.Fatalf("%s logged no warning about %s's settings:\n%s", name, other, svc.out.String())
		}
		w := settingsWarning(svc.out.String())
		if !strings.Contains(w, `"settings":["LLM_MODEL"]`) {
			t.Errorf("%s: warning %s; want it to name LLM_MODEL alone", name, w)
		}
		if strings.Count(svc.out.String(), "different settings") != 1 {
			t.Errorf("%s warned more than once:\n%s", name, svc.out.String())
		}
	}
	db, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(testCtx(t))
	var rows string
	if err := db.QueryRow(testCtx(t), `SELECT string_agg(settings::text, ' ') FROM replicas`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rows, `"LLM_MODEL"`) || !strings.Contains(rows, `"SECRET_KEY"`) {
		t.Errorf("rows' settings %s; want a hash per setting", rows)
	}
	if strings.Contains(rows, "PLANTED") || strings.Contains(rows, testKey) || strings.Contains(rows, "127.0.0.1:9") {
		t.Errorf("rows' settings %s hold a value", rows)
	}
}

// Replicas with the same settings warn of none.
func TestReplicaSettingsSame(t *testing.T) {
	url := storetest.NewURL(t)
	env := map[string]string{"SECRET_KEY": testKey, "LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_MODEL": "m", "REPLICA_TTL": "3s"}
	a := start(t, url, env, "-replica-id", "replica-a")
	b := start(t, url, env, "-replica-id", "replica-b")
	time.Sleep(3 * time.Second) // a few heartbeats
	for _, svc := range []*service{a, b} {
		if w := settingsWarning(svc.out.String()); w != "" {
			t.Errorf("replicas with the same settings warned: %s", w)
		}
	}
	if !strings.Contains(a.out.String(), "replica-b") {
		t.Errorf("replica-a never saw replica-b:\n%s", a.out.String())
	}
}

func settingsWarning(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "different settings") {
			return line
		}
	}
	return ""
}

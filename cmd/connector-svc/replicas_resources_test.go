package main

// Resources through replicas (issue 31): the real binary, two replicas on
// one database, a stdio connector running the reference server, read
// through the replica that does not own it.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/loudskip"
)

// everythingScript writes a command that runs the installed reference
// server over stdio with node, and returns its path and the server's
// entry point; the test is skipped loudly if either is missing.
func everythingScript(t *testing.T) (script, js string) {
	t.Helper()
	js = needFile(t, "../../.tools/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "make tools")
	node, err := exec.LookPath("node")
	if err != nil {
		loudskip.Skip(t, "node is not on PATH; the reference MCP server runs with it")
	}
	node, _ = filepath.Abs(node)
	script = filepath.Join(t.TempDir(), "everything")
	if err := os.WriteFile(script, fmt.Appendf(nil, "#!/bin/sh\nexec '%s' '%s' stdio\n", node, js), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, js
}

// processesOf returns the pids of the running processes whose command
// line contains arg.
func processesOf(arg string) []int {
	dirs, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(cmdline, []byte(arg)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// runsUnder returns which of the replicas pid descends from, or "".
func (c *testCluster) runsUnder(pid int, ids ...string) string {
	for p := pid; p > 1; p = parentOf(p) {
		for _, id := range ids {
			if r := c.get(id); r.running() && r.cmd.Process.Pid == p {
				return id
			}
		}
	}
	return ""
}

// A stdio connector's reads, prompts and completions through the replica
// that does not own it are forwarded one hop to the owner, where its one
// server process runs.
func TestReplicasReadResourceOfStdioConnector(t *testing.T) {
	script, js := everythingScript(t)
	c := newCluster(t, map[string]string{"STDIO_ALLOWED_COMMANDS": script}, "a", "b")
	c.waitMembers("a", "b")
	create(t, c.client("a"), &connectorv1.Connector{ConnectorId: "everything", Name: "everything",
		Transport: connectorv1.Transport_TRANSPORT_STDIO, ApprovalPolicy: noApproval,
		Connection: &connectorv1.Connector_Stdio{Stdio: &connectorv1.StdioConfig{Command: script}}})
	db := c.db()
	var own map[string]owner
	if !poll(20*time.Second, func() bool {
		var err error
		own, err = owners(context.Background(), db)
		return err == nil && own["everything"].live
	}) {
		t.Fatalf("no live owner of the connector: %v", own)
	}
	owner, other := own["everything"].replica, "a"
	if owner == "a" {
		other = "b"
	}
	client := c.client(other)
	ctx := ctxFor(t, time.Minute)

	// The owner connects in the background: read until it serves.
	var blob *connectorv1.ReadResourceResponse
	var err error
	if !poll(30*time.Second, func() bool {
		blob, err = client.ReadResource(ctx, &connectorv1.ReadResourceRequest{WorkspaceId: "acme", ConnectorId: "everything",
			Uri: "demo://resource/dynamic/blob/1"})
		return err == nil
	}) {
		t.Fatalf("ReadResource through %s (the owner is %s): %v", other, owner, err)
	}
	if b := blob.GetContents(); len(b) != 1 || !strings.HasPrefix(string(b[0].GetBlob()), "Resource 1: This is a base64 blob") {
		t.Errorf("blob/1 through %s = %v", other, blob)
	}
	list, err := client.ListResources(ctx, &connectorv1.ListResourcesRequest{WorkspaceId: "acme", ConnectorId: "everything", PageSize: 3})
	if err != nil || len(list.GetResources()) != 3 || list.GetNextPageToken() == "" {
		t.Errorf("ListResources through %s = %d resources (next %q), %v", other, len(list.GetResources()), list.GetNextPageToken(), err)
	}
	prompt, err := client.GetPrompt(ctx, &connectorv1.GetPromptRequest{WorkspaceId: "acme", ConnectorId: "everything",
		Name: "args-prompt", Arguments: map[string]string{"city": "Lyon"}})
	if err != nil || len(prompt.GetMessages()) != 1 || prompt.GetMessages()[0].GetContent().GetText().GetText() != "What's weather in Lyon?" {
		t.Errorf("GetPrompt through %s = %v, %v", other, prompt, err)
	}
	comp, err := client.Complete(ctx, &connectorv1.CompleteRequest{WorkspaceId: "acme", ConnectorId: "everything",
		PromptName: "completable-prompt", ArgumentName: "name", ContextArguments: map[string]string{"department": "Sales"}})
	if err != nil || strings.Join(comp.GetValues(), ",") != "David,Eve,Frank" {
		t.Errorf("Complete through %s = %v, %v", other, comp.GetValues(), err)
	}

	// One server process, the owner's: the reads were served there.
	var pids []int
	var under []string
	for _, pid := range processesOf(js) {
		if id := c.runsUnder(pid, "a", "b"); id != "" {
			pids, under = append(pids, pid), append(under, id)
		}
	}
	t.Logf("read, listed, prompted and completed through %s; the server runs as pid %v under %v (the owner is %s)", other, pids, under, owner)
	if len(pids) != 1 || under[0] != owner {
		t.Errorf("the reference server runs as %v under replicas %q, want once under the owner %s", pids, under, owner)
	}
}

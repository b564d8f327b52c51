// Command taskserver is an MCP server over stdio for the registry's tests
// of task tools: its tools "slow" and "hang" must be called as tasks (MCP
// 2025-11-25), and its plain tool "stats" says what the server saw of
// them, as JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// stats is what "stats" answers.
type stats struct {
	Gets    int64    `json:"gets"`    // tasks/get requests
	Results int64    `json:"results"` // tasks/result requests
	Cancels []string `json:"cancels"` // ids of the tasks that tasks/cancel cancelled
	Created []string `json:"created"` // ids of the tasks created
}

func main() {
	var (
		gets, results    atomic.Int64
		mu               sync.Mutex
		cancels, created []string
		polled           = make(chan struct{}, 100)
	)
	hooks := &server.Hooks{}
	hooks.AddAfterGetTask(func(_ context.Context, _ any, _ *mcp.GetTaskRequest, res *mcp.GetTaskResult) {
		gets.Add(1)
		if res.Status == mcp.TaskStatusWorking {
			interval := int64(100)
			res.PollInterval = &interval
			select {
			case polled <- struct{}{}:
			default:
			}
		}
	})
	hooks.AddBeforeTaskResult(func(context.Context, any, *mcp.TaskResultRequest) { results.Add(1) })
	hooks.AddAfterCancelTask(func(_ context.Context, _ any, req *mcp.CancelTaskRequest, res *mcp.CancelTaskResult) {
		if res.Status == mcp.TaskStatusCancelled {
			mu.Lock()
			cancels = append(cancels, req.Params.TaskId)
			mu.Unlock()
		}
	})
	taskHooks := &server.TaskHooks{}
	taskHooks.AddOnTaskCreated(func(_ context.Context, m server.TaskMetrics) {
		mu.Lock()
		created = append(created, m.TaskID)
		mu.Unlock()
	})
	s := server.NewMCPServer("taskserver", "1.0", server.WithToolCapabilities(true),
		server.WithTaskCapabilities(true, true, true), server.WithHooks(hooks), server.WithTaskHooks(taskHooks),
		server.WithElicitation())
	required := mcp.WithTaskSupport(mcp.TaskSupportRequired)
	// slow answers its text after the client polled it twice.
	s.AddTaskTool(mcp.NewTool("slow", required, mcp.WithString("text")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			for range 2 {
				<-polled
			}
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent("slow: " + req.GetString("text", ""))}}, nil
		})
	// report sends two progress notifications after the client polled it
	// once, and answers after it polled once more.
	s.AddTaskTool(mcp.NewTool("report", required),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			<-polled
			if req.Params.Meta != nil && req.Params.Meta.ProgressToken != nil {
				for i := 1; i <= 2; i++ {
					err := s.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), map[string]any{
						"progressToken": req.Params.Meta.ProgressToken, "progress": i, "total": 2, "message": fmt.Sprint("step ", i)})
					if err != nil {
						return nil, err
					}
				}
			}
			<-polled
			return &mcp.CreateTaskResult{Content: []mcp.Content{mcp.NewTextContent("reported")}}, nil
		})
	// confirm asks the user (an elicitation, tagged with no task: mcp-go's
	// server does not tell a task its id) for a name, and says it.
	s.AddTaskTool(mcp.NewTool("confirm", required),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			var req mcp.ElicitationRequest
			req.Params.Message = "Who confirms?"
			req.Params.RequestedSchema = map[string]any{
				"type":       "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}},
				"required":   []any{"name"},
			}
			// The task's context ended with the request that created it.
			res, err := s.RequestElicitation(context.WithoutCancel(ctx), req)
			if err != nil {
				return nil, err
			}
			content, _ := res.Content.(map[string]any)
			return &mcp.CreateTaskResult{Content: []mcp.Content{
				mcp.NewTextContent(fmt.Sprintf("%s by %v", res.Action, content["name"]))}}, nil
		})
	// hang runs for a minute. (It cannot watch its context: mcp-go's
	// server runs a task on the context of the request that created it,
	// which ends as soon as the task is created.)
	s.AddTaskTool(mcp.NewTool("hang", required),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			time.Sleep(time.Minute)
			return nil, errors.New("hung for a minute")
		})
	s.AddTool(mcp.NewTool("stats"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		st := stats{Gets: gets.Load(), Results: results.Load(), Cancels: cancels, Created: created}
		b, err := json.Marshal(st)
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		return mcp.NewToolResultText(string(b)), nil
	})
	if err := server.ServeStdio(s); err != nil {
		log.Fatal(err)
	}
}

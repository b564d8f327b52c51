package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	connectorv1 "github.com/connector-svc/connector-svc/gen/connector/v1"
	"github.com/connector-svc/connector-svc/internal/auth"
	"github.com/connector-svc/connector-svc/internal/server"
)

// TestMissingWorkspaceIsInvalid: with auth on, every RPC of the service
// answers a request without workspace_id INVALID_ARGUMENT
// "workspace_id: required", as it does any other missing field, not
// PERMISSION_DENIED for a workspace named "".
func TestMissingWorkspaceIsInvalid(t *testing.T) {
	f := setup(t, options{auth: auth.ModeKeys})
	_, token, err := f.keys.Create(context.Background(), "acme", []auth.Scope{auth.ScopeAdmin}, "")
	if err != nil {
		t.Fatal(err)
	}
	sd, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(connectorv1.ConnectorService_ServiceDesc.ServiceName))
	if err != nil {
		t.Fatal(err)
	}
	methods := sd.(protoreflect.ServiceDescriptor).Methods()
	for i := range methods.Len() {
		m := methods.Get(i)
		t.Run(string(m.Name()), func(t *testing.T) {
			in, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
			if err != nil {
				t.Fatal(err)
			}
			if m.Name() == "CompleteAuthorization" {
				t.Skip("CompleteAuthorization names no workspace: its state does (any valid key may call it)")
			}
			if in.Descriptor().Fields().ByName("workspace_id") == nil {
				t.Fatalf("%s has no workspace_id", m.Input().FullName())
			}
			method := "/" + string(sd.FullName()) + "/" + string(m.Name())
			c := bearer(ctx(t), token)
			req, resp := in.New().Interface(), &emptypb.Empty{}
			if m.IsStreamingServer() {
				var stream grpc.ClientStream
				if stream, err = f.conn.NewStream(c, &grpc.StreamDesc{ServerStreams: true}, method); err == nil {
					if err = stream.SendMsg(req); err == nil {
						_ = stream.CloseSend()
						err = stream.RecvMsg(resp)
					}
				}
			} else {
				err = f.conn.Invoke(c, method, req, resp)
			}
			wantStatus(t, err, codes.InvalidArgument, server.ReasonInvalidArgument, "workspace_id")
			if msg := status.Convert(err).Message(); !strings.Contains(msg, "workspace_id: required") {
				t.Errorf("message %q does not say workspace_id: required", msg)
			}
		})
	}
	if methods.Len() < 15 {
		t.Errorf("found only %d RPCs", methods.Len())
	}
}

// TestConnectorNotFoundNamesIt: a connector that is not there is named,
// with its workspace, for every kind of request that names one.
func TestConnectorNotFoundNamesIt(t *testing.T) {
	f := setup(t, options{})
	want := `connector "nope" not found in workspace "ws"`
	for name, call := range map[string]func() error{
		"get": func() error {
			_, err := f.client.GetConnector(ctx(t), &connectorv1.GetConnectorRequest{WorkspaceId: "ws", ConnectorId: "nope"})
			return err
		},
		"activate": func() error {
			_, err := f.client.ActivateConnector(ctx(t), &connectorv1.ActivateConnectorRequest{WorkspaceId: "ws", ConnectorId: "nope"})
			return err
		},
		"call": func() error {
			_, err := f.client.CallTool(ctx(t), &connectorv1.CallToolRequest{WorkspaceId: "ws", ConnectorId: "nope", ToolName: "echo"})
			return err
		},
	} {
		err := call()
		wantStatus(t, err, codes.NotFound, server.ReasonConnectorNotFound, "")
		if msg := status.Convert(err).Message(); msg != want {
			t.Errorf("%s: message %q, want %q", name, msg, want)
		}
	}
}

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// sampleDispatch is a dispatch envelope the size of a real `true` task.
func sampleDispatch(i int) *agentv1.Envelope {
	spec, _ := (&taskwire.Spec{Namespace: "bench", Name: fmt.Sprintf("t-%06d", i), Attempt: 1, Command: []string{"true"}}).Encode()
	return protocol.NewDispatch("bench-node", uint64(i+1), &agentv1.WorkItem{
		Uid: taskwire.WorkID("0f6bb0e4-7d4d-4b8e-9a67-3c2d1e0f9a8b", int32(i+1)), Type: taskwire.TypeExec, Spec: spec})
}

// streamServer sends n envelopes on every GetMessage stream and ends it.
type streamServer struct {
	agentv1.UnimplementedAgentHubServer
	envs []*agentv1.Envelope
}

func (s *streamServer) GetMessage(_ *agentv1.GetMessageRequest, st grpc.ServerStreamingServer[agentv1.Envelope]) error {
	for _, e := range s.envs {
		if err := st.Send(e); err != nil {
			return err
		}
	}
	return nil
}

// rawGRPC measures plain gRPC server-stream messages per second over TLS on
// loopback: the same envelopes Drover dispatches, with no session, revision
// or ack logic.
func rawGRPC(ctx context.Context, n int) (float64, error) {
	now := time.Now()
	ca, err := pki.NewCA("bench", now, time.Hour)
	if err != nil {
		return 0, err
	}
	certPEM, keyPEM, err := ca.IssueServing("bench", []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		return 0, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return 0, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	envs := make([]*agentv1.Envelope, n)
	for i := range envs {
		envs[i] = sampleDispatch(i)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})))
	agentv1.RegisterAgentHubServer(srv, &streamServer{envs: envs})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	began := time.Now()
	st, err := agentv1.NewAgentHubClient(conn).GetMessage(ctx, &agentv1.GetMessageRequest{})
	if err != nil {
		return 0, err
	}
	got := 0
	for {
		if _, err := st.Recv(); err != nil {
			break
		}
		got++
	}
	took := time.Since(began)
	if got != n {
		return 0, fmt.Errorf("raw gRPC: received %d of %d messages", got, n)
	}
	return float64(n) / took.Seconds(), nil
}

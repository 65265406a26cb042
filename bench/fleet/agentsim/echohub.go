package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// echoHub is the benchmark's baseline: the transport floor under the hub.
// It speaks the same protocol with the same gRPC server settings as
// internal/hub (TLS 1.3, client certificates checked on every call,
// keepalive, window and buffer sizes), signs CSRs with an in-memory CA and
// answers every call at once. It has no Kubernetes API, no liveness tracker,
// no informer cache, no status writes. hub / echoHub is what the hub's own
// work costs on top of holding the same TLS gRPC streams.
type echoHub struct {
	agentv1.UnimplementedAgentHubServer
	ca       *pki.CA
	sessions atomic.Int64
	messages atomic.Int64
}

func runEchoHub(ctx context.Context, listen, caOut string) error {
	now := time.Now()
	ca, err := pki.NewCA("agentsim-echo-ca", now, 24*time.Hour)
	if err != nil {
		return err
	}
	if caOut != "" {
		if err := os.WriteFile(caOut, ca.CertPEM, 0o600); err != nil {
			return err
		}
	}
	certPEM, keyPEM, err := ca.IssueServing("agentsim-echo", []string{"127.0.0.1", "localhost"}, now, 24*time.Hour)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	// The same options as internal/hub/hub.go Start.
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.VerifyClientCertIfGiven,
			ClientCAs:    ca.Pool(),
			MinVersion:   tls.VersionTLS13,
		})),
		grpc.MaxRecvMsgSize(protocol.MaxEnvelopeBytes),
		grpc.MaxSendMsgSize(protocol.MaxEnvelopeBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(32<<10),
		grpc.InitialConnWindowSize(64<<10),
		grpc.ReadBufferSize(8<<10),
		grpc.WriteBufferSize(8<<10),
	)
	h := &echoHub{ca: ca}
	agentv1.RegisterAgentHubServer(srv, h)
	fmt.Printf("ready hub=%s\n", lis.Addr())
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fmt.Printf("stat sessions=%d messages=%d\n", h.sessions.Load(), h.messages.Load())
			}
		}
	}()
	go func() { <-ctx.Done(); srv.Stop() }()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func (h *echoHub) Register(_ context.Context, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	if err := protocol.ValidNodeName(req.GetNode()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	der, err := h.ca.SignClientCSR(req.GetCsr(), req.GetNode(), time.Now(), 24*time.Hour)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &agentv1.RegisterResponse{Result: agentv1.RegisterResponse_RESULT_APPROVED, Certificate: der, Ca: h.ca.Cert.Raw}, nil
}

func peerNode(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", status.Error(codes.Unauthenticated, "client certificate required")
	}
	return ti.State.VerifiedChains[0][0].Subject.CommonName, nil
}

func (h *echoHub) GetMessage(req *agentv1.GetMessageRequest, stream grpc.ServerStreamingServer[agentv1.Envelope]) error {
	node, err := peerNode(stream.Context())
	if err != nil {
		return err
	}
	h.sessions.Add(1)
	defer h.sessions.Add(-1)
	if err := stream.Send(protocol.NewNodeConfiguration(node, &agentv1.NodeConfiguration{HeartbeatSeconds: 30, Hub: "echo"})); err != nil {
		return err
	}
	if err := stream.Send(protocol.NewSnapshot(node, req.GetLastRevision()+1, nil)); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (h *echoHub) SendMessage(ctx context.Context, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	node, err := peerNode(ctx)
	if err != nil {
		return nil, err
	}
	if err := protocol.Validate(env); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if env.GetNode() != node {
		return nil, status.Error(codes.PermissionDenied, "wrong node")
	}
	h.messages.Add(1)
	return &agentv1.SendResponse{}, nil
}

// Package sessionsdk is the Go SDK for applications that run as Drover
// serverless instances (serverless.drover.io Applications in sessions
// mode). drover-agent starts the instance with:
//
//   - DROVER_PORT: the host port to listen on (customers connect there);
//   - DROVER_SESSION_SOCKET: the instance's session service;
//   - DROVER_SESSION_FILE: a read-only JSON file with the Application's and
//     the sessions' data, rewritten when they change.
//
// The application connects (Connect), is told to start and close sessions
// (Handler), and answers with Ready when a session is set up, Evacuated
// when its clients have left after a close, and Closed when it is gone. It
// reports its customers' connections with ClientJoined and ClientLeft. The
// SDK sends heartbeats for the sessions it was told to start and that are
// not closed yet; a session without heartbeats is flagged to the hub.
//
// A standby instance is frozen after it started and passed its liveness
// probe: do the slow setup (loading, warming caches) before listening on
// DROVER_PORT, so that a session needs only the thaw and SessionStart.
package sessionsdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/drover-fleet/drover/pkg/sessionsdk/sessionv1"
)

// Environment variables set by drover-agent.
const (
	EnvPort          = "DROVER_PORT"
	EnvSessionSocket = "DROVER_SESSION_SOCKET"
	EnvSessionFile   = "DROVER_SESSION_FILE"
)

// Version is sent to the agent for its logs.
const Version = "drover-sessionsdk-go/v1alpha1"

// DefaultHeartbeat is the interval of heartbeats (the Application default).
const DefaultHeartbeat = 5 * time.Second

// Session is a session the agent starts.
type Session struct {
	Name string
	// Data is the customer's session data.
	Data map[string]string
}

// Handler is what the application does when told to.
type Handler interface {
	// StartSession sets up s and then calls Client.Ready (or, if it
	// cannot, Client.Closed). It may return at once and do that later.
	// Commands are delivered at least once (the agent sends again what a
	// broken stream may have lost): a session started again is answered
	// with Ready again once it is set up.
	StartSession(ctx context.Context, c *Client, s Session)
	// CloseSession tears session down: its clients leave
	// (Client.Evacuated), then Client.Closed.
	CloseSession(ctx context.Context, c *Client, session string)
}

// Options of Connect.
type Options struct {
	// Socket of the session service; default $DROVER_SESSION_SOCKET.
	Socket string
	// Heartbeat interval; default DefaultHeartbeat.
	Heartbeat time.Duration
}

// Client is an instance's connection to its session service.
type Client struct {
	conn *grpc.ClientConn
	api  sessionv1.SessionsClient
	hb   time.Duration

	mu     sync.Mutex
	active []string // started, not closed
}

// Connect connects to the session service (no I/O until Run or a call).
func Connect(opts Options) (*Client, error) {
	if opts.Socket == "" {
		opts.Socket = os.Getenv(EnvSessionSocket)
	}
	if opts.Socket == "" {
		return nil, fmt.Errorf("sessionsdk: no session socket: %s is not set (is this process a Drover instance?)", EnvSessionSocket)
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	conn, err := grpc.NewClient("unix://"+opts.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("sessionsdk: %w", err)
	}
	return &Client{conn: conn, api: sessionv1.NewSessionsClient(conn), hb: opts.Heartbeat}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Run receives the agent's commands and calls h, and sends heartbeats,
// until ctx ends. It reconnects when the stream breaks (the agent
// restarted) and returns only ctx's error.
func (c *Client) Run(ctx context.Context, h Handler) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.heartbeats(ctx)
	}()
	for {
		err := c.receive(ctx, h)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = err // the agent restarts or the stream was replaced: try again
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Client) receive(ctx context.Context, h Handler) error {
	stream, err := c.api.GetMessage(ctx, &sessionv1.GetMessageRequest{Sdk: Version})
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch x := m.GetCommand().(type) {
		case *sessionv1.AgentMessage_SessionStart:
			s := Session{Name: x.SessionStart.GetSession(), Data: x.SessionStart.GetData()}
			c.mu.Lock()
			if !slices.Contains(c.active, s.Name) {
				c.active = append(c.active, s.Name)
			}
			c.mu.Unlock()
			h.StartSession(ctx, c, s)
		case *sessionv1.AgentMessage_SessionClose:
			h.CloseSession(ctx, c, x.SessionClose.GetSession())
		}
	}
}

func (c *Client) heartbeats(ctx context.Context) {
	t := time.NewTicker(c.hb)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		active := slices.Clone(c.active)
		c.mu.Unlock()
		if len(active) == 0 {
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, c.hb)
		_, _ = c.api.SendMessage(hctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{Sessions: active}}})
		cancel()
	}
}

func (c *Client) send(ctx context.Context, m *sessionv1.InstanceMessage) error {
	if _, err := c.api.SendMessage(ctx, m); err != nil {
		return fmt.Errorf("sessionsdk: %w", err)
	}
	return nil
}

// Ready says session is set up: customers may connect.
func (c *Client) Ready(ctx context.Context, session string) error {
	return c.send(ctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_SessionReady{SessionReady: &sessionv1.SessionReady{Session: session}}})
}

// Evacuated says session's clients have left after a close.
func (c *Client) Evacuated(ctx context.Context, session string) error {
	return c.send(ctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_SessionEvacuated{SessionEvacuated: &sessionv1.SessionEvacuated{Session: session}}})
}

// Closed says session is gone; its heartbeats stop.
func (c *Client) Closed(ctx context.Context, session string) error {
	c.mu.Lock()
	c.active = slices.DeleteFunc(c.active, func(s string) bool { return s == session })
	c.mu.Unlock()
	return c.send(ctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_SessionClosed{SessionClosed: &sessionv1.SessionClosed{Session: session}}})
}

// ClientJoined says a customer's connection joined session.
func (c *Client) ClientJoined(ctx context.Context, session, client string) error {
	if client == "" {
		return errors.New("sessionsdk: name the client")
	}
	return c.send(ctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_ClientJoin{ClientJoin: &sessionv1.ClientJoin{Session: session, Client: client}}})
}

// ClientLeft says a customer's connection left session.
func (c *Client) ClientLeft(ctx context.Context, session, client string) error {
	return c.send(ctx, &sessionv1.InstanceMessage{Event: &sessionv1.InstanceMessage_ClientLeave{ClientLeave: &sessionv1.ClientLeave{Session: session, Client: client}}})
}

// Active are the sessions started and not closed.
func (c *Client) Active() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.active)
}

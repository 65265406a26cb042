// Command echo-session is an example Drover serverless application: a TCP
// echo server on DROVER_PORT that serves sessions through pkg/sessionsdk.
//
// A customer connects to the instance's endpoint (node address and port),
// is greeted with "session NAME", and gets every line back. Each
// connection is a client of the session (ClientJoined/ClientLeft). When the
// agent closes the session, the clients are disconnected, then the
// instance says Evacuated and Closed. Connections while no session is open
// are refused with "no session".
//
// Run without DROVER_SESSION_SOCKET it is a plain echo server, for trying
// it out: DROVER_PORT=7000 go run ./examples/echo-session.
package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/pkg/sessionsdk"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil && ctx.Err() == nil {
		slog.Error("echo-session", "err", err)
		os.Exit(1)
	}
}

// app is the echo server's sessions and their clients.
type app struct {
	mu      sync.Mutex
	current string                       // the session new connections join
	clients map[string]map[net.Conn]bool // session → its connections
	sdk     *sessionsdk.Client
}

func run(ctx context.Context) error {
	port := os.Getenv(sessionsdk.EnvPort)
	if port == "" {
		return fmt.Errorf("%s is not set", sessionsdk.EnvPort)
	}
	// Listen first: the liveness probe (TCP) passes once the instance is
	// set up, and a standby instance is frozen from then on.
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	defer l.Close()
	a := &app{clients: map[string]map[net.Conn]bool{}}
	if os.Getenv(sessionsdk.EnvSessionSocket) == "" {
		slog.Info("no session service: a plain echo server", "port", port)
		a.current = "none"
	} else {
		if a.sdk, err = sessionsdk.Connect(sessionsdk.Options{}); err != nil {
			return err
		}
		defer a.sdk.Close()
		go func() { _ = a.sdk.Run(ctx, a) }()
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go a.serve(ctx, c)
	}
}

// StartSession: nothing to set up; new connections join it.
func (a *app) StartSession(ctx context.Context, c *sessionsdk.Client, s sessionsdk.Session) {
	a.mu.Lock()
	a.current = s.Name
	a.clients[s.Name] = map[net.Conn]bool{}
	a.mu.Unlock()
	slog.Info("session started", "session", s.Name, "data", s.Data)
	if err := c.Ready(ctx, s.Name); err != nil {
		slog.Error("session ready", "session", s.Name, "err", err)
	}
}

// CloseSession disconnects the session's clients, then says so.
func (a *app) CloseSession(ctx context.Context, c *sessionsdk.Client, session string) {
	a.mu.Lock()
	conns := a.clients[session]
	delete(a.clients, session)
	if a.current == session {
		a.current = ""
	}
	a.mu.Unlock()
	for conn := range conns {
		conn.Close()
	}
	slog.Info("session closed", "session", session)
	if err := c.Evacuated(ctx, session); err != nil {
		slog.Error("session evacuated", "session", session, "err", err)
	}
	if err := c.Closed(ctx, session); err != nil {
		slog.Error("session closed", "session", session, "err", err)
	}
}

func (a *app) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	a.mu.Lock()
	session := a.current
	if session != "" && a.clients[session] != nil {
		a.clients[session][c] = true
	}
	a.mu.Unlock()
	if session == "" {
		fmt.Fprintln(c, "no session")
		return
	}
	client := c.RemoteAddr().String()
	if a.sdk != nil {
		_ = a.sdk.ClientJoined(ctx, session, client)
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = a.sdk.ClientLeft(cctx, session, client)
		}()
	}
	fmt.Fprintf(c, "session %s\n", session)
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		fmt.Fprintln(c, sc.Text())
	}
	a.mu.Lock()
	delete(a.clients[session], c)
	a.mu.Unlock()
}

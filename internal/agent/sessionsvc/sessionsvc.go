// Package sessionsvc is drover-agent's per-instance session service
// (proto/drover/session/v1): one gRPC server per serverless instance, on a
// unix socket of its own, through which the instance receives SessionStart
// and SessionClose and sends SessionReady, SessionEvacuated, SessionClosed,
// heartbeats and client join/leave. The instance's callbacks reach the
// agent as Session actor messages (internal/serverless/actor) through
// Options.Handler.
//
// Who may talk on an instance's socket: the socket is 0600 and its
// instance's user's, in a dir the instances reach but cannot list (0711);
// and every connection's peer (SO_PEERCRED) must be a process of the
// instance's cgroup (Owner.Member), since instances of one user could
// otherwise connect to each other's sockets. An instance touches only the
// sessions the agent started on it (Start): a callback naming any other
// session is refused with PermissionDenied. (Issue 16 asks for a
// certificate per instance from a node-local CA; the socket, the peer
// check and the binding give the same guarantee on one node without one.)
package sessionsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/pkg/sessionsdk/sessionv1"
)

// MaxQueued bounds the commands queued for an instance that is not
// listening (its SDK has not connected yet).
const MaxQueued = 1024

// Handler receives an instance's callbacks as Session actor messages
// (actor.ReadyCallback, EvacuatedCallback, ClosedCallback, Heartbeat,
// ClientJoin, ClientLeave) for session. It must not block.
type Handler func(instance, session string, msg actor.Message)

// Options configure a Service.
type Options struct {
	// Dir holds the sockets; created 0711 (instances reach their socket
	// by name and list nothing). Keep it short: a socket path has at most
	// 107 bytes.
	Dir     string
	Handler Handler
	Logger  *slog.Logger
}

// Owner is who may connect to an instance's socket.
type Owner struct {
	// UID and GID own the socket (the instance's user); -1 leaves it the
	// agent's.
	UID, GID int
	// Member reports whether pid belongs to the instance (is in its
	// cgroup); nil lets any process of UID in.
	Member func(pid int) bool
}

// Service serves the session service of every instance of the node.
type Service struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	instances map[string]*endpoint
}

// endpoint is one instance's server and its state.
type endpoint struct {
	name   string
	socket string
	srv    *grpc.Server
	done   chan struct{} // Serve returned

	// Guarded by Service.mu.
	sessions []string                  // started on it, not forgotten
	queue    []*sessionv1.AgentMessage // commands not sent yet
	wake     chan struct{}             // closed and replaced when queue grows
	stream   int                       // generation of the current GetMessage stream
}

// New returns a Service; it serves nothing until Serve.
func New(opts Options) (*Service, error) {
	if opts.Dir == "" || opts.Handler == nil {
		return nil, errors.New("session service: Dir and Handler are required")
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("session service: %w", err)
	}
	if err := os.Chmod(opts.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("session service: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dir := closedParent(opts.Dir); dir != "" {
		// Instances run as other users: they would never reach their
		// sockets, and every session would end OpenTimeout, saying nothing.
		log.Warn("instances cannot reach their session sockets: a dir above the session socket dir does not let other users through; "+
			"sessions will time out (OpenTimeout). Give --session-socket-dir under dirs with o+x (e.g. /run/drover-sessions)",
			"socketDir", opts.Dir, "closedDir", dir)
	}
	return &Service{opts: opts, log: log, instances: map[string]*endpoint{}}, nil
}

// closedParent returns the first dir above dir that other users may not
// pass through (no o+x), or "".
func closedParent(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// SocketPath is where instance's socket is (or will be).
func (s *Service) SocketPath(instance string) string {
	return filepath.Join(s.opts.Dir, instance+".sock")
}

// Serve starts instance's server on its socket, owned by owner, and
// returns the socket's path. Call it before the instance starts (the path
// is in its environment); Remove stops it.
func (s *Service) Serve(instance string, owner Owner) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.instances[instance]; ok {
		return e.socket, nil
	}
	path := s.SocketPath(instance)
	if len(path) > 107 {
		return "", fmt.Errorf("session socket %s: longer than a unix socket path may be (107 bytes); shorten the session socket dir", path)
	}
	_ = os.Remove(path) // left by an agent that died
	// Created 0600 from the start: no moment where another user connects.
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return "", fmt.Errorf("session socket of %s: %w", instance, err)
	}
	if err := os.Chown(path, owner.UID, owner.GID); err != nil {
		l.Close()
		return "", fmt.Errorf("session socket of %s: give it to the instance's user: %w", instance, err)
	}
	e := &endpoint{name: instance, socket: path, wake: make(chan struct{}), done: make(chan struct{})}
	e.srv = grpc.NewServer()
	sessionv1.RegisterSessionsServer(e.srv, &server{s: s, e: e})
	s.instances[instance] = e
	go func() {
		defer close(e.done)
		if err := e.srv.Serve(&peerListener{UnixListener: l.(*net.UnixListener), owner: owner, log: s.log.With("instance", instance)}); err != nil {
			s.log.Warn("session service stopped", "instance", instance, "err", err)
		}
	}()
	return path, nil
}

// Remove stops instance's server and removes its socket.
func (s *Service) Remove(instance string) {
	s.mu.Lock()
	e, ok := s.instances[instance]
	delete(s.instances, instance)
	s.mu.Unlock()
	if !ok {
		return
	}
	e.srv.Stop()
	<-e.done
	_ = os.Remove(e.socket)
}

// Close stops every server.
func (s *Service) Close() {
	s.mu.Lock()
	names := make([]string, 0, len(s.instances))
	for n := range s.instances {
		names = append(names, n)
	}
	s.mu.Unlock()
	for _, n := range names {
		s.Remove(n)
	}
}

// Start binds session to instance and sends it SessionStart (queued until
// the instance listens). A session started again is sent again.
func (s *Service) Start(instance, session string, data map[string]string) error {
	return s.send(instance, session, true, &sessionv1.AgentMessage{Command: &sessionv1.AgentMessage_SessionStart{
		SessionStart: &sessionv1.SessionStart{Session: session, Data: data}}})
}

// Close sends instance SessionClose for session (best effort).
func (s *Service) CloseSession(instance, session string) error {
	return s.send(instance, session, false, &sessionv1.AgentMessage{Command: &sessionv1.AgentMessage_SessionClose{
		SessionClose: &sessionv1.SessionClose{Session: session}}})
}

// Forget unbinds a Terminated session: the instance may no longer touch it.
func (s *Service) Forget(instance, session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.instances[instance]; ok {
		e.sessions = slices.DeleteFunc(e.sessions, func(x string) bool { return x == session })
		// Its undelivered commands go too: an instance that never reads
		// them must not fill its queue with sessions long ended.
		e.queue = slices.DeleteFunc(e.queue, func(m *sessionv1.AgentMessage) bool {
			return m.GetSessionStart().GetSession() == session || m.GetSessionClose().GetSession() == session
		})
	}
}

// Sessions are the sessions bound to instance.
func (s *Service) Sessions(instance string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.instances[instance]; ok {
		return slices.Clone(e.sessions)
	}
	return nil
}

func (s *Service) send(instance, session string, bind bool, m *sessionv1.AgentMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.instances[instance]
	if !ok {
		return fmt.Errorf("session %s: instance %s has no session service", session, instance)
	}
	if len(e.queue) >= MaxQueued {
		return fmt.Errorf("session %s: instance %s has %d commands queued and does not read them", session, instance, MaxQueued)
	}
	if bind && !slices.Contains(e.sessions, session) {
		e.sessions = append(e.sessions, session)
	}
	e.queue = append(e.queue, m)
	close(e.wake)
	e.wake = make(chan struct{})
	return nil
}

// server is one instance's gRPC service.
type server struct {
	sessionv1.UnimplementedSessionsServer
	s *Service
	e *endpoint
}

func (v *server) GetMessage(req *sessionv1.GetMessageRequest, stream grpc.ServerStreamingServer[sessionv1.AgentMessage]) error {
	s, e := v.s, v.e
	s.mu.Lock()
	e.stream++
	gen := e.stream
	s.mu.Unlock()
	s.log.Info("instance connected to its session service", "instance", e.name, "sdk", req.GetSdk())
	for {
		s.mu.Lock()
		if e.stream != gen {
			s.mu.Unlock()
			return status.Error(codes.Aborted, "a newer GetMessage stream of this instance replaced this one")
		}
		var next *sessionv1.AgentMessage
		if len(e.queue) > 0 {
			next = e.queue[0]
		}
		wake := e.wake
		s.mu.Unlock()
		if next == nil {
			select {
			case <-wake:
				continue
			case <-stream.Context().Done():
				return nil
			}
		}
		if err := stream.Send(next); err != nil {
			return err // kept queued: the next stream sends it
		}
		s.mu.Lock()
		if len(e.queue) > 0 && e.queue[0] == next {
			e.queue = e.queue[1:]
		}
		s.mu.Unlock()
	}
}

func (v *server) SendMessage(_ context.Context, m *sessionv1.InstanceMessage) (*sessionv1.SendMessageResponse, error) {
	type ev struct {
		session string
		msg     actor.Message
	}
	var evs []ev
	switch x := m.GetEvent().(type) {
	case *sessionv1.InstanceMessage_SessionReady:
		evs = append(evs, ev{x.SessionReady.GetSession(), actor.ReadyCallback{}})
	case *sessionv1.InstanceMessage_SessionEvacuated:
		evs = append(evs, ev{x.SessionEvacuated.GetSession(), actor.EvacuatedCallback{}})
	case *sessionv1.InstanceMessage_SessionClosed:
		evs = append(evs, ev{x.SessionClosed.GetSession(), actor.ClosedCallback{}})
	case *sessionv1.InstanceMessage_Heartbeat:
		for _, s := range x.Heartbeat.GetSessions() {
			evs = append(evs, ev{s, actor.Heartbeat{}})
		}
	case *sessionv1.InstanceMessage_ClientJoin:
		if x.ClientJoin.GetClient() == "" {
			return nil, status.Error(codes.InvalidArgument, "client join: name the client")
		}
		evs = append(evs, ev{x.ClientJoin.GetSession(), actor.ClientJoin{Client: x.ClientJoin.GetClient()}})
	case *sessionv1.InstanceMessage_ClientLeave:
		evs = append(evs, ev{x.ClientLeave.GetSession(), actor.ClientLeave{Client: x.ClientLeave.GetClient()}})
	default:
		return nil, status.Error(codes.InvalidArgument, "an InstanceMessage needs one event")
	}
	v.s.mu.Lock()
	for _, x := range evs {
		if !slices.Contains(v.e.sessions, x.session) {
			v.s.mu.Unlock()
			return nil, status.Errorf(codes.PermissionDenied, "session %q is not a session of instance %s", x.session, v.e.name)
		}
	}
	v.s.mu.Unlock()
	for _, x := range evs {
		v.s.opts.Handler(v.e.name, x.session, x.msg)
	}
	return &sessionv1.SendMessageResponse{}, nil
}

// peerListener lets in only the instance's processes.
type peerListener struct {
	*net.UnixListener
	owner Owner
	log   *slog.Logger
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if err := l.check(c); err != nil {
			l.log.Warn("refused a connection to an instance's session service", "err", err)
			c.Close()
			continue
		}
		return c, nil
	}
}

func (l *peerListener) check(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if l.owner.UID >= 0 && int(cred.Uid) != l.owner.UID && cred.Uid != 0 {
		return fmt.Errorf("peer uid %d is not the instance's %d", cred.Uid, l.owner.UID)
	}
	if l.owner.Member != nil && !l.owner.Member(int(cred.Pid)) {
		return fmt.Errorf("peer pid %d is not a process of the instance", cred.Pid)
	}
	return nil
}

// Package sessionapi serves the session API (pkg/sessionapi/sessionapiv1)
// to an Application's customers, who have no Kubernetes access: open, get,
// watch and close sessions, over gRPC and as HTTP/JSON on one port.
//
// It runs in the leading manager, beside the session binder: an Open is
// bound in the binder's memory and written as one ApplicationSession
// create (already bound), and answered when the node's hub writes the
// session Ready — the instance has called SessionReady, and the binding is
// durable both in the API and in the agent's DB. A crash of the server
// loses no session it returned: sessions are objects, and a restarted
// manager rebuilds from them.
//
// Callers present an application token (internal/serverless/apptoken) as
// "authorization: Bearer <token>"; a token sees only its own Application's
// sessions.
package sessionapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/serverless/apptoken"
	pb "github.com/drover-fleet/drover/pkg/sessionapi/sessionapiv1"
)

// Opener binds and creates a session: the manager's session binder. It
// returns the created object (bound, or already Terminated with a reason
// when it cannot be served) or an error.
type Opener interface {
	Open(ctx context.Context, namespace, app string, data map[string]string, openTimeout *time.Duration) (*serverlessv1.ApplicationSession, error)
}

// Informer is the part of a controller-runtime informer the server uses to
// learn of session changes at once.
type Informer interface {
	AddEventHandler(handler toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}

// Options configure a Server.
type Options struct {
	Opener Opener
	// Client reads (from the manager's cache) Applications and sessions,
	// and deletes sessions.
	Client client.Client
	// Sessions is the informer of ApplicationSessions behind Client's cache.
	Sessions Informer
	Clock    clock.Clock
	Logger   *slog.Logger
	// Registerer receives the server's metrics; nil: none.
	Registerer prometheus.Registerer
}

// Server is the session API.
type Server struct {
	pb.UnimplementedSessionsServer
	opts Options
	log  *slog.Logger
	grpc *grpc.Server

	mu   sync.Mutex
	subs map[types.NamespacedName]map[chan struct{}]struct{}

	opens   *prometheus.CounterVec
	openDur prometheus.Histogram
}

// New returns a Server; it registers its event handler on opts.Sessions.
func New(opts Options) (*Server, error) {
	if opts.Opener == nil || opts.Client == nil || opts.Sessions == nil {
		return nil, errors.New("session API: an opener, a client and the sessions informer are required")
	}
	opts.Clock = clock.Or(opts.Clock)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: log, subs: map[types.NamespacedName]map[chan struct{}]struct{}{},
		opens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_session_api_opens_total",
			Help: "Session opens through the session API, by result (Ready, or the reason it failed)."}, []string{"result"}),
		openDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "drover_session_api_open_seconds",
			Help:    "Time from an Open call to the session Ready.",
			Buckets: []float64{.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.opens, s.openDur} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("session API metrics: %w", err)
			}
		}
	}
	if _, err := opts.Sessions.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.notify(o) },
		UpdateFunc: func(_, o any) { s.notify(o) },
		DeleteFunc: func(o any) { s.notify(o) },
	}); err != nil {
		return nil, fmt.Errorf("session API: watch sessions: %w", err)
	}
	s.grpc = grpc.NewServer()
	pb.RegisterSessionsServer(s.grpc, s)
	return s, nil
}

func (s *Server) notify(o any) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	sess, ok := o.(*serverlessv1.ApplicationSession)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: sess.Namespace, Name: sess.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// subscribe returns a channel woken on every change of key, and its cancel.
func (s *Server) subscribe(key types.NamespacedName) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.subs[key] == nil {
		s.subs[key] = map[chan struct{}]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.subs[key], ch)
		if len(s.subs[key]) == 0 {
			delete(s.subs, key)
		}
		s.mu.Unlock()
	}
}

// caller is the Application a request's token belongs to.
type caller struct{ namespace, app string }

func bearer(v string) string {
	if t, ok := strings.CutPrefix(v, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

// authenticate checks a token against its Application's annotations.
func (s *Server) authenticate(ctx context.Context, token string) (caller, error) {
	if token == "" {
		return caller{}, status.Error(codes.Unauthenticated, "no application token: send authorization: Bearer <token> (drover app token create APP)")
	}
	ns, app, _, err := apptoken.Parse(token)
	if err != nil {
		return caller{}, status.Error(codes.Unauthenticated, err.Error())
	}
	var a serverlessv1.Application
	if err := s.opts.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: app}, &a); err != nil {
		// An unknown application says no more than a bad token does.
		return caller{}, status.Error(codes.Unauthenticated, apptoken.ErrInvalid.Error())
	}
	if err := apptoken.Check(token, a.Annotations, s.opts.Clock.Now()); err != nil {
		return caller{}, status.Error(codes.Unauthenticated, err.Error())
	}
	return caller{namespace: ns, app: app}, nil
}

func (s *Server) grpcCaller(ctx context.Context) (caller, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var tok string
	if v := md.Get("authorization"); len(v) > 0 {
		tok = bearer(v[0])
	}
	return s.authenticate(ctx, tok)
}

// Open implements pb.SessionsServer.
func (s *Server) Open(ctx context.Context, req *pb.OpenRequest) (*pb.Session, error) {
	c, err := s.grpcCaller(ctx)
	if err != nil {
		return nil, err
	}
	return s.open(ctx, c, req)
}

func (s *Server) open(ctx context.Context, c caller, req *pb.OpenRequest) (*pb.Session, error) {
	start := s.opts.Clock.Now()
	if req.GetApplication() != "" && req.GetApplication() != c.app {
		return nil, status.Errorf(codes.PermissionDenied, "the token is of application %s, not %s", c.app, req.GetApplication())
	}
	if len(req.GetData()) > 64 {
		return nil, status.Errorf(codes.InvalidArgument, "session data has %d keys: at most 64", len(req.GetData()))
	}
	var a serverlessv1.Application
	if err := s.opts.Client.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: c.app}, &a); err != nil {
		return nil, status.Errorf(codes.NotFound, "application %s/%s: %v", c.namespace, c.app, err)
	}
	timeout := a.Spec.Session.OpenTimeout.Duration
	var override *time.Duration
	if ms := req.GetOpenTimeoutMillis(); ms > 0 {
		d := time.Duration(ms) * time.Millisecond
		if d < 100*time.Millisecond || d > time.Hour {
			return nil, status.Error(codes.InvalidArgument, "open_timeout_millis: want 100 to 3600000")
		}
		timeout, override = d, &d
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	sess, err := s.opts.Opener.Open(ctx, c.namespace, c.app, req.GetData(), override)
	if err != nil {
		s.opens.WithLabelValues("Error").Inc()
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "open a session of %s/%s: %v", c.namespace, c.app, err)
		}
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
			return nil, err
		}
		return nil, status.Errorf(codes.Unavailable, "open a session of %s/%s: %v", c.namespace, c.app, err)
	}
	key := types.NamespacedName{Namespace: sess.Namespace, Name: sess.Name}
	// The hub writes Ready once the instance called SessionReady; the
	// agent closes a session that misses its open timeout, so a wait a
	// little longer always sees an end.
	wctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	got, err := s.wait(wctx, key, sess, func(x *serverlessv1.ApplicationSession) bool {
		return x.Status.Phase.Open() || x.Status.Phase.Final()
	})
	if err != nil {
		s.opens.WithLabelValues("Timeout").Inc()
		if ctx.Err() == nil {
			return nil, status.Errorf(codes.DeadlineExceeded, "session %s of %s/%s did not open within %s (it is %s; its node's hub closes it)", sess.Name, c.namespace, c.app, timeout, orPending(got))
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if got.Status.Phase.Final() {
		s.opens.WithLabelValues(cmp.Or(got.Status.Reason, "Terminated")).Inc()
		return nil, status.Error(codeOf(got.Status.Reason), fmt.Sprintf("session %s of %s/%s did not open: %s: %s", got.Name, c.namespace, c.app, got.Status.Reason, got.Status.Message))
	}
	took := s.opts.Clock.Since(start)
	s.opens.WithLabelValues("Ready").Inc()
	s.openDur.Observe(took.Seconds())
	out := toProto(got)
	out.OpenMillis = took.Milliseconds()
	return out, nil
}

func orPending(s *serverlessv1.ApplicationSession) string {
	if s == nil || s.Status.Phase == "" {
		return string(serverlessv1.SessionPending)
	}
	return string(s.Status.Phase)
}

// codeOf maps a session's end reason to the code an Open fails with.
func codeOf(reason string) codes.Code {
	switch reason {
	case serverlessv1.ReasonNoCapacity:
		return codes.ResourceExhausted
	case serverlessv1.ReasonApplicationNotFound:
		return codes.NotFound
	case serverlessv1.ReasonApplicationIsDaemon:
		return codes.FailedPrecondition
	case serverlessv1.ReasonOpenTimeout:
		return codes.DeadlineExceeded
	}
	return codes.Aborted
}

// wait reads key from the cache until done accepts it or ctx ends; it
// returns the last object seen.
func (s *Server) wait(ctx context.Context, key types.NamespacedName, last *serverlessv1.ApplicationSession, done func(*serverlessv1.ApplicationSession) bool) (*serverlessv1.ApplicationSession, error) {
	ch, cancel := s.subscribe(key)
	defer cancel()
	for {
		var cur serverlessv1.ApplicationSession
		err := s.opts.Client.Get(ctx, key, &cur)
		switch {
		case err == nil:
			last = &cur
			if done(last) {
				return last, nil
			}
		case apierrors.IsNotFound(err):
			if last != nil && last.Status.Phase.Final() {
				return last, nil
			}
		default:
			if ctx.Err() == nil {
				s.log.Warn("read a session from the cache", "session", key, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-ch:
		}
	}
}

// get reads a session of the caller's application.
func (s *Server) get(ctx context.Context, c caller, name string) (*serverlessv1.ApplicationSession, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name: the session's name is required")
	}
	var sess serverlessv1.ApplicationSession
	if err := s.opts.Client.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, &sess); err != nil || sess.Spec.Application != c.app {
		return nil, status.Errorf(codes.NotFound, "application %s has no session %s", c.app, name)
	}
	return &sess, nil
}

// Get implements pb.SessionsServer.
func (s *Server) Get(ctx context.Context, req *pb.GetRequest) (*pb.Session, error) {
	c, err := s.grpcCaller(ctx)
	if err != nil {
		return nil, err
	}
	sess, err := s.get(ctx, c, req.GetName())
	if err != nil {
		return nil, err
	}
	return toProto(sess), nil
}

// Close implements pb.SessionsServer.
func (s *Server) Close(ctx context.Context, req *pb.GetRequest) (*pb.Session, error) {
	c, err := s.grpcCaller(ctx)
	if err != nil {
		return nil, err
	}
	return s.close(ctx, c, req.GetName())
}

func (s *Server) close(ctx context.Context, c caller, name string) (*pb.Session, error) {
	sess, err := s.get(ctx, c, name)
	if err != nil {
		return nil, err
	}
	if err := s.opts.Client.Delete(ctx, sess); err != nil && !apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.Unavailable, "close session %s: %v", name, err)
	}
	out := toProto(sess)
	if !sess.Status.Phase.Final() {
		out.Reason = "Closing"
	}
	return out, nil
}

// Watch implements pb.SessionsServer.
func (s *Server) Watch(req *pb.GetRequest, stream grpc.ServerStreamingServer[pb.Session]) error {
	c, err := s.grpcCaller(stream.Context())
	if err != nil {
		return err
	}
	return s.watch(stream.Context(), c, req.GetName(), stream.Send)
}

// watch sends the session, then each change, until it is Terminated or
// gone, or ctx ends.
func (s *Server) watch(ctx context.Context, c caller, name string, send func(*pb.Session) error) error {
	sess, err := s.get(ctx, c, name)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: c.namespace, Name: name}
	ch, cancel := s.subscribe(key)
	defer cancel()
	last := ""
	for {
		if v := sess.ResourceVersion; v != last {
			last = v
			if err := send(toProto(sess)); err != nil {
				return err
			}
		}
		if sess.Status.Phase.Final() {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
		var cur serverlessv1.ApplicationSession
		if err := s.opts.Client.Get(ctx, key, &cur); err != nil {
			if apierrors.IsNotFound(err) {
				return nil // closed and removed
			}
			continue
		}
		sess = &cur
	}
}

func toProto(s *serverlessv1.ApplicationSession) *pb.Session {
	out := &pb.Session{
		Name: s.Name, Namespace: s.Namespace, Application: s.Spec.Application,
		Phase: orPending(s), Reason: s.Status.Reason, Message: s.Status.Message,
		Node: s.Spec.NodeName, Instance: s.Spec.InstanceName, Clients: s.Status.Clients, Flagged: s.Status.Flagged,
		CreatedUnixMillis: s.CreationTimestamp.UnixMilli(),
	}
	if e := s.Status.Endpoint; e != nil {
		out.Endpoint = &pb.Endpoint{Host: e.Host, Port: e.Port, Name: e.Name}
	}
	if t := s.Status.ReadyTime; t != nil {
		out.ReadyUnixMillis = t.UnixMilli()
	}
	if t := s.Status.CloseTime; t != nil {
		out.ClosedUnixMillis = t.UnixMilli()
	}
	return out
}

// Handler serves gRPC (HTTP/2 with content-type application/grpc) and the
// HTTP/JSON routes on one port.
func (s *Server) Handler() http.Handler {
	mux := s.httpMux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			s.grpc.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Stop stops the gRPC part (open streams end).
func (s *Server) Stop() { s.grpc.Stop() }

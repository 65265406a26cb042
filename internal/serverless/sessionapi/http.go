package sessionapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/drover-fleet/drover/pkg/sessionapi/sessionapiv1"
)

// The HTTP/JSON form of the API (protojson bodies, field names as in the
// proto's JSON mapping):
//
//	POST   /v1/sessions               OpenRequest  → Session (when Ready)
//	GET    /v1/sessions/{name}                     → Session
//	GET    /v1/sessions/{name}/watch               → Session per line (NDJSON) until Terminated
//	DELETE /v1/sessions/{name}                     → Session (closing)
//
// Errors are {"code": "<gRPC code name>", "message": "..."} with the HTTP
// status gRPC-gateway uses for the code.

const maxBody = 1 << 20

func (s *Server) httpMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", s.httpAuth(func(w http.ResponseWriter, r *http.Request, c caller) {
		var req pb.OpenRequest
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			writeError(w, status.Errorf(codes.InvalidArgument, "read the request: %v", err))
			return
		}
		if len(body) > 0 {
			if err := protojson.Unmarshal(body, &req); err != nil {
				writeError(w, status.Errorf(codes.InvalidArgument, "the request is not an OpenRequest: %v", err))
				return
			}
		}
		out, err := s.open(r.Context(), c, &req)
		writeResult(w, out, err)
	}))
	mux.HandleFunc("GET /v1/sessions/{name}", s.httpAuth(func(w http.ResponseWriter, r *http.Request, c caller) {
		sess, err := s.get(r.Context(), c, r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeResult(w, toProto(sess), nil)
	}))
	mux.HandleFunc("DELETE /v1/sessions/{name}", s.httpAuth(func(w http.ResponseWriter, r *http.Request, c caller) {
		out, err := s.close(r.Context(), c, r.PathValue("name"))
		writeResult(w, out, err)
	}))
	mux.HandleFunc("GET /v1/sessions/{name}/watch", s.httpAuth(func(w http.ResponseWriter, r *http.Request, c caller) {
		flusher, _ := w.(http.Flusher)
		started := false
		err := s.watch(r.Context(), c, r.PathValue("name"), func(p *pb.Session) error {
			b, err := protojson.Marshal(p)
			if err != nil {
				return err
			}
			if !started {
				w.Header().Set("Content-Type", "application/x-ndjson")
				started = true
			}
			if _, err := w.Write(append(b, '\n')); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			return nil
		})
		if err != nil && !started {
			writeError(w, err)
		}
	}))
	return mux
}

func (s *Server) httpAuth(h func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := s.authenticate(r.Context(), bearer(r.Header.Get("Authorization")))
		if err != nil {
			writeError(w, err)
			return
		}
		h(w, r, c)
	}
}

func writeResult(w http.ResponseWriter, out *pb.Session, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	b, err := protojson.Marshal(out)
	if err != nil {
		writeError(w, status.Errorf(codes.Internal, "encode the session: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(st.Code()))
	_ = json.NewEncoder(w).Encode(map[string]string{"code": st.Code().String(), "message": st.Message()})
}

// httpStatus maps gRPC codes as gRPC-gateway does.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.FailedPrecondition:
		return http.StatusPreconditionFailed
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled:
		return 499
	}
	return http.StatusInternalServerError
}

// Runnable serves the API on Address for as long as its manager leads: a
// controller-runtime Runnable that needs leader election, because binding
// happens in the leader's memory.
type Runnable struct {
	Server  *Server
	Address string
	// TLS, when set, serves HTTPS (and gRPC over TLS). Unset: plaintext
	// (HTTP/1.1 and HTTP/2 without TLS), allowed only on a loopback address.
	TLS *tls.Config
	// Ready, when set, is called with the bound address once listening.
	Ready func(addr string)
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (r *Runnable) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (r *Runnable) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", r.Address)
	if err != nil {
		return fmt.Errorf("session API: listen on %s: %w", r.Address, err)
	}
	if r.TLS == nil {
		if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			ln.Close()
			return fmt.Errorf("session API on %s: without TLS it serves only a loopback address (tokens would cross the network in the clear); give --session-api-cert-file and --session-api-key-file", r.Address)
		}
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(r.TLS == nil)
	srv := &http.Server{Handler: r.Server.Handler(), Protocols: &protos, ReadHeaderTimeout: 10 * time.Second, TLSConfig: r.TLS}
	if r.Ready != nil {
		r.Ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() {
		if r.TLS != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case <-ctx.Done():
		r.Server.Stop()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("session API: %w", err)
	}
}

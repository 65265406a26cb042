package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRegisterRetriesWhenRateLimited: a hub that rate-limits registration
// (ResourceExhausted) is asked again after at least its retry hint, not
// given up on; a bad token still ends the agent with a clear message.
func TestRegisterRetriesWhenRateLimited(t *testing.T) {
	st, err := status.New(codes.ResourceExhausted, "too many registrations from 192.0.2.1/32; retry in 7s").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(7 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	limited := st.Err()
	if f := registerFatal("hub:7443", limited, "/state/registration.key"); f != nil {
		t.Errorf("ResourceExhausted ends the agent: %v; want a retry", f)
	}
	if got := registerWait(limited, time.Second); got != 7*time.Second {
		t.Errorf("wait after a 7s hint with a 1s backoff: %v, want 7s", got)
	}
	if got := registerWait(limited, 30*time.Second); got != 30*time.Second {
		t.Errorf("wait after a 7s hint with a 30s backoff: %v, want 30s", got)
	}
	if got := registerWait(status.Error(codes.Unavailable, "no hub"), 2*time.Second); got != 2*time.Second {
		t.Errorf("wait after Unavailable: %v, want the 2s backoff", got)
	}
	bad := status.Error(codes.Unauthenticated, "bootstrap token is not valid: it is unknown, wrong or expired; ask an operator for a new one (drover token create)")
	var fatal *FatalError
	if f := registerFatal("hub:7443", bad, "/state/registration.key"); !errors.As(f, &fatal) || !strings.Contains(f.Error(), "token is not valid") {
		t.Errorf("a bad token: %v, want a FatalError saying the token is not valid", f)
	}
}

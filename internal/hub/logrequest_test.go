package hub

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLogRequestsAreBounded(t *testing.T) {
	h := &Hub{opts: Options{Name: "hub-a"}, logReqs: map[string]*logRequest{}}
	for i := range maxLogRequestsPerNode {
		if err := h.addLogRequest(fmt.Sprint("a", i), &logRequest{node: "node-1"}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	err := h.addLogRequest("one-more", &logRequest{node: "node-1"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("request over the per-node bound: %v, want ResourceExhausted", err)
	}
	if err := h.addLogRequest("other", &logRequest{node: "node-2"}); err != nil {
		t.Fatalf("another node's request: %v", err)
	}
	for i := len(h.logReqs); i < maxLogRequests; i++ {
		h.logReqs[fmt.Sprint("f", i)] = &logRequest{node: fmt.Sprint("n", i)}
	}
	if err := h.addLogRequest("x", &logRequest{node: "node-3"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("request over the hub's bound: %v, want ResourceExhausted", err)
	}
}

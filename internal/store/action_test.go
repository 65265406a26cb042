package store

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
)

func TestActionsKeepFirstRunOrderAndSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	s := openAt(t, path)
	steps := []Action{
		{UID: "u1", Action: "Check", State: ActionRunning},
		{UID: "u1", Action: "Check", State: ActionSucceeded},
		{UID: "u2", Action: "Check", State: ActionRunning},
		{UID: "u1", Action: "Upgrade", State: ActionRunning, Data: []byte(`{"stage":"download"}`)},
		{UID: "u1", Action: "Upgrade", State: ActionFailed, Reason: "digest mismatch", Data: []byte(`{"stage":"download"}`)},
	}
	for _, a := range steps {
		must(t, s.SetAction(ctx, a))
	}
	must(t, s.MarkActionReported(ctx, "u1", "Check"))
	must(t, s.Close())

	s = openAt(t, path)
	got, err := s.Actions(ctx, "u1")
	must(t, err)
	want := []Action{
		{UID: "u1", Action: "Check", State: ActionSucceeded, Reported: true, UpdatedAt: t0},
		{UID: "u1", Action: "Upgrade", State: ActionFailed, Reason: "digest mismatch", Data: []byte(`{"stage":"download"}`), UpdatedAt: t0},
	}
	for i := range got {
		got[i].UpdatedAt = got[i].UpdatedAt.UTC()
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Actions(u1) = %+v\nwant %+v", got, want)
	}
	running, err := s.ActionsInState(ctx, ActionRunning)
	must(t, err)
	if len(running) != 1 || running[0].UID != "u2" {
		t.Errorf("ActionsInState(Running) = %+v, want u2's Check", running)
	}
	must(t, s.DeleteActions(ctx, "u1"))
	must(t, s.DeleteActions(ctx, "u1")) // idempotent
	if got, _ := s.Actions(ctx, "u1"); len(got) != 0 {
		t.Errorf("Actions(u1) after DeleteActions = %+v, want none", got)
	}
}

func TestActionErrors(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	if err := s.SetAction(ctx, Action{UID: "u"}); err == nil {
		t.Error("SetAction without action and state = nil, want an error")
	}
	if err := s.MarkActionReported(ctx, "u", "Check"); !errors.Is(err, ErrNotFound) {
		t.Errorf("MarkActionReported(unknown) = %v, want ErrNotFound", err)
	}
}

func TestSetWorkSpec(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	_, err := s.PutWork(ctx, Work{UID: "u", Type: "t", Spec: []byte(`{"a":1}`)})
	must(t, err)
	tests := []struct {
		name    string
		spec    string
		changed bool
	}{
		{"a new spec replaces the old", `{"a":2}`, true},
		{"the same spec changes nothing", `{"a":2}`, false},
	}
	for _, tt := range tests {
		changed, err := s.SetWorkSpec(ctx, "u", []byte(tt.spec))
		must(t, err)
		if changed != tt.changed {
			t.Errorf("%s: changed = %v, want %v", tt.name, changed, tt.changed)
		}
		w, _, _ := s.Work(ctx, "u")
		if string(w.Spec) != tt.spec {
			t.Errorf("%s: spec = %s, want %s", tt.name, w.Spec, tt.spec)
		}
	}
	if _, err := s.SetWorkSpec(ctx, "nope", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetWorkSpec(unknown) = %v, want ErrNotFound", err)
	}
	must(t, s.SetWorkPhase(ctx, "u", "Succeeded", ""))
	if _, err := s.SetWorkSpec(ctx, "u", []byte(`{}`)); err == nil {
		t.Error("SetWorkSpec(ended work) = nil, want an error")
	}
}

package inplace

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// DefaultAnswerTimeout is how long an update request waits for every
// registered updater to answer.
const DefaultAnswerTimeout = 2 * time.Minute

// Registration is what an update request knows of an UpdaterRegistration.
type Registration struct {
	Name        string
	Sequence    int32
	TemplateRef *updatev1.ObjectRef
	// Claims: path prefixes answered for the updater (no hook).
	Claims []string
}

// StaticAnswer is the answer of a registration with claims: accept the
// changed paths under its prefixes, or reject when there are none.
func StaticAnswer(r Registration, changes []Change) updatev1.UpdaterAnswer {
	a := updatev1.UpdaterAnswer{UpdaterName: r.Name, Status: updatev1.AnswerReject, Message: "claims none of the changed paths"}
	for _, c := range changes {
		for _, p := range r.Claims {
			if strings.HasPrefix(c.Path, p) {
				a.Responsibilities = append(a.Responsibilities, c.Path)
				break
			}
		}
	}
	if len(a.Responsibilities) > 0 {
		a.Status, a.Message = updatev1.AnswerAccept, "claimed by the registration's prefixes"
	}
	return a
}

// RequestInput is an update request's state for StepRequest.
type RequestInput struct {
	Changes       []Change
	Registrations []Registration
	Answers       []updatev1.UpdaterAnswer
	// Created is when the request was made; AnswerTimeout bounds the wait
	// for answers (0: DefaultAnswerTimeout).
	Created, Now  time.Time
	AnswerTimeout time.Duration
	// Unreachable: why a hook could not be called, by updater (the last
	// attempt), to say so when the answers time out.
	Unreachable map[string]string
}

// RequestDecision is what an update request does next.
type RequestDecision struct {
	Phase           updatev1.RequestPhase
	Reason, Message string
	// Updaters of the plan to make (Planned).
	Updaters     []updatev1.Updater
	RequeueAfter time.Duration
}

// StepRequest decides an update request: an empty change set ends it
// updated; an updater's error or missing answers at the timeout fail it;
// once every registered updater answered, Claim makes the plan's updaters
// or fails it naming the unclaimed (or twice claimed) paths.
func StepRequest(in RequestInput) RequestDecision {
	if len(in.Changes) == 0 {
		return RequestDecision{Phase: updatev1.RequestUpdated, Reason: updatev1.ReasonNothingToUpdate,
			Message: "every node of the pool is at the template already"}
	}
	answered := map[string]updatev1.UpdaterAnswer{}
	for _, a := range in.Answers {
		answered[a.UpdaterName] = a
	}
	regs := append([]Registration(nil), in.Registrations...)
	sort.Slice(regs, func(i, j int) bool { return regs[i].Name < regs[j].Name })
	var missing []string
	var answers []Answer
	for _, r := range regs {
		a, ok := answered[r.Name]
		if !ok {
			missing = append(missing, r.Name)
			continue
		}
		switch a.Status {
		case updatev1.AnswerError:
			return RequestDecision{Phase: updatev1.RequestFailed, Reason: updatev1.ReasonUpdaterError,
				Message: fmt.Sprintf("updater %s answered error: %s", r.Name, orUnknown(a.Message))}
		case updatev1.AnswerAccept:
			ref := r.TemplateRef
			if a.UpdateTaskTemplateRef != nil {
				ref = a.UpdateTaskTemplateRef
			}
			if ref == nil {
				return RequestDecision{Phase: updatev1.RequestFailed, Reason: updatev1.ReasonUpdaterError,
					Message: fmt.Sprintf("updater %s accepted but neither its answer nor its registration names an updateTaskTemplateRef", r.Name)}
			}
			answers = append(answers, Answer{UpdaterName: r.Name, Status: string(a.Status), Message: a.Message,
				Responsibilities: a.Responsibilities, Sequence: r.Sequence, TemplateRef: *ref})
		}
	}
	if len(missing) > 0 {
		timeout := in.AnswerTimeout
		if timeout <= 0 {
			timeout = DefaultAnswerTimeout
		}
		why := make([]string, len(missing))
		for i, m := range missing {
			why[i] = m
			if u := in.Unreachable[m]; u != "" {
				why[i] += " (" + u + ")"
			}
		}
		if left := in.Created.Add(timeout).Sub(in.Now); left > 0 {
			return RequestDecision{Phase: updatev1.RequestPending, Reason: updatev1.ReasonWaitingForAnswers,
				Message: "waiting for the answers of " + strings.Join(why, ", "), RequeueAfter: left}
		}
		return RequestDecision{Phase: updatev1.RequestFailed, Reason: updatev1.ReasonAnswerTimeout,
			Message: fmt.Sprintf("no answer within %v from %s", timeout, strings.Join(why, ", "))}
	}
	ups, err := Claim(in.Changes, answers)
	if err != nil {
		reason := updatev1.ReasonUnclaimed
		var ce *ClaimError
		if errors.As(err, &ce) && ce.Twice {
			reason = updatev1.ReasonClaimedTwice
		}
		return RequestDecision{Phase: updatev1.RequestFailed, Reason: reason, Message: err.Error()}
	}
	names := make([]string, len(ups))
	for i, u := range ups {
		names[i] = u.Name
	}
	return RequestDecision{Phase: updatev1.RequestPlanned, Reason: updatev1.ReasonPlanned, Updaters: ups,
		Message: fmt.Sprintf("%d change(s) claimed by %s", len(in.Changes), strings.Join(names, ", "))}
}

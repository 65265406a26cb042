package inplace

import (
	"strings"
	"testing"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func TestStepRequest(t *testing.T) {
	created := now.Add(-30 * time.Second)
	ref := &updatev1.ObjectRef{APIVersion: "update.drover.io/v1alpha1", Kind: "AgentVersionUpdateTaskTemplate", Name: "v2"}
	filesRef := &updatev1.ObjectRef{APIVersion: "updaters.example.com/v1", Kind: "FilesTemplate", Name: "files"}
	changes := []Change{
		{Path: PathAgentVersion, SelectResource: updatev1.SelectNodeSpec, Value: "v2"},
		{Path: PathFilePrefix + "/etc/app.conf", SelectResource: updatev1.SelectConfiguration, Value: "a=2"},
	}
	agent := Registration{Name: "agent", Sequence: 2, TemplateRef: ref, Claims: []string{PathAgentVersion}}
	files := Registration{Name: "files", Sequence: 1, TemplateRef: filesRef}
	accept := func(name string, paths ...string) updatev1.UpdaterAnswer {
		return updatev1.UpdaterAnswer{UpdaterName: name, Status: updatev1.AnswerAccept, Responsibilities: paths}
	}
	tests := []struct {
		name       string
		in         RequestInput
		wantPhase  updatev1.RequestPhase
		wantReason string
		wantMsg    string
		wantUps    []string
	}{
		{"an empty change set ends updated at once", RequestInput{Registrations: []Registration{agent}},
			updatev1.RequestUpdated, updatev1.ReasonNothingToUpdate, "", nil},
		{"waits for every registered updater", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{StaticAnswer(agent, changes)}, Unreachable: map[string]string{"files": "connection refused"}},
			updatev1.RequestPending, updatev1.ReasonWaitingForAnswers, "waiting for the answers of files (connection refused)", nil},
		{"every change claimed: the plan's updaters by sequence", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{StaticAnswer(agent, changes), accept("files", PathFilePrefix+"/etc/app.conf")}},
			updatev1.RequestPlanned, updatev1.ReasonPlanned, "2 change(s) claimed by files, agent", []string{"files", "agent"}},
		{"an unclaimed path fails naming it", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{StaticAnswer(agent, changes), {UpdaterName: "files", Status: updatev1.AnswerReject}}},
			updatev1.RequestFailed, updatev1.ReasonUnclaimed, "no updater claims /files/etc/app.conf", nil},
		{"no registration at all: every path unclaimed", RequestInput{Changes: changes},
			updatev1.RequestFailed, updatev1.ReasonUnclaimed, "no updater claims /spec/agentVersion, /files/etc/app.conf", nil},
		{"a path claimed twice fails naming both", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{StaticAnswer(agent, changes), accept("files", PathAgentVersion, PathFilePrefix+"/etc/app.conf")}},
			updatev1.RequestFailed, updatev1.ReasonClaimedTwice, "claimed by updaters agent and files", nil},
		{"an updater's error fails the request", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{{UpdaterName: "files", Status: updatev1.AnswerError, Message: "inventory down"}}},
			updatev1.RequestFailed, updatev1.ReasonUpdaterError, "updater files answered error: inventory down", nil},
		{"no answer in time fails naming the silent updater", RequestInput{Changes: changes, Registrations: []Registration{agent, files},
			Answers: []updatev1.UpdaterAnswer{StaticAnswer(agent, changes)}, AnswerTimeout: 20 * time.Second},
			updatev1.RequestFailed, updatev1.ReasonAnswerTimeout, "no answer within 20s from files", nil},
		{"an accept without a template fails", RequestInput{Changes: changes[:1], Registrations: []Registration{{Name: "bare", Sequence: 1}},
			Answers: []updatev1.UpdaterAnswer{accept("bare", PathAgentVersion)}},
			updatev1.RequestFailed, updatev1.ReasonUpdaterError, "names an updateTaskTemplateRef", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Created, in.Now = created, now
			d := StepRequest(in)
			var ups []string
			for _, u := range d.Updaters {
				ups = append(ups, u.Name)
			}
			if d.Phase != tt.wantPhase || d.Reason != tt.wantReason || !strings.Contains(d.Message, tt.wantMsg) || strings.Join(ups, ",") != strings.Join(tt.wantUps, ",") {
				t.Errorf("StepRequest() = %s %s %q %v; want %s %s containing %q, updaters %v", d.Phase, d.Reason, d.Message, ups, tt.wantPhase, tt.wantReason, tt.wantMsg, tt.wantUps)
			}
			if d.Phase == updatev1.RequestPending && d.RequeueAfter != DefaultAnswerTimeout-30*time.Second {
				t.Errorf("RequeueAfter = %s, want the rest of the answer timeout", d.RequeueAfter)
			}
		})
	}
}

func TestStaticAnswer(t *testing.T) {
	changes := []Change{{Path: PathAgentVersion}, {Path: "/files/etc/a.conf"}, {Path: "/files/opt/b.conf"}}
	a := StaticAnswer(Registration{Name: "etc", Claims: []string{"/files/etc/"}}, changes)
	if a.Status != updatev1.AnswerAccept || strings.Join(a.Responsibilities, ",") != "/files/etc/a.conf" {
		t.Errorf("StaticAnswer() = %+v, want accept of /files/etc/a.conf only", a)
	}
	if a := StaticAnswer(Registration{Name: "os", Claims: []string{PathOSImage}}, changes); a.Status != updatev1.AnswerReject {
		t.Errorf("StaticAnswer() = %+v, want reject", a)
	}
}

package nodejobwire

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestDecodeUpgradeRejectsWhatTheAPIRejects(t *testing.T) {
	ok := `{"job":"j","version":"v1.2.3","url":"https://example.com/a","sha256":"` + digest + `"}`
	if _, err := DecodeUpgrade([]byte(ok)); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, bad := range []string{
		`{"version":"v1.2.3; reboot","url":"https://example.com/a","sha256":"` + digest + `"}`,
		`{"version":"v1.2.3","url":"https://example.com/$(id)","sha256":"` + digest + `"}`,
		`{"version":"v1.2.3","url":"file:///bin/sh","sha256":"` + digest + `"}`,
		`{"version":"v1.2.3","image":"nginx;id","sha256":"` + digest + `"}`,
		`{"version":"v1.2.3","url":"https://example.com/a","image":"nginx","sha256":"` + digest + `"}`,
		`{"version":"v1.2.3","url":"https://example.com/a","sha256":"abc"}`,
		`{"version":"v1.2.3","url":"https://example.com/a","sha256":"` + digest + `","checks":{"items":["gpu"]}}`,
		`not json`,
	} {
		if _, err := DecodeUpgrade([]byte(bad)); err == nil {
			t.Errorf("DecodeUpgrade(%s) accepted", bad)
		}
	}
}

func TestDecodePrePull(t *testing.T) {
	if _, err := DecodePrePull([]byte(`{"images":["nginx","localhost:5000/a/b:v1"],"retryTimes":2}`)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{"images":[]}`, "{\"images\":[\"nginx`id`\"]}", `{"images":["nginx"],"retryTimes":11}`} {
		if _, err := DecodePrePull([]byte(bad)); err == nil {
			t.Errorf("DecodePrePull(%s) accepted", bad)
		}
	}
}

func TestReportRoundTripClips(t *testing.T) {
	r := Report{Action: "Pull", Reason: strings.Repeat("é", 400), Images: []ImageResult{{Image: "nginx", Reason: strings.Repeat("x", 1000)}}}
	got, err := DecodeReport(EncodeReport(r))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Reason) > MaxReasonBytes || !utf8.ValidString(got.Reason) || len(got.Images[0].Reason) > MaxReasonBytes {
		t.Errorf("not clipped: %d %d", len(got.Reason), len(got.Images[0].Reason))
	}
	if _, err := DecodeReport(`{"action":""}`); err == nil {
		t.Error("a report without an action was accepted")
	}
}

func TestItemsPassTheProtocolsChecks(t *testing.T) {
	uid := "1a504b8a-aa19-4762-bb70-9592f0db36e8"
	for _, it := range []*agentv1.WorkItem{
		{Uid: uid, Type: TypeUpgrade, Spec: []byte(`{}`)},
		{Uid: uid, Type: TypePrePull, Spec: []byte(`{}`)},
		{Uid: ConfirmUID(uid), Type: TypeConfirm, Spec: []byte(`{}`)},
	} {
		if err := protocol.Validate(protocol.NewDispatch("node-1", 1, it)); err != nil {
			t.Errorf("item %s/%s: %v", it.GetType(), it.GetUid(), err)
		}
	}
}

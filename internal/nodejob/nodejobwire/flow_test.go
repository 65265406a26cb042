package nodejobwire

import "testing"

// walk runs f with outcomes[action] (default success) and returns the
// actions visited and the result.
func walk(f *Flow, outcomes map[string]bool) ([]string, Result) {
	var seen []string
	a := f.First
	for {
		seen = append(seen, a.Name)
		ok, set := outcomes[a.Name]
		if !set {
			ok = true
		}
		if r := After(a, ok); r != Running {
			return seen, r
		}
		a = a.Next(ok)
	}
}

func TestFlows(t *testing.T) {
	tests := []struct {
		name     string
		flow     *Flow
		outcomes map[string]bool
		want     string
		result   Result
	}{
		{"upgrade ok", UpgradeFlow(false), nil, "Check BackUp Upgrade", Succeeded},
		{"upgrade with confirmation", UpgradeFlow(true), nil, "Check Confirm BackUp Upgrade", Succeeded},
		{"check fails: nothing touched", UpgradeFlow(false), map[string]bool{Check: false}, "Check", Failed},
		{"backup fails: no upgrade", UpgradeFlow(true), map[string]bool{BackUp: false}, "Check Confirm BackUp", Failed},
		{"upgrade fails: rollback, still a failure", UpgradeFlow(false), map[string]bool{Upgrade: false}, "Check BackUp Upgrade RollBack", Failed},
		{"rollback fails too", UpgradeFlow(false), map[string]bool{Upgrade: false, RollBack: false}, "Check BackUp Upgrade RollBack", Failed},
		{"pre-pull ok", PrePullFlow(), nil, "Check Pull", Succeeded},
		{"pull fails", PrePullFlow(), map[string]bool{Pull: false}, "Check Pull", Failed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen, r := walk(tt.flow, tt.outcomes)
			got := ""
			for i, s := range seen {
				if i > 0 {
					got += " "
				}
				got += s
			}
			if got != tt.want || r != tt.result {
				t.Errorf("flow ran %q → %v, want %q → %v", got, r, tt.want, tt.result)
			}
		})
	}
}

func TestFind(t *testing.T) {
	f := UpgradeFlow(true)
	for _, name := range []string{Check, Confirm, BackUp, Upgrade, RollBack} {
		if a := f.Find(name); a == nil || a.Name != name {
			t.Errorf("Find(%q) = %v", name, a)
		}
	}
	if a := UpgradeFlow(false).Find(Confirm); a != nil {
		t.Errorf("a flow without confirmation has %v", a)
	}
	if a := f.Find("Reboot"); a != nil {
		t.Errorf("Find(Reboot) = %v", a)
	}
	if !f.Find(RollBack).Final() || f.Find(Check).Final() {
		t.Error("Final() wrong")
	}
}

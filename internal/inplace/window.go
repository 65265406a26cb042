package inplace

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	// Maintenance windows name IANA zones; the manager may run in an
	// image without /usr/share/zoneinfo.
	_ "time/tzdata"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// cronParser reads the five standard cron fields; descriptors such as
// @daily are accepted too, seconds are not (windows are minutes apart).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// WindowState says whether a pool may start nodes now.
type WindowState struct {
	// Open: no windows are set, or one is open now.
	Open bool
	// Until is when the open window closes (zero without windows); Next,
	// when closed, is when the next window opens.
	Until, Next time.Time
	// Err: a window cannot be parsed; nothing starts until it is fixed.
	Err error
}

// Blocked returns the pool's preflight reason and message when the window
// state keeps nodes from starting, and how long until it may change.
func (w WindowState) Blocked(now time.Time) (reason, why string, after time.Duration) {
	switch {
	case w.Err != nil:
		return updatev1.ReasonInvalidWindow, w.Err.Error(), PreflightRequeue
	case w.Open:
		return "", "", 0
	}
	after = w.Next.Sub(now)
	return updatev1.ReasonOutsideWindow, fmt.Sprintf("no maintenance window is open; the next opens at %s (in %s)",
		w.Next.UTC().Format(time.RFC3339), after.Round(time.Second)), after
}

// Windows evaluates a pool's maintenance windows at now. A window opened
// by its schedule at s is open during [s, s+duration).
func Windows(ws []updatev1.MaintenanceWindow, now time.Time) WindowState {
	if len(ws) == 0 {
		return WindowState{Open: true}
	}
	var st WindowState
	for i, w := range ws {
		sched, loc, err := parseWindow(w)
		if err != nil {
			return WindowState{Err: fmt.Errorf("maintenanceWindows[%d]: %w", i, err)}
		}
		d := w.Duration.Duration
		at := now.In(loc)
		// The window holding now, if any, opened in (now-d, now]: the
		// first activation after now-d (minus a nanosecond, since Next is
		// strictly after) is either that one or the next window.
		s := sched.Next(at.Add(-d).Add(-time.Nanosecond))
		if !s.IsZero() && !s.Add(d).After(at) {
			s = sched.Next(s) // that one closed exactly now
		}
		if s.IsZero() {
			continue // a schedule that never fires, e.g. 30 February
		}
		if !s.After(at) {
			st.Open = true
			if end := s.Add(d); end.After(st.Until) {
				st.Until = end
			}
			continue
		}
		if st.Next.IsZero() || s.Before(st.Next) {
			st.Next = s
		}
	}
	if !st.Open && st.Next.IsZero() {
		st.Err = fmt.Errorf("no maintenance window ever opens: check the schedules' day of month and month")
	}
	return st
}

func parseWindow(w updatev1.MaintenanceWindow) (cron.Schedule, *time.Location, error) {
	if strings.Contains(w.Schedule, "TZ=") {
		return nil, nil, fmt.Errorf("schedule %q: set the time zone in timeZone, not in the schedule", w.Schedule)
	}
	if w.Duration.Duration <= 0 {
		return nil, nil, fmt.Errorf("duration %s: must be positive, e.g. 2h", w.Duration.Duration)
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" {
		return nil, nil, fmt.Errorf("timeZone %q: not an IANA time zone such as Europe/Berlin", w.TimeZone)
	}
	sched, err := cronParser.Parse(w.Schedule)
	if err != nil {
		return nil, nil, fmt.Errorf("schedule %q: %w (five cron fields: minute hour day-of-month month day-of-week)", w.Schedule, err)
	}
	return sched, loc, nil
}

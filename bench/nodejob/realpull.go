package main

import (
	"context"
	"errors"
)

type realResult struct{}

func (r *runner) runReal(ctx context.Context) (*realResult, error) { return nil, errors.New("not yet") }

func (rr *realResult) markdown() string { return "" }

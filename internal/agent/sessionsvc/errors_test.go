package sessionsvc

import "errors"

// errorsCause is the innermost error (the SDK wraps the gRPC status).
func errorsCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

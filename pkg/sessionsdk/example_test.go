package sessionsdk_test

import (
	"context"
	"log"
	"net"
	"os"

	"github.com/drover-fleet/drover/pkg/sessionsdk"
)

// game is an application's session handler: it sets a session up, says
// Ready, and on close lets its players go and says Evacuated and Closed.
type game struct{}

func (game) StartSession(ctx context.Context, c *sessionsdk.Client, s sessionsdk.Session) {
	// Set up the session from s.Data (the customer's session data), then:
	if err := c.Ready(ctx, s.Name); err != nil {
		log.Print(err)
	}
}

func (game) CloseSession(ctx context.Context, c *sessionsdk.Client, session string) {
	// Disconnect the session's players, then:
	_ = c.Evacuated(ctx, session)
	_ = c.Closed(ctx, session)
}

// An instance listens on DROVER_PORT first (a standby instance is frozen
// once it is live), then serves its sessions. See examples/echo-session
// for a whole application.
func Example() {
	l, err := net.Listen("tcp", ":"+os.Getenv(sessionsdk.EnvPort))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	c, err := sessionsdk.Connect(sessionsdk.Options{}) // DROVER_SESSION_SOCKET
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Accept customers' connections on l in another goroutine, reporting
	// them with c.ClientJoined and c.ClientLeft.
	log.Fatal(c.Run(context.Background(), game{}))
}

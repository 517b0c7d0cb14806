// Command natsold runs an embedded nats-server with JetStream, as hubsync's
// bus does, so that the vulnerable server code is reachable from main.
package main

import (
	"log"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: "/tmp/natsold"})
	if err != nil {
		log.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		log.Fatal("not ready")
	}
	s.Shutdown()
}

// Command pause is a pod sandbox's process: it holds the pod's namespaces until SIGTERM or SIGINT. The
// cluster scenarios build it statically (no image registry is reachable to pull registry.k8s.io/pause).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

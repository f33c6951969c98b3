// Command dra-harness is the control plane and the kubelet side of Dynamic Resource Allocation, out of a
// cluster, from the k8s.io/kubernetes release pinned in go.mod (the conformance harness's):
//
//	dra-harness apiserver -dir DIR [-service-account NS/NAME] [-port PORT] [-profiling]
//	    etcd (go.etcd.io/etcd/server/v3, embedded) and kube-apiserver (its own command, in-process) on
//	    loopback, RBAC on. Writes DIR/admin.kubeconfig (system:masters) and DIR/worker.kubeconfig (the
//	    service account NS/NAME, as the chart's RBAC binds it), prints one JSON line when ready, serves until
//	    SIGTERM or stdin closes. Started again on the same DIR and PORT, it is that API server restarted.
//	    -profiling serves kube-apiserver's /debug/pprof.
//	dra-harness kubelet -kubeconfig FILE -node NAME -registry DIR -state DIR
//	    the kubelet's DRA manager (pkg/kubelet/cm/dra) with its plugin manager watching DIR (the kubelet's
//	    plugins_registry), the scheduler's allocator (k8s.io/dynamic-resource-allocation/structured) and
//	    a few API calls, driven by JSON commands on stdin (see kubelet.go); one JSON answer per line on stdout.
//	dra-harness publishers -kubeconfig FILE
//	    Kubernetes' own ResourceSlice controller (k8s.io/dynamic-resource-allocation/resourceslice) for many
//	    nodes, driven by JSON commands on stdin (see publishers.go), beside which bench/dra_fleet.py measures
//	    worker-dra's publisher.
//
// klog writes to stderr.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dra-harness apiserver|kubelet|publishers [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "apiserver":
		err = runAPIServer(os.Args[2:])
	case "kubelet":
		err = runKubelet(os.Args[2:])
	case "publishers":
		err = runPublishers(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-harness %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

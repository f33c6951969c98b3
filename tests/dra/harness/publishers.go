package main

// Kubernetes' own ResourceSlice publisher (k8s.io/dynamic-resource-allocation/resourceslice, the release go.mod
// pins) for many simulated nodes in one process, to measure beside worker-dra's (bench/dra_fleet.py). Each node
// has a controller of its own (its informer: one list and one watch on the node's slices of the driver) and a
// client of its own (a connection of its own, as each node's plugin has), with client-go's default rate limits.
// Driven over stdin, one JSON command per line, one JSON answer per line ({"ok": true, ...} or
// {"ok": false, "error": "..."}):
//
//	{"cmd": "start", "driver": D, "nodes": [{"name"}], "devices": [DEVICE...]}
//	    a controller per node publishing one pool named after the node with DEVICES (resource.k8s.io/v1), its
//	    slices owned by the Node, whose UID the controller looks up itself (as it does for a DRA driver's
//	    kubelet plugin that is not handed the UID: a pod cannot learn its Node's UID from the downward API)
//	{"cmd": "update", "devices": [DEVICE...]}   every node's pool changed to DEVICES
//	{"cmd": "stats"}                           {"creates", "updates", "deletes"}: the controllers' own counts
//	{"cmd": "stop"}

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

type publisherNode struct {
	Name string `json:"name"`
}

type publishersCommand struct {
	Cmd     string               `json:"cmd"`
	Driver  string               `json:"driver"`
	Nodes   []publisherNode      `json:"nodes"`
	Devices []resourceapi.Device `json:"devices"`
}

func runPublishers(args []string) error {
	flags := flag.NewFlagSet("publishers", flag.ContinueOnError)
	klog.InitFlags(flags)
	kubeconfig := flags.String("kubeconfig", "", "the API server (the plugins' credentials)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return errors.New("-kubeconfig is required")
	}
	var publishers []nodePublisher
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var cmd publishersCommand
		reply := answer{"ok": true}
		err := json.Unmarshal(in.Bytes(), &cmd)
		switch {
		case err != nil:
		case cmd.Cmd == "start":
			publishers, err = startPublishers(ctx, *kubeconfig, cmd)
		case cmd.Cmd == "update":
			for _, publisher := range publishers {
				publisher.controller.Update(pool(publisher.node, cmd.Devices))
			}
		case cmd.Cmd == "stats":
			var creates, updates, deletes int64
			for _, publisher := range publishers {
				stats := publisher.controller.GetStats()
				creates, updates, deletes = creates+stats.NumCreates, updates+stats.NumUpdates, deletes+stats.NumDeletes
			}
			reply["creates"], reply["updates"], reply["deletes"] = creates, updates, deletes
		case cmd.Cmd == "stop":
			for _, publisher := range publishers {
				publisher.controller.Stop()
			}
			return out.Encode(reply)
		default:
			err = fmt.Errorf("unknown command %q", cmd.Cmd)
		}
		if err != nil {
			reply = answer{"ok": false, "error": err.Error()}
		}
		if err := out.Encode(reply); err != nil {
			return err
		}
	}
	return nil
}

type nodePublisher struct {
	node       string
	controller *resourceslice.Controller
}

// pool is the node's one pool, named after it, with the devices in one slice.
func pool(node string, devices []resourceapi.Device) *resourceslice.DriverResources {
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}}}}
}

// startPublishers starts a controller per node, all at once (StartController waits for its informer's first
// sync: one after the other, a thousand nodes would take minutes to start).
func startPublishers(ctx context.Context, kubeconfig string, cmd publishersCommand) ([]nodePublisher, error) {
	publishers := make([]nodePublisher, len(cmd.Nodes))
	failures := make([]error, len(cmd.Nodes))
	var started sync.WaitGroup
	for index, node := range cmd.Nodes {
		started.Add(1)
		go func() {
			defer started.Done()
			publishers[index], failures[index] = startPublisher(ctx, kubeconfig, cmd.Driver, node, cmd.Devices)
		}()
	}
	started.Wait()
	return publishers, errors.Join(failures...)
}

func startPublisher(ctx context.Context, kubeconfig, driver string, node publisherNode,
	devices []resourceapi.Device) (nodePublisher, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nodePublisher{}, err
	}
	// A dialer of its own keeps client-go from sharing one transport (and connection) among the nodes.
	config.Dial = (&net.Dialer{}).DialContext
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nodePublisher{}, err
	}
	controller, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: driver, KubeClient: client,
		Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node.Name},
		Resources: pool(node.Name, devices),
	})
	if err != nil {
		return nodePublisher{}, fmt.Errorf("node %s: %w", node.Name, err)
	}
	return nodePublisher{node.Name, controller}, nil
}

// Command cluster-harness is a one-node Kubernetes control plane and kubelet from the k8s.io/kubernetes release
// pinned in go.mod (the conformance harness's), one binary for five programs so that the link of most of
// Kubernetes is done once:
//
//	cluster-harness etcd -data-dir DIR -listen-client-url URL
//	    etcd's server (go.etcd.io/etcd/server/v3/embed, the version the release requires), until SIGTERM
//	cluster-harness kube-apiserver|kube-controller-manager|kube-scheduler|kubelet [FLAGS]
//	    the component's own command (k8s.io/kubernetes/cmd/<name>/app) with its own flags
//
// Build with -ldflags '-X k8s.io/component-base/version.gitVersion=v1.37.2 ...' so that --version and
// /version name the release.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the components' --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as the components' own mains register
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric, likewise
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cluster-harness etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet [flags]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	if name == "etcd" {
		if err := runEtcd(args); err != nil {
			fmt.Fprintf(os.Stderr, "cluster-harness etcd: %v\n", err)
			os.Exit(1)
		}
		return
	}
	newCommand, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "cluster-harness: unknown component %q\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

// runEtcd serves one etcd member on the given client URL until SIGTERM or SIGINT.
func runEtcd(args []string) error {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "", "etcd's data dir")
	clientURL := flags.String("listen-client-url", "http://127.0.0.1:2379", "the one client URL")
	peerURL := flags.String("listen-peer-url", "http://127.0.0.1:2380", "the one peer URL (no peers join)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" {
		return fmt.Errorf("-data-dir is required")
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		return fmt.Errorf("-listen-client-url: %w", err)
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		return fmt.Errorf("-listen-peer-url: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // a test cluster's data, gone with its temp dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer etcd.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-etcd.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd ready")
	case err := <-etcd.Err():
		return err
	}
	select {
	case err := <-etcd.Err():
		return err
	case <-stop:
		return nil
	}
}

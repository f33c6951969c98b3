package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// kubelet holds what a kubelet would wire together for device plugins: the topology manager as the
// pod admission handler, the device manager as its hint provider, and the node's active pods.
// A restart replaces both managers; the pods stay, as the API server would give them back.
type kubelet struct {
	logger   klog.Logger
	numa     []cadvisorapi.Node
	policy   string
	topology topologymanager.Manager
	devices  *devicemanager.ManagerImpl
	// startedAt is when the current device manager started: just before its kubelet.sock existed.
	startedAt time.Time

	mu   sync.Mutex // guards pods: the managers read them (activePods) from their own calls
	pods []*v1.Pod  // admitted pods, in admission order
}

// readySources says every pod source has been seen: the kubelet is past its start-up, so the
// device manager may free devices of pods that are gone.
type readySources struct{}

func (readySources) AddSource(string) {}
func (readySources) AllReady() bool   { return true }

func newKubelet(logger klog.Logger, numaNodes int, policy string) (*kubelet, error) {
	if numaNodes < 1 {
		return nil, fmt.Errorf("numaNodes must be at least 1, got %d", numaNodes)
	}
	k := &kubelet{logger: logger, policy: policy}
	for id := 0; id < numaNodes; id++ {
		k.numa = append(k.numa, cadvisorapi.Node{Id: id})
	}
	return k, k.startManagers()
}

// startManagers builds and starts fresh managers on /var/lib/kubelet/device-plugins: the device
// manager's registration server removes every socket there and reloads the checkpoint.
func (k *kubelet) startManagers() error {
	topology, err := topologymanager.NewManager(k.logger, k.numa, k.policy, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return fmt.Errorf("topology manager: %w", err)
	}
	devices, err := devicemanager.NewManagerImpl(k.logger, k.numa, topology)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	topology.AddHintProvider(k.logger, devices)
	k.startedAt = time.Now()
	if err := devices.Start(k.logger, k.activePods, readySources{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("device manager start: %w", err)
	}
	k.topology, k.devices = topology, devices
	return nil
}

func (k *kubelet) stop() error {
	return k.devices.Stop(k.logger)
}

// restart is a kubelet restart as a device plugin sees it: the registration socket goes, a new
// manager wipes the plugin sockets and serves a new one.
func (k *kubelet) restart() error {
	if err := k.stop(); err != nil {
		return fmt.Errorf("stopping the device manager: %w", err)
	}
	return k.startManagers()
}

func (k *kubelet) activePods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*v1.Pod(nil), k.pods...)
}

func (k *kubelet) pod(uid string) (*v1.Pod, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, pod := range k.pods {
		if string(pod.UID) == uid {
			return pod, nil
		}
	}
	return nil, fmt.Errorf("no admitted pod with uid %q", uid)
}

func (k *kubelet) setPods(pods []*v1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = pods
}

// admit runs the kubelet's admission of a new pod: the pod is active while it is admitted (the
// kubelet adds it to its pod manager first), and a rejected pod is dropped again.
func (k *kubelet) admit(ctx context.Context, pod *v1.Pod) lifecycle.PodAdmitResult {
	others := k.activePods()
	k.setPods(append(others, pod))
	result := k.topology.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others,
		Operation: lifecycle.AddOperation})
	if !result.Admit {
		k.setPods(others)
	}
	return result
}

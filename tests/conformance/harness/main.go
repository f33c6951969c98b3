// Command kubelet-harness is the kubelet's device handling, out of the kubelet: the device manager
// and topology manager of k8s.io/kubernetes (the release pinned in go.mod), driven over stdin.
//
// Each stdin line is one JSON command; each answer is one JSON line on stdout, {"ok": true, ...}
// or {"ok": false, "error": "..."}. klog writes to stderr. The device manager always serves
// /var/lib/kubelet/device-plugins/kubelet.sock: run this in a mount namespace of its own.
//
//	{"cmd": "start", "numaNodes": 2, "policy": "best-effort"}
//	{"cmd": "wait", "resources": {"rebellions.ai/npu": {"capacity": 2, "allocatable": 2}}, "timeoutMs": 5000}
//	{"cmd": "capacity"}
//	{"cmd": "hints", "pod": POD}
//	{"cmd": "admit", "pod": POD}
//	{"cmd": "devices", "podUID": "a", "container": "main"}
//	{"cmd": "runOptions", "podUID": "a", "container": "main"}
//	{"cmd": "restart"}
//	{"cmd": "stop"}
//
// POD is {"uid": "a", "containers": [{"name": "main", "limits": {"rebellions.ai/npu": 2}}]}, with
// "initContainers" in the same form if it has any.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const waitPoll = 10 * time.Millisecond

type command struct {
	Cmd       string                  `json:"cmd"`
	NUMANodes int                     `json:"numaNodes"`
	Policy    string                  `json:"policy"`
	Resources map[string]resourceWant `json:"resources"`
	TimeoutMs int                     `json:"timeoutMs"`
	Pod       *podSpec                `json:"pod"`
	PodUID    string                  `json:"podUID"`
	Container string                  `json:"container"`
}

// resourceWant is what "wait" waits for; a nil count is not checked.
type resourceWant struct {
	Capacity    *int64 `json:"capacity"`
	Allocatable *int64 `json:"allocatable"`
}

type podSpec struct {
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"initContainers"`
	Containers     []containerSpec `json:"containers"`
}

type containerSpec struct {
	Name   string           `json:"name"`
	Limits map[string]int64 `json:"limits"`
}

type answer map[string]any

type hint struct {
	NUMANodes []int `json:"numaNodes"`
	Preferred bool  `json:"preferred"`
}

// deviceNode is a device node (or, without permissions, a mount) as the runtime gets it.
type deviceNode struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	Permissions   string `json:"permissions,omitempty"`
}

// session is the harness's state between commands: one kubelet, once started.
type session struct {
	logger  klog.Logger
	kubelet *kubelet
}

func main() {
	klog.InitFlags(nil)
	flag.Parse()
	s := &session{logger: klog.Background()}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		reply, stop := s.handle(in.Bytes())
		if err := out.Encode(reply); err != nil {
			klog.ErrorS(err, "Writing an answer")
			os.Exit(1)
		}
		if stop {
			return
		}
	}
	// stdin closed without "stop": leave no registration socket behind.
	if s.kubelet != nil {
		_ = s.kubelet.stop()
	}
}

func (s *session) handle(line []byte) (answer, bool) {
	var cmd command
	decoder := json.NewDecoder(bytes.NewReader(line))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&cmd); err != nil {
		return failure(fmt.Errorf("bad command %q: %w", line, err)), false
	}
	reply, err := s.run(cmd)
	if err != nil {
		return failure(err), cmd.Cmd == "stop"
	}
	reply["ok"] = true
	return reply, cmd.Cmd == "stop"
}

func failure(err error) answer {
	return answer{"ok": false, "error": err.Error()}
}

func (s *session) run(cmd command) (answer, error) {
	if cmd.Cmd == "start" {
		return s.start(cmd)
	}
	if s.kubelet == nil {
		return nil, fmt.Errorf("%q before start", cmd.Cmd)
	}
	ctx := klog.NewContext(context.Background(), s.logger)
	switch cmd.Cmd {
	case "wait":
		return s.wait(cmd.Resources, time.Duration(cmd.TimeoutMs)*time.Millisecond)
	case "capacity":
		return s.capacity(), nil
	case "hints":
		return s.hints(cmd.Pod)
	case "admit":
		return s.admit(ctx, cmd.Pod)
	case "devices":
		return s.devices(cmd.PodUID, cmd.Container)
	case "runOptions":
		return s.runOptions(ctx, cmd.PodUID, cmd.Container)
	case "restart":
		return answer{}, s.kubelet.restart()
	case "stop":
		return answer{}, s.kubelet.stop()
	}
	return nil, fmt.Errorf("unknown command %q", cmd.Cmd)
}

func (s *session) start(cmd command) (answer, error) {
	if s.kubelet != nil {
		return nil, errors.New("started already")
	}
	policy := cmd.Policy
	if policy == "" {
		policy = topologymanager.PolicyBestEffort
	}
	k, err := newKubelet(s.logger, cmd.NUMANodes, policy)
	if err != nil {
		return nil, err
	}
	s.kubelet = k
	return answer{"registrationSocket": pluginapi.KubeletSocket}, nil
}

// capacity is what the kubelet would put into the node's status, and the healthy devices behind
// the allocatable counts with the NUMA nodes of their TopologyInfo.
func (s *session) capacity() answer {
	capacity, allocatable, inactive := s.kubelet.devices.GetCapacity(s.logger)
	sort.Strings(inactive)
	healthy := map[string]map[string][]int{}
	for name, devices := range s.kubelet.devices.GetAllocatableDevices(s.logger) {
		healthy[name] = map[string][]int{}
		for id, device := range devices {
			healthy[name][id] = numaNodes(device)
		}
	}
	return answer{"capacity": counts(capacity), "allocatable": counts(allocatable), "inactive": inactive,
		"allocatableDevices": healthy}
}

func numaNodes(device *pluginapi.Device) []int {
	nodes := []int{}
	if device.Topology != nil {
		for _, node := range device.Topology.Nodes {
			nodes = append(nodes, int(node.ID))
		}
	}
	return nodes
}

func counts(list v1.ResourceList) map[string]int64 {
	result := map[string]int64{}
	for name, quantity := range list {
		result[string(name)] = quantity.Value()
	}
	return result
}

// wait polls the capacity until every wanted count holds; the answer says how long that took, also
// counted from the start of the current device manager (a restart's registration deadline).
func (s *session) wait(want map[string]resourceWant, timeout time.Duration) (answer, error) {
	began := time.Now()
	for {
		now := s.capacity()
		if satisfied(want, now) {
			now["elapsedMs"] = time.Since(began).Milliseconds()
			now["sinceStartMs"] = time.Since(s.kubelet.startedAt).Milliseconds()
			return now, nil
		}
		if time.Since(began) > timeout {
			return nil, fmt.Errorf("not within %v: want %v, capacity %v, allocatable %v", timeout, describe(want),
				now["capacity"], now["allocatable"])
		}
		time.Sleep(waitPoll)
	}
}

func satisfied(want map[string]resourceWant, now answer) bool {
	capacity, allocatable := now["capacity"].(map[string]int64), now["allocatable"].(map[string]int64)
	for name, w := range want {
		if w.Capacity != nil && capacity[name] != *w.Capacity || w.Allocatable != nil && allocatable[name] != *w.Allocatable {
			return false
		}
	}
	return true
}

func describe(want map[string]resourceWant) map[string]string {
	described := map[string]string{}
	for name, w := range want {
		text := ""
		if w.Capacity != nil {
			text += fmt.Sprintf("capacity %d ", *w.Capacity)
		}
		if w.Allocatable != nil {
			text += fmt.Sprintf("allocatable %d", *w.Allocatable)
		}
		described[name] = text
	}
	return described
}

func (s *session) hints(spec *podSpec) (answer, error) {
	pod, err := newPod(spec)
	if err != nil {
		return nil, err
	}
	perContainer := map[string]map[string][]hint{}
	for _, c := range allContainers(pod) {
		perResource := map[string][]hint{}
		for name, hints := range s.kubelet.devices.GetTopologyHints(s.logger, pod, c, lifecycle.AddOperation) {
			perResource[name] = []hint{}
			for _, h := range hints {
				perResource[name] = append(perResource[name], toHint(h))
			}
		}
		perContainer[c.Name] = perResource
	}
	return answer{"hints": perContainer}, nil
}

func toHint(h topologymanager.TopologyHint) hint {
	converted := hint{NUMANodes: []int{}, Preferred: h.Preferred}
	if h.NUMANodeAffinity != nil {
		converted.NUMANodes = h.NUMANodeAffinity.GetBits()
	}
	return converted
}

// admit is the kubelet's admission of a new pod: the topology manager merges the device manager's
// hints and then has it allocate each container (GetPreferredAllocation, Allocate, checkpoint).
func (s *session) admit(ctx context.Context, spec *podSpec) (answer, error) {
	pod, err := newPod(spec)
	if err != nil {
		return nil, err
	}
	if _, err := s.kubelet.pod(spec.UID); err == nil {
		return nil, fmt.Errorf("pod %q is admitted already", spec.UID)
	}
	result := s.kubelet.admit(ctx, pod)
	reply := answer{"admitted": result.Admit, "reason": result.Reason, "message": result.Message}
	if result.Admit {
		affinity, devices := map[string]hint{}, map[string]map[string][]string{}
		for _, c := range allContainers(pod) {
			affinity[c.Name] = toHint(s.kubelet.topology.GetAffinity(s.logger, spec.UID, c.Name))
			devices[c.Name] = deviceIDs(s.kubelet.devices.GetDevices(spec.UID, c.Name))
		}
		reply["affinity"], reply["devices"] = affinity, devices
	}
	return reply, nil
}

func (s *session) devices(podUID, containerName string) (answer, error) {
	if _, err := s.kubelet.pod(podUID); err != nil {
		return nil, err
	}
	return answer{"devices": deviceIDs(s.kubelet.devices.GetDevices(podUID, containerName))}, nil
}

func deviceIDs(instances devicemanager.ResourceDeviceInstances) map[string][]string {
	ids := map[string][]string{}
	for name, devices := range instances {
		for id := range devices {
			ids[name] = append(ids[name], id)
		}
		sort.Strings(ids[name])
	}
	return ids
}

// runOptions is what the kubelet hands the container runtime for the container.
func (s *session) runOptions(ctx context.Context, podUID, containerName string) (answer, error) {
	pod, err := s.kubelet.pod(podUID)
	if err != nil {
		return nil, err
	}
	c, err := container(pod, containerName)
	if err != nil {
		return nil, err
	}
	options, err := s.kubelet.devices.GetDeviceRunContainerOptions(ctx, pod, c)
	if err != nil {
		return nil, err
	}
	nodes, annotations, envs := []deviceNode{}, map[string]string{}, map[string]string{}
	cdiDevices, mounts := []string{}, []deviceNode{}
	if options != nil {
		for _, d := range options.Devices {
			nodes = append(nodes, deviceNode{HostPath: d.PathOnHost, ContainerPath: d.PathInContainer, Permissions: d.Permissions})
		}
		for _, a := range options.Annotations {
			annotations[a.Name] = a.Value
		}
		for _, e := range options.Envs {
			envs[e.Name] = e.Value
		}
		for _, d := range options.CDIDevices {
			cdiDevices = append(cdiDevices, d.Name)
		}
		for _, m := range options.Mounts {
			mounts = append(mounts, deviceNode{HostPath: m.HostPath, ContainerPath: m.ContainerPath})
		}
	}
	return answer{"devices": nodes, "annotations": annotations, "envs": envs, "cdiDevices": cdiDevices,
		"mounts": mounts}, nil
}

func container(pod *v1.Pod, name string) (*v1.Container, error) {
	for _, c := range allContainers(pod) {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("pod %q has no container %q", pod.UID, name)
}

func newPod(spec *podSpec) (*v1.Pod, error) {
	if spec == nil || spec.UID == "" || len(spec.Containers) == 0 {
		return nil, errors.New("a pod needs a uid and at least one container")
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: spec.UID, Namespace: "conformance", UID: types.UID(spec.UID)}}
	pod.Spec.InitContainers = newContainers(spec.InitContainers)
	pod.Spec.Containers = newContainers(spec.Containers)
	return pod, nil
}

func newContainers(specs []containerSpec) []v1.Container {
	var containers []v1.Container
	for _, c := range specs {
		limits := v1.ResourceList{}
		for name, count := range c.Limits {
			limits[v1.ResourceName(name)] = *resource.NewQuantity(count, resource.DecimalSI)
		}
		// Extended resources are never overcommitted: requests equal limits.
		containers = append(containers, v1.Container{Name: c.Name,
			Resources: v1.ResourceRequirements{Limits: limits, Requests: limits.DeepCopy()}})
	}
	return containers
}

// allContainers lists init containers first, in the order the kubelet admits them.
func allContainers(pod *v1.Pod) []*v1.Container {
	var all []*v1.Container
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			all = append(all, &list[i])
		}
	}
	return all
}

package main

// The kubelet side, driven over stdin: each line one JSON command, each answer one JSON line,
// {"ok": true, ...} or {"ok": false, "error": "..."}. POD is a v1.Pod in its JSON form (the kubelet's
// view of a pod bound to this node: metadata.uid, spec.resourceClaims, containers[].resources.claims).
//
//	{"cmd": "start"}                          the DRA manager and the plugin manager on -registry
//	{"cmd": "restart"}                        both stopped, new ones started on the same state dir
//	{"cmd": "stop"}
//	{"cmd": "plugin", "driver": D}            {"registered": bool, "error": why not}
//	{"cmd": "allocate", "pod": POD, "claims": [name...], "ignoreAllocated": false}
//	    the scheduler's allocator for the pod's claims (or just those named) on this node, against the
//	    slices and classes in the API server; writes status.allocation and reservedFor (the pod).
//	    {"allocated": bool, "results": {claim: [{"request", "driver", "pool", "device"}]}}
//	{"cmd": "allocateExtended", "pod": POD}   KEP-5004: the pod's extended resources served through the
//	    DeviceClass naming them; creates and allocates the pod's extended-resource claim as the scheduler
//	    does, and records it in the pod's status. {"allocated", "claim", "results", "requestMappings"}
//	{"cmd": "prepare", "pod": POD}            PrepareResources; {"cdiDevices": {container: [ID...]}}
//	{"cmd": "unprepare", "podUID": U}         UnprepareResources for a prepared pod, which then goes
//	{"cmd": "podHealth", "pod": POD}          what the kubelet's next status sync of the prepared pod writes
//	    into status.containerStatuses[].allocatedResourcesStatus (UpdateAllocatedResourcesStatus, fed by the
//	    drivers' health streams): {"containers": {container: [ResourceStatus...]}}
//	{"cmd": "apply", "objects": [OBJ...]}     server-side apply; {"objects": [applied...]}
//	{"cmd": "list", "apiVersion", "kind", "namespace", "fieldSelector"}  {"items": [...]}
//	{"cmd": "delete", "apiVersion", "kind", "namespace", "name"}

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type command struct {
	Cmd             string                       `json:"cmd"`
	Driver          string                       `json:"driver"`
	Pod             *v1.Pod                      `json:"pod"`
	PodUID          string                       `json:"podUID"`
	Claims          []string                     `json:"claims"`
	IgnoreAllocated bool                         `json:"ignoreAllocated"`
	Objects         []*unstructured.Unstructured `json:"objects"`
	APIVersion      string                       `json:"apiVersion"`
	Kind            string                       `json:"kind"`
	Namespace       string                       `json:"namespace"`
	Name            string                       `json:"name"`
	FieldSelector   string                       `json:"fieldSelector"`
}

type answer map[string]any

// readySources says every pod source has been seen, so the DRA manager's reconcile loop may unprepare
// claims of pods that are no longer active.
type readySources struct{}

func (readySources) AddSource(string) {}
func (readySources) AllReady() bool   { return true }

// instance is one life of the kubelet: a DRA manager and the plugin manager feeding it registrations.
type instance struct {
	manager *dra.Manager
	cancel  context.CancelFunc
	stopCh  chan struct{}
}

type kubeletSession struct {
	logger   klog.Logger
	client   kubernetes.Interface
	dynamic  dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	nodeName string
	registry string
	state    string
	current  *instance

	mu   sync.Mutex         // guards pods: the DRA manager reads them (activePods) from its reconcile loop
	pods map[string]*v1.Pod // prepared pods by UID, as the kubelet's pod manager holds them
}

func runKubelet(args []string) error {
	flags := flag.NewFlagSet("kubelet", flag.ContinueOnError)
	klog.InitFlags(flags)
	kubeconfig := flags.String("kubeconfig", "", "the API server (the kubelet's credentials)")
	nodeName := flags.String("node", "", "the Node this kubelet is")
	registry := flags.String("registry", "", "the plugins_registry dir the plugin manager watches")
	state := flags.String("state", "", "the DRA manager's state dir (its checkpoint)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" || *nodeName == "" || *registry == "" || *state == "" {
		return errors.New("-kubeconfig, -node, -registry and -state are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	dynamicClient, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	s := &kubeletSession{logger: klog.Background(), client: client, dynamic: dynamicClient,
		mapper:   restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery())),
		nodeName: *nodeName, registry: *registry, state: *state, pods: map[string]*v1.Pod{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 16<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		reply, stop := s.handle(in.Bytes())
		if err := out.Encode(reply); err != nil {
			return fmt.Errorf("writing an answer: %w", err)
		}
		if stop {
			return nil
		}
	}
	s.stop()
	return nil
}

func (s *kubeletSession) handle(line []byte) (answer, bool) {
	var cmd command
	decoder := json.NewDecoder(bytes.NewReader(line))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&cmd); err != nil {
		return answer{"ok": false, "error": fmt.Sprintf("bad command %q: %v", line, err)}, false
	}
	ctx := klog.NewContext(context.Background(), s.logger)
	reply, err := s.run(ctx, cmd)
	if err != nil {
		return answer{"ok": false, "error": err.Error()}, cmd.Cmd == "stop"
	}
	reply["ok"] = true
	return reply, cmd.Cmd == "stop"
}

func (s *kubeletSession) run(ctx context.Context, cmd command) (answer, error) {
	switch cmd.Cmd {
	case "start":
		if s.current != nil {
			return nil, errors.New("started already")
		}
		return answer{}, s.start()
	case "apply":
		return s.apply(ctx, cmd.Objects)
	case "list":
		return s.list(ctx, cmd)
	case "delete":
		return answer{}, s.delete(ctx, cmd)
	case "allocate":
		return s.allocate(ctx, cmd.Pod, cmd.Claims, cmd.IgnoreAllocated)
	case "allocateExtended":
		return s.allocateExtended(ctx, cmd.Pod)
	}
	if s.current == nil {
		return nil, fmt.Errorf("%q before start", cmd.Cmd)
	}
	switch cmd.Cmd {
	case "restart":
		s.stop()
		return answer{}, s.start()
	case "stop":
		s.stop()
		return answer{}, nil
	case "plugin":
		_, err := s.current.manager.GetWatcherHandler().(*draplugin.DRAPluginManager).GetPlugin(cmd.Driver)
		if err != nil {
			return answer{"registered": false, "error": err.Error()}, nil
		}
		return answer{"registered": true}, nil
	case "prepare":
		return s.prepare(ctx, cmd.Pod)
	case "unprepare":
		return s.unprepare(ctx, cmd.PodUID)
	case "podHealth":
		return s.podHealth(cmd.Pod)
	}
	return nil, fmt.Errorf("unknown command %q", cmd.Cmd)
}

// start is a kubelet start as a DRA driver sees it: the DRA manager loads its checkpoint and wipes the
// node's ResourceSlices until drivers register; the plugin manager finds the registration sockets in
// the registry dir and has each registered through the DRA manager's handler (GetInfo, validation,
// NotifyRegistrationStatus).
func (s *kubeletSession) start() error {
	manager, err := dra.NewManager(s.logger, s.client, s.state)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), s.logger))
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	}
	if err := manager.Start(ctx, s.activePods, getNode, readySources{}); err != nil {
		cancel()
		return fmt.Errorf("DRA manager start: %w", err)
	}
	plugins := pluginmanager.NewPluginManager(s.registry, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	stopCh := make(chan struct{})
	go plugins.Run(ctx, readySources{}, stopCh)
	s.current = &instance{manager: manager, cancel: cancel, stopCh: stopCh}
	return nil
}

func (s *kubeletSession) stop() {
	if s.current == nil {
		return
	}
	close(s.current.stopCh)
	s.current.cancel()
	s.current.manager.Stop()
	s.current = nil
}

func (s *kubeletSession) activePods() []*v1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(s.pods))
	for _, pod := range s.pods {
		pods = append(pods, pod)
	}
	return pods
}

// prepare is what the kubelet does before a pod's containers start: PrepareResources, then the CDI
// devices each container gets (GetResources), as the runtime would be handed them.
func (s *kubeletSession) prepare(ctx context.Context, pod *v1.Pod) (answer, error) {
	if pod == nil || pod.UID == "" {
		return nil, errors.New("prepare needs a pod with metadata.uid")
	}
	s.mu.Lock()
	if known, ok := s.pods[string(pod.UID)]; ok && known.Status.ExtendedResourceClaimStatus != nil &&
		pod.Status.ExtendedResourceClaimStatus == nil {
		pod.Status.ExtendedResourceClaimStatus = known.Status.ExtendedResourceClaimStatus
	}
	s.pods[string(pod.UID)] = pod
	s.mu.Unlock()
	if err := s.current.manager.PrepareResources(ctx, pod); err != nil {
		return nil, err
	}
	devices := map[string][]string{}
	for i := range pod.Spec.Containers {
		container := &pod.Spec.Containers[i]
		info, err := s.current.manager.GetResources(pod, container)
		if err != nil {
			return nil, err
		}
		devices[container.Name] = []string{}
		for _, device := range info.CDIDevices {
			devices[container.Name] = append(devices[container.Name], device.Name)
		}
	}
	return answer{"cdiDevices": devices}, nil
}

// unprepare is the end of a pod: UnprepareResources, and the pod is no longer active.
func (s *kubeletSession) unprepare(ctx context.Context, uid string) (answer, error) {
	s.mu.Lock()
	pod, ok := s.pods[uid]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no prepared pod with uid %q", uid)
	}
	if err := s.current.manager.UnprepareResources(ctx, pod); err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.pods, uid)
	s.mu.Unlock()
	return answer{}, nil
}

// podHealth is the part of a pod's status the DRA manager fills at each status sync: per container, the
// health of the devices of each claim it uses.
func (s *kubeletSession) podHealth(pod *v1.Pod) (answer, error) {
	if pod == nil || pod.UID == "" {
		return nil, errors.New("podHealth needs a pod with metadata.uid")
	}
	status := &v1.PodStatus{}
	for _, container := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: container.Name})
	}
	s.current.manager.UpdateAllocatedResourcesStatus(s.logger, pod, status)
	containers := map[string][]v1.ResourceStatus{}
	for _, container := range status.ContainerStatuses {
		containers[container.Name] = append([]v1.ResourceStatus{}, container.AllocatedResourcesStatus...)
	}
	return answer{"containers": containers}, nil
}

// -- API calls the tests need, with the kubelet's (administrator's) credentials -----------------------

func (s *kubeletSession) resource(apiVersion, kind, namespace string) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, err
	}
	mapping, err := s.mapper.RESTMapping(gv.WithKind(kind).GroupKind(), gv.Version)
	if err != nil {
		s.mapper.Reset()
		if mapping, err = s.mapper.RESTMapping(gv.WithKind(kind).GroupKind(), gv.Version); err != nil {
			return nil, err
		}
	}
	if mapping.Scope.Name() == "namespace" {
		return s.dynamic.Resource(mapping.Resource).Namespace(namespace), nil
	}
	return s.dynamic.Resource(mapping.Resource), nil
}

func (s *kubeletSession) apply(ctx context.Context, objects []*unstructured.Unstructured) (answer, error) {
	applied := []any{}
	for _, object := range objects {
		resource, err := s.resource(object.GetAPIVersion(), object.GetKind(), object.GetNamespace())
		if err != nil {
			return nil, err
		}
		result, err := resource.Apply(ctx, object.GetName(), object,
			metav1.ApplyOptions{FieldManager: "dra-harness", Force: true})
		if err != nil {
			return nil, fmt.Errorf("apply %s %s: %w", object.GetKind(), object.GetName(), err)
		}
		applied = append(applied, result.Object)
	}
	return answer{"objects": applied}, nil
}

func (s *kubeletSession) list(ctx context.Context, cmd command) (answer, error) {
	resource, err := s.resource(cmd.APIVersion, cmd.Kind, cmd.Namespace)
	if err != nil {
		return nil, err
	}
	list, err := resource.List(ctx, metav1.ListOptions{FieldSelector: cmd.FieldSelector})
	if err != nil {
		return nil, err
	}
	items := []any{}
	for _, item := range list.Items {
		items = append(items, item.Object)
	}
	return answer{"items": items}, nil
}

func (s *kubeletSession) delete(ctx context.Context, cmd command) error {
	resource, err := s.resource(cmd.APIVersion, cmd.Kind, cmd.Namespace)
	if err != nil {
		return err
	}
	if err := resource.Delete(ctx, cmd.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// claimDevices is an allocation as the tests read it.
func claimDevices(allocation *resourceapi.AllocationResult) []map[string]string {
	devices := []map[string]string{}
	for _, result := range allocation.Devices.Results {
		devices = append(devices, map[string]string{"request": result.Request, "driver": result.Driver,
			"pool": result.Pool, "device": result.Device})
	}
	return devices
}

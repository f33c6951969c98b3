package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// classLister serves the DeviceClasses listed from the API server, as the scheduler's lister does.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	classes := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, class := range l {
		classes = append(classes, class)
	}
	return classes, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := l[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("DeviceClass %q not found", name)
}

// allocator is the scheduler's allocator (the features the scheduler turns on from this release's
// feature gates) over the cluster's current slices, classes and allocated devices. ignoreAllocated
// leaves out what other claims hold: a scheduler acting on a stale view, which only the driver's own
// check can then stop.
func (s *kubeletSession) allocator(ctx context.Context, ignoreAllocated bool) (structured.Allocator, classLister, error) {
	features := dynamicresources.AllocatorFeatures(feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	classList, err := s.client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	classes := classLister{}
	for i := range classList.Items {
		classes[classList.Items[i].Name] = &classList.Items[i]
	}
	sliceList, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	resourceSlices := make([]*resourceapi.ResourceSlice, 0, len(sliceList.Items))
	for i := range sliceList.Items {
		resourceSlices = append(resourceSlices, &sliceList.Items[i])
	}
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	if !ignoreAllocated {
		claims, err := s.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, err
		}
		for _, claim := range claims.Items {
			if claim.Status.Allocation == nil {
				continue
			}
			for _, result := range claim.Status.Allocation.Devices.Results {
				state.AllocatedDevices.Insert(structured.MakeDeviceID(result.Driver, result.Pool, result.Device))
			}
		}
	}
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity,
		EnableListTypeAttributes: features.ListTypeAttributes})
	allocator, err := structured.NewAllocator(ctx, features, state, classes, resourceSlices, celCache)
	return allocator, classes, err
}

// allocate allocates the pod's (or the named) claims on this node together, as the scheduler does for
// one pod, and writes each allocation with the pod in reservedFor through the status subresource.
func (s *kubeletSession) allocate(ctx context.Context, pod *v1.Pod, names []string, ignoreAllocated bool) (answer, error) {
	if pod == nil || pod.UID == "" {
		return nil, errors.New("allocate needs a pod with metadata.uid")
	}
	if len(names) == 0 {
		for _, podClaim := range pod.Spec.ResourceClaims {
			if podClaim.ResourceClaimName == nil {
				return nil, fmt.Errorf("pod claim %q names no ResourceClaim", podClaim.Name)
			}
			names = append(names, *podClaim.ResourceClaimName)
		}
	}
	var claims []*resourceapi.ResourceClaim
	for _, name := range names {
		claim, err := s.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		claims = append(claims, claim)
	}
	allocated, results, err := s.allocateClaims(ctx, pod, claims, ignoreAllocated)
	if err != nil {
		return nil, err
	}
	return answer{"allocated": allocated, "results": results}, nil
}

func (s *kubeletSession) allocateClaims(ctx context.Context, pod *v1.Pod, claims []*resourceapi.ResourceClaim,
	ignoreAllocated bool) (bool, map[string][]map[string]string, error) {
	node, err := s.client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return false, nil, err
	}
	var pending []*resourceapi.ResourceClaim
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			pending = append(pending, claim)
		}
	}
	allocator, _, err := s.allocator(ctx, ignoreAllocated)
	if err != nil {
		return false, nil, err
	}
	allocations, err := allocator.Allocate(ctx, node, pending)
	if err != nil {
		return false, nil, err
	}
	results := map[string][]map[string]string{}
	if allocations == nil && len(pending) > 0 {
		return false, results, nil
	}
	for i, claim := range pending {
		claim.Status.Allocation = &allocations[i]
	}
	for _, claim := range claims {
		if !slices.ContainsFunc(claim.Status.ReservedFor, func(c resourceapi.ResourceClaimConsumerReference) bool {
			return c.UID == pod.UID
		}) {
			claim.Status.ReservedFor = append(claim.Status.ReservedFor,
				resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
		}
		updated, err := s.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return false, nil, fmt.Errorf("writing the allocation of %s: %w", claim.Name, err)
		}
		results[updated.Name] = claimDevices(updated.Status.Allocation)
	}
	return true, results, nil
}

// allocateExtended serves a pod's extended resources through DRA (KEP-5004) the way the scheduler's
// dynamicresources plugin does: each container's request for a resource that a DeviceClass names in
// spec.extendedResourceName becomes an ExactCount request "container-<index>-request-<index of the
// resource among the container's sorted requests>" in one claim owned by the pod, allocated with the
// allocator and recorded in pod.status.extendedResourceClaimStatus.
func (s *kubeletSession) allocateExtended(ctx context.Context, pod *v1.Pod) (answer, error) {
	if pod == nil || pod.UID == "" || pod.Name == "" {
		return nil, errors.New("allocateExtended needs a pod with metadata.name and metadata.uid")
	}
	_, classes, err := s.allocator(ctx, false)
	if err != nil {
		return nil, err
	}
	byResource := map[v1.ResourceName]string{}
	for name, class := range classes {
		if class.Spec.ExtendedResourceName != nil {
			byResource[v1.ResourceName(*class.Spec.ExtendedResourceName)] = name
		}
	}
	var requests []resourceapi.DeviceRequest
	var mappings []v1.ContainerExtendedResourceRequest
	containers := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	for index, container := range containers {
		keys := make([]string, 0, len(container.Resources.Requests))
		for name := range container.Resources.Requests {
			keys = append(keys, string(name))
		}
		sort.Strings(keys)
		for resourceIndex, key := range keys {
			className, ok := byResource[v1.ResourceName(key)]
			quantity := container.Resources.Requests[v1.ResourceName(key)]
			count, exact := quantity.AsInt64()
			if !ok || !exact || count == 0 {
				continue
			}
			request := fmt.Sprintf("container-%d-request-%d", index, resourceIndex)
			requests = append(requests, resourceapi.DeviceRequest{Name: request, Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: className, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}})
			mappings = append(mappings, v1.ContainerExtendedResourceRequest{ContainerName: container.Name,
				ResourceName: key, RequestName: request})
		}
	}
	if len(requests) == 0 {
		return nil, errors.New("the pod requests no extended resource a DeviceClass serves")
	}
	controller := true
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-extended-resources-", Namespace: pod.Namespace,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: &controller}}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
	created, err := s.client.ResourceV1().ResourceClaims(pod.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the extended-resource claim: %w", err)
	}
	allocated, results, err := s.allocateClaims(ctx, pod, []*resourceapi.ResourceClaim{created}, false)
	if err != nil || !allocated {
		_ = s.client.ResourceV1().ResourceClaims(pod.Namespace).Delete(ctx, created.Name, metav1.DeleteOptions{})
		return answer{"allocated": false, "results": results}, err
	}
	status := &v1.PodExtendedResourceClaimStatus{ResourceClaimName: created.Name, RequestMappings: mappings}
	s.mu.Lock()
	pod.Status.ExtendedResourceClaimStatus = status
	s.pods[string(pod.UID)] = pod
	s.mu.Unlock()
	return answer{"allocated": true, "claim": created.Name, "results": results, "requestMappings": mappings}, nil
}

// cdi-checker answers, with the CDI reference library (tags.cncf.io/container-device-interface, the
// one containerd and CRI-O link), what a runtime would make of CDI spec dirs: which devices resolve,
// which spec files it refuses and why, and whether the devices named by a set of annotations or by
// name resolve. The tests of tests/cdi drive it; it is never part of the product.
//
// Input on stdin, one JSON document: {"queries": [{"specDirs": [...], "devices": [...],
// "annotations": {...}}, ...]}. Output on stdout, one JSON document: {"transientSpecPrefix": "...",
// "results": [{"devices": [every resolvable qualified name], "specErrors": {path: [errors]},
// "annotationDevices": [...], "annotationError": "...", "resolved": {name: bool}}, ...]}.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type query struct {
	SpecDirs    []string          `json:"specDirs"`
	Devices     []string          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
}

type result struct {
	Devices           []string            `json:"devices"`
	SpecErrors        map[string][]string `json:"specErrors"`
	AnnotationDevices []string            `json:"annotationDevices"`
	AnnotationError   string              `json:"annotationError"`
	Resolved          map[string]bool     `json:"resolved"`
	InjectError       string              `json:"injectError"`
}

func answer(q query) (result, error) {
	// WithSpecDirs with no dirs means the library's defaults: a query always names its own.
	if len(q.SpecDirs) == 0 {
		return result{}, fmt.Errorf("a query names no spec dir")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(q.SpecDirs...), cdi.WithAutoRefresh(false))
	if cache == nil {
		return result{}, fmt.Errorf("cannot make a CDI cache: %w", err)
	}
	// Refresh's error joins the spec errors that GetErrors lists one by one: those are the answer.
	_ = cache.Refresh()
	r := result{Devices: cache.ListDevices(), SpecErrors: map[string][]string{}, Resolved: map[string]bool{}}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			r.SpecErrors[path] = append(r.SpecErrors[path], e.Error())
		}
	}
	names := append([]string{}, q.Devices...)
	if len(q.Annotations) > 0 {
		_, devices, err := cdi.ParseAnnotations(q.Annotations)
		if err != nil {
			r.AnnotationError = err.Error()
		}
		r.AnnotationDevices = devices
		names = append(names, devices...)
	}
	for _, name := range names {
		r.Resolved[name] = cache.GetDevice(name) != nil
	}
	// What a runtime does with them: the injection a container create makes.
	if len(names) > 0 {
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(spec, names...); err != nil {
			r.InjectError = err.Error()
		}
	}
	sort.Strings(r.Devices)
	return r, nil
}

func main() {
	var input struct {
		Queries []query `json:"queries"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-checker: reading the queries: %v\n", err)
		os.Exit(2)
	}
	output := struct {
		TransientSpecPrefix string   `json:"transientSpecPrefix"`
		Results             []result `json:"results"`
	}{TransientSpecPrefix: cdi.GenerateTransientSpecName("rebellions.ai", "npu", "")}
	for i, q := range input.Queries {
		r, err := answer(q)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cdi-checker: query %d: %v\n", i, err)
			os.Exit(2)
		}
		output.Results = append(output.Results, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(output); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-checker: writing the answer: %v\n", err)
		os.Exit(2)
	}
}

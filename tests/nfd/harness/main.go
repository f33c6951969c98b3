// Command nfd-rules is Node Feature Discovery's own rule matching, out of nfd-master: the
// NodeFeatureRule engine of sigs.k8s.io/node-feature-discovery (the release pinned in go.mod) run
// against the features NFD's own pci source discovers in a sysfs tree.
//
//	nfd-rules -sysfs <dir> -rules <file.yaml>
//
// The sysfs tree is read as NFD reads /sys on a node (bus/pci/devices/<BDF>/{class,vendor,...}).
// The rules file holds one or more YAML documents; every NodeFeatureRule among them is applied, in
// order, as nfd-master applies them. The output is one JSON object on stdout: {"labels": {...},
// "features": {"pci.device": [...]}} (the labels every matching rule sets, and what the pci source
// found). Errors go to stderr with exit status 1.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	nfdv1alpha1 "sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1"
	"sigs.k8s.io/node-feature-discovery/pkg/apis/nfd/nodefeaturerule"
	"sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath"
	"sigs.k8s.io/node-feature-discovery/source"
	_ "sigs.k8s.io/node-feature-discovery/source/pci"
)

func main() {
	sysfs := flag.String("sysfs", "", "the sysfs tree to discover PCI devices in")
	rulesFile := flag.String("rules", "", "YAML file with NodeFeatureRule documents")
	flag.Parse()
	if *sysfs == "" || *rulesFile == "" {
		fail(fmt.Errorf("both -sysfs and -rules are required"))
	}
	rules, err := readRules(*rulesFile)
	if err != nil {
		fail(err)
	}
	features, err := discoverPci(*sysfs)
	if err != nil {
		fail(err)
	}
	labels := map[string]string{}
	for _, rule := range rules {
		for i := range rule.Spec.Rules {
			out, err := nodefeaturerule.Execute(&rule.Spec.Rules[i], features, true)
			if err != nil {
				fail(fmt.Errorf("rule %q of %s: %w", rule.Spec.Rules[i].Name, rule.Name, err))
			}
			for key, value := range out.Labels {
				labels[key] = value
			}
		}
	}
	devices := []map[string]string{}
	if instances, ok := features.Instances["pci.device"]; ok {
		for _, instance := range instances.Elements {
			devices = append(devices, instance.Attributes)
		}
	}
	answer := map[string]any{"labels": labels, "features": map[string]any{"pci.device": devices}}
	if err := json.NewEncoder(os.Stdout).Encode(answer); err != nil {
		fail(err)
	}
}

// readRules decodes every NodeFeatureRule document of the file, strictly: a field the API does not
// know is an error, as the API server's schema would make it.
func readRules(path string) ([]nfdv1alpha1.NodeFeatureRule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rules []nfdv1alpha1.NodeFeatureRule
	reader := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, err
		}
		if meta.Kind != "NodeFeatureRule" {
			continue
		}
		var rule nfdv1alpha1.NodeFeatureRule
		if err := yaml.UnmarshalStrict(doc, &rule); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rules = append(rules, rule)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("%s holds no NodeFeatureRule", path)
	}
	return rules, nil
}

// discoverPci runs NFD's pci feature source with its sysfs root moved to `sysfs`.
func discoverPci(sysfs string) (*nfdv1alpha1.Features, error) {
	hostpath.SysfsDir = hostpath.HostDir(sysfs)
	pci := source.GetFeatureSource("pci")
	if pci == nil {
		return nil, fmt.Errorf("NFD's pci feature source is not registered")
	}
	if err := pci.Discover(); err != nil {
		return nil, fmt.Errorf("pci discovery: %w", err)
	}
	features := nfdv1alpha1.NewFeatures()
	for name, instances := range pci.GetFeatures().Instances {
		features.Instances["pci."+name] = instances
	}
	return features, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nfd-rules:", err)
	os.Exit(1)
}

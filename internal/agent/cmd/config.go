package cmd

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A config file is a YAML mapping whose keys are the agent's flag names
// (without "--") and whose values are what the flag takes: a scalar, a list
// (joined with commas: hub) or a mapping (k=v pairs: labels, capacity). One
// set of names and one parser for both means a setting cannot mean one thing
// as a flag and another in the file. Flags given on the command line win.
//
//	hub: [hub-1.example.com:7443, hub-2.example.com:7443]
//	ca-file: /etc/drover-agent/ca.crt
//	labels: {site: berlin, room: "2b"}
//	task-retention: 24h

// loadConfig sets, from the file at path, every flag not given on the
// command line. Unknown keys, repeated keys and values of the wrong shape
// are errors naming the key and its line.
func (s *settings) loadConfig(path string, given map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil // empty file: defaults
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config %s line %d: want a mapping of settings (key: value), as `drover-agent --check-config` prints", path, root.Line)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		if k.Kind != yaml.ScalarNode || s.fs.Lookup(name) == nil || notConfig[name] {
			return fmt.Errorf("config %s line %d: unknown key %q: keys are the agent's flag names without -- (drover-agent --help)", path, k.Line, name)
		}
		if line, dup := seen[name]; dup {
			return fmt.Errorf("config %s line %d: key %q repeats line %d", path, k.Line, name, line)
		}
		seen[name] = k.Line
		val, err := configValue(v)
		if err != nil {
			return fmt.Errorf("config %s line %d: %s: %w", path, v.Line, name, err)
		}
		if given[name] {
			continue
		}
		if err := s.fs.Set(name, val); err != nil {
			return fmt.Errorf("config %s line %d: %s: %w", path, v.Line, name, err)
		}
	}
	return nil
}

// configValue is a node as the flag's text: a scalar as is, a list of
// scalars joined with commas, a mapping of scalars as k=v pairs.
func configValue(n *yaml.Node) (string, error) {
	scalar := func(n *yaml.Node) (string, error) {
		if n.Kind != yaml.ScalarNode {
			return "", errors.New("want a plain value here, not a list or mapping")
		}
		if strings.Contains(n.Value, ",") {
			return "", fmt.Errorf("%q: a value in a list or mapping cannot hold a comma", n.Value)
		}
		return n.Value, nil
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := scalar(c)
			if err != nil {
				return "", err
			}
			parts = append(parts, v)
		}
		return strings.Join(parts, ","), nil
	case yaml.MappingNode:
		parts := make([]string, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, err := scalar(n.Content[i])
			if err != nil {
				return "", err
			}
			v, err := scalar(n.Content[i+1])
			if err != nil {
				return "", err
			}
			parts = append(parts, k+"="+v)
		}
		return strings.Join(parts, ","), nil
	}
	return "", errors.New("want a value, a list or a mapping (aliases are not supported)")
}

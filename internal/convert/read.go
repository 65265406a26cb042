package convert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Document is one manifest of the input, as JSON.
type Document struct {
	// Source is the file it came from, or "-" for standard input.
	Source string
	// Index is its position in Source, from 1, counting empty documents, so
	// that it matches what a reader counts between `---` lines.
	Index int
	// JSON is the document; "null" for an empty one.
	JSON []byte
}

// maxManifestBytes bounds one input file: node job manifests are small, and
// a stray multi-gigabyte file should fail, not fill memory.
const maxManifestBytes = 16 << 20

// Read splits r, a stream of YAML documents or of JSON objects, into
// documents.
func Read(r io.Reader, source string) ([]Document, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", source, err)
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("read %s: larger than %d MiB; split it", source, maxManifestBytes>>20)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var docs []Document
	for i := 1; ; i++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d is not YAML or JSON: %w", source, i, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			raw = json.RawMessage("null")
		}
		docs = append(docs, Document{Source: source, Index: i, JSON: raw})
	}
}

// ReadPath reads the manifests of path like `kubectl apply -f`: "-" is
// stdin, a directory is its *.yaml, *.yml and *.json files in name order
// (not its subdirectories), anything else one file.
func ReadPath(path string, stdin io.Reader) ([]Document, error) {
	if path == "-" {
		return Read(stdin, "-")
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", path, err)
	}
	if !info.IsDir() {
		return readFile(path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", path, err)
	}
	var names []string
	for _, e := range entries {
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("-f %s: no .yaml, .yml or .json files in the directory", path)
	}
	sort.Strings(names)
	var docs []Document
	for _, n := range names {
		d, err := readFile(filepath.Join(path, n))
		if err != nil {
			return nil, err
		}
		docs = append(docs, d...)
	}
	return docs, nil
}

func readFile(path string) ([]Document, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", path, err)
	}
	defer f.Close()
	return Read(f, path)
}

package convert

import (
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// Write writes objs as YAML documents separated by ---, or as JSON: one
// object as itself, several as a v1 List, which kubectl apply reads too.
func Write(w io.Writer, objs []Object, format string) error {
	switch format {
	case "yaml", "":
		for i, o := range objs {
			b, err := yaml.Marshal(o)
			if err != nil {
				return fmt.Errorf("encode %s %s: %w", o.Kind, o.Metadata.Name, err)
			}
			if i > 0 {
				if _, err := io.WriteString(w, "---\n"); err != nil {
					return err
				}
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	case "json":
		var v any = objs
		switch len(objs) {
		case 0:
			return nil
		case 1:
			v = objs[0]
		default:
			v = struct {
				APIVersion string   `json:"apiVersion"`
				Kind       string   `json:"kind"`
				Items      []Object `json:"items"`
			}{"v1", "List", objs}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	default:
		return fmt.Errorf("output format %q: want yaml or json", format)
	}
}

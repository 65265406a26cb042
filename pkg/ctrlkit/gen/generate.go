package gen

import (
	"bytes"
	"fmt"
	"go/format"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// Options configures Generate.
type Options struct {
	// Package is the Go package name of the generated file. Required.
	Package string
	// Source names the DSL document in the generated header. Empty means
	// the base name of File.Name.
	Source string
}

// GenerateFile parses src and generates Go code from it.
func GenerateFile(filename string, src []byte, opts Options) ([]byte, error) {
	f, err := Parse(filename, src)
	if err != nil {
		return nil, err
	}
	return Generate(f, opts)
}

// Generate returns the gofmt-ed Go source for a parsed document.
func Generate(f *File, opts Options) ([]byte, error) {
	if !isIdent(opts.Package) {
		return nil, fmt.Errorf("generate %s: package name %q is not a Go identifier", f.Name, opts.Package)
	}
	if opts.Source == "" {
		opts.Source = filepath.Base(f.Name)
	}
	v := buildView(f, opts)
	var buf bytes.Buffer
	if err := fileTemplate.Execute(&buf, v); err != nil {
		return nil, fmt.Errorf("generate %s: %w", f.Name, err)
	}
	out, err := format.Source(buf.Bytes())
	if err != nil {
		// A bug in the template, not in the document: show the
		// source so that it can be fixed.
		return nil, fmt.Errorf("generate %s: format generated code: %w\n%s", f.Name, err, buf.Bytes())
	}
	return out, nil
}

func isIdent(s string) bool { return s != "" && isGoIdent(s) }

type fileView struct {
	Source, Package string
	Std, Ext, Own   []importView
	Decls           []declView
}

type importView struct{ Name, Path string }

type declView struct {
	Name, Target, For string
	Doc               []string
	States            []stateView
	Actions           []actionView
	Owns              []string
}

type stateView struct {
	Name, Getter, Kind, Type, ElemType, ListType string
	List, Owned                                  bool
	NameExpr                                     string
	Labels, Fields                               []kvView
	Doc                                          []string
	Summary                                      string
}

type kvView struct{ Key, Expr string }

type actionView struct {
	Name string
	Doc  []string
	Args []argView
}

type argView struct{ Name, Getter, Type string }

func buildView(f *File, opts Options) fileView {
	v := fileView{Source: opts.Source, Package: opts.Package}
	var anyOwned, anyAction bool
	usedBinds := map[*Bind]bool{}
	for _, d := range f.Decls {
		dv := declView{Name: d.Name, Target: d.For.GoType(), For: d.For.Name, Doc: d.Doc}
		usedBinds[d.For.Bind] = true
		for _, st := range d.States {
			usedBinds[st.Kind.Bind] = true
			sv := stateView{
				Name: st.Name, Getter: getterName(st), Kind: st.Kind.Name, ElemType: st.Kind.GoType(),
				ListType: st.Kind.GoType() + "List", List: st.List, Owned: st.Owned, Doc: st.Doc,
			}
			sv.Type = "*" + sv.ElemType
			if st.List {
				sv.Type = "[]" + sv.ElemType
			}
			if st.ByName != nil {
				sv.NameExpr = goExpr(st.ByName)
			}
			for _, kv := range st.Labels {
				sv.Labels = append(sv.Labels, kvView{Key: strconv.Quote(kv.Key), Expr: goExpr(kv.Value)})
			}
			for _, kv := range st.Fields {
				sv.Fields = append(sv.Fields, kvView{Key: strconv.Quote(kv.Key), Expr: goExpr(kv.Value)})
			}
			sv.Summary = summary(st)
			if st.Owned {
				anyOwned = true
				if !slices.Contains(dv.Owns, sv.ElemType) {
					dv.Owns = append(dv.Owns, sv.ElemType)
				}
			}
			dv.States = append(dv.States, sv)
		}
		for _, a := range d.Actions {
			anyAction = true
			av := actionView{Name: a.Name, Doc: a.Doc}
			for _, st := range a.States {
				typ := "*" + st.Kind.GoType()
				if st.List {
					typ = "[]" + st.Kind.GoType()
				}
				av.Args = append(av.Args, argView{Name: st.Name, Getter: getterName(st), Type: typ})
			}
			dv.Actions = append(dv.Actions, av)
		}
		v.Decls = append(v.Decls, dv)
	}

	// Import exactly what the code below uses: an unused import does not
	// compile (the first generator's list states without an owner
	// selector imported metav1 for nothing).
	if len(f.Decls) == 0 {
		return v
	}
	v.Std = []importView{{Path: "context"}, {Path: "fmt"}}
	if anyAction {
		v.Ext = append(v.Ext, importView{Path: "github.com/go-logr/logr"})
	}
	v.Ext = append(v.Ext, importView{Name: "apierrors", Path: "k8s.io/apimachinery/pkg/api/errors"})
	if anyOwned {
		v.Ext = append(v.Ext, importView{Name: "metav1", Path: "k8s.io/apimachinery/pkg/apis/meta/v1"})
	}
	v.Ext = append(v.Ext,
		importView{Name: "ctrl", Path: "sigs.k8s.io/controller-runtime"},
		importView{Path: "sigs.k8s.io/controller-runtime/pkg/client"},
		importView{Path: "sigs.k8s.io/controller-runtime/pkg/reconcile"},
		importView{Path: "github.com/drover-fleet/drover/pkg/ctrlkit"},
	)
	for _, b := range f.Binds {
		if usedBinds[b] {
			v.Own = append(v.Own, importView{Name: b.Ident, Path: b.Package})
		}
	}
	return v
}

// goExpr renders a selector value as a Go string expression.
func goExpr(v *Value) string {
	if len(v.Parts) == 0 {
		return `""`
	}
	parts := make([]string, len(v.Parts))
	for i, p := range v.Parts {
		if p.Ref != nil {
			// Converted, so that a field of a string kind (the UID,
			// types.UID) is a string too; a no-op for a string.
			parts[i] = "string(s.target." + strings.Join(p.Ref, ".") + ")"
		} else {
			parts[i] = strconv.Quote(p.Lit)
		}
	}
	return strings.Join(parts, " + ")
}

// dslValue renders a selector value as written, for doc comments.
func dslValue(v *Value) string {
	var b strings.Builder
	for _, p := range v.Parts {
		if p.Ref != nil {
			b.WriteString("${target." + strings.Join(p.Ref, ".") + "}")
		} else {
			b.WriteString(p.Lit)
		}
	}
	return b.String()
}

// summary describes how a state is selected, for the getter's doc comment.
func summary(st *State) string {
	var sel []string
	if st.ByName != nil {
		sel = append(sel, "name "+dslValue(st.ByName))
	}
	for _, kv := range st.Labels {
		sel = append(sel, "label "+kv.Key+"="+dslValue(kv.Value))
	}
	for _, kv := range st.Fields {
		sel = append(sel, "field "+kv.Key+"="+dslValue(kv.Value))
	}
	if st.Owned {
		sel = append(sel, "controlled by the target")
	}
	what := "the " + st.Kind.Name
	if st.List {
		what = "the " + st.Kind.Name + "s"
	}
	s := what + " in the target's namespace"
	if len(sel) > 0 {
		s += " with " + strings.Join(sel, ", ")
	}
	return s
}

var fileTemplate = template.Must(template.New("file").Funcs(template.FuncMap{
	"lower": func(s string) string { return strings.ToLower(s[:1]) + s[1:] },
}).Parse(fileTmpl))

package gen

import "fmt"

// Pos is a position in a DSL document. Line and Col start at 1; Col counts
// bytes, as Go's own positions do.
type Pos struct {
	File string
	Line int
	Col  int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// before reports whether p comes before q in the same document.
func (p Pos) before(q Pos) bool {
	return p.Line < q.Line || (p.Line == q.Line && p.Col < q.Col)
}

// File is a parsed and checked DSL document.
type File struct {
	Name    string
	Binds   []*Bind
	Aliases []*Alias
	Decls   []*Decl
}

// Bind binds a group/version to the Go package holding its types.
type Bind struct {
	Pos     Pos
	Group   string // "" for the core group
	Version string
	Package string
	// Ident is the import name used in generated code, unique in the
	// file.
	Ident string
}

// GV returns the group/version as written in the DSL.
func (b *Bind) GV() string {
	if b.Group == "" {
		return b.Version
	}
	return b.Group + "/" + b.Version
}

// Alias names a group/version/kind.
type Alias struct {
	Pos  Pos
	Name string
	Kind *Kind
}

// Kind is a resolved group/version/kind.
type Kind struct {
	Bind *Bind
	Name string // the Go type name, which is the kind
}

// GoType is the qualified Go type, e.g. "corev1.Pod".
func (k *Kind) GoType() string { return k.Bind.Ident + "." + k.Name }

// Decl declares a controller manager for a kind.
type Decl struct {
	Pos     Pos
	Doc     []string
	Name    string
	For     *Kind
	States  []*State
	Actions []*ActionDecl
}

// State is an object or list the actions read, loaded from the API.
type State struct {
	Pos       Pos
	Doc       []string
	Name      string
	List      bool
	Kind      *Kind
	ByName    *Value // object states
	Labels    []KeyValue
	Fields    []KeyValue
	Owned     bool
	selectors []Pos
}

// KeyValue is one label or field selector.
type KeyValue struct {
	Pos   Pos
	Key   string
	Value *Value
}

// Value is a selector value: literal text and ${target.Path} references.
type Value struct {
	Pos   Pos
	Parts []ValuePart
}

// ValuePart is literal text (Ref nil) or a reference to a field path of the
// target object (Ref is the path after "target").
type ValuePart struct {
	Lit string
	Ref []string
}

// ActionDecl declares an action and the states it takes.
type ActionDecl struct {
	Pos    Pos
	Doc    []string
	Name   string
	States []*State
}

package gen

import (
	"fmt"
	gotoken "go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Parse parses and checks a DSL document. filename is used in positions.
// On any problem it returns an ErrorList and no File.
func Parse(filename string, src []byte) (*File, error) {
	lx, errs := lex(filename, src)
	p := &parser{lx: lx, file: &File{Name: filename}, errs: errs,
		binds: map[string]*Bind{}, aliases: map[string]*Alias{}, decls: map[string]*Decl{}}
	p.parseFile()
	if len(p.errs) > 0 {
		if len(p.errs) > maxErrors {
			p.errs = p.errs[:maxErrors]
		}
		return nil, p.errs
	}
	assignIdents(p.file)
	return p.file, nil
}

type parser struct {
	lx   *lexed
	i    int
	file *File
	errs ErrorList

	binds   map[string]*Bind // by group/version
	aliases map[string]*Alias
	decls   map[string]*Decl
}

// bail unwinds the parse of one statement after a syntax error; parseFile
// recovers it and skips to the next top-level statement.
type bail struct{}

func (p *parser) errorf(pos Pos, format string, args ...any) {
	p.errs = append(p.errs, &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) fail(pos Pos, format string, args ...any) {
	p.errorf(pos, format, args...)
	panic(bail{})
}

func (p *parser) peek() token { return p.lx.tokens[p.i] }

func (p *parser) next() token {
	t := p.lx.tokens[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

func (p *parser) skipNewlines() {
	for p.peek().kind == tokNewline {
		p.i++
	}
}

func (p *parser) expect(kind tokenKind, what string) token {
	t := p.next()
	if t.kind != kind {
		p.fail(t.pos, "expected %s, found %s", what, t)
	}
	return t
}

func (p *parser) expectEOL() {
	t := p.next()
	if t.kind != tokNewline && t.kind != tokEOF {
		p.fail(t.pos, "expected end of line, found %s", t)
	}
}

func (p *parser) parseFile() {
	for {
		p.skipNewlines()
		t := p.peek()
		if t.kind == tokEOF {
			return
		}
		p.statement()
	}
}

// statement parses one top-level statement, recovering from a syntax error
// by skipping to the next line that starts with a word at column 1.
func (p *parser) statement() {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(bail); !ok {
				panic(v)
			}
			p.resync()
		}
	}()
	t := p.next()
	if t.kind != tokWord {
		p.fail(t.pos, "expected bind, alias or decl, found %s", t)
	}
	switch t.text {
	case "bind":
		p.parseBind(t)
	case "alias":
		p.parseAlias(t)
	case "decl":
		p.parseDecl(t)
	default:
		p.fail(t.pos, "unknown statement %q; expected bind, alias or decl", t.text)
	}
}

func (p *parser) resync() {
	for {
		t := p.peek()
		if t.kind == tokEOF {
			return
		}
		// Statements start at column 1 and decl bodies are
		// indented, so a word at column 1 starts the next statement.
		if t.kind == tokWord && t.pos.Col == 1 && p.i > 0 && p.lx.tokens[p.i-1].kind == tokNewline {
			return
		}
		p.i++
	}
}

var (
	groupRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	versionRE = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]+)?$`)
	pkgPathRE = regexp.MustCompile(`^[A-Za-z0-9_.~+-]+(/[A-Za-z0-9_.~+-]+)*$`)
)

// parseGV splits "group/version" or "version" (the core group).
func (p *parser) parseGV(t token, s string) (group, version string) {
	group, version, ok := strings.Cut(s, "/")
	if !ok {
		group, version = "", s
	}
	if strings.Contains(version, "/") {
		p.fail(t.pos, "%q is not a group/version", s)
	}
	if group != "" && !groupRE.MatchString(group) {
		p.fail(t.pos, "%q is not a valid API group", group)
	}
	if !versionRE.MatchString(version) {
		p.fail(t.pos, "%q is not a valid API version (v1, v1beta1, v2alpha3, ...)", version)
	}
	return group, version
}

func (p *parser) parseBind(kw token) {
	gvTok := p.expect(tokWord, "a group/version after bind")
	pkgTok := p.expect(tokWord, "a Go package path after the group/version")
	p.expectEOL()
	group, version := p.parseGV(gvTok, gvTok.text)
	if !pkgPathRE.MatchString(pkgTok.text) {
		p.fail(pkgTok.pos, "%q is not a Go package path", pkgTok.text)
	}
	b := &Bind{Pos: kw.pos, Group: group, Version: version, Package: pkgTok.text}
	if prev, ok := p.binds[b.GV()]; ok {
		p.fail(gvTok.pos, "%s is already bound at %s", b.GV(), prev.Pos)
	}
	p.binds[b.GV()] = b
	p.file.Binds = append(p.file.Binds, b)
}

func (p *parser) parseAlias(kw token) {
	nameTok := p.expect(tokWord, "a name after alias")
	gvkTok := p.expect(tokWord, "a group/version/kind after the alias name")
	p.expectEOL()
	if !isExported(nameTok.text) {
		p.fail(nameTok.pos, "alias name %q must be an exported Go identifier", nameTok.text)
	}
	if prev, ok := p.aliases[nameTok.text]; ok {
		p.fail(nameTok.pos, "alias %s is already declared at %s", nameTok.text, prev.Pos)
	}
	k := p.resolveGVK(gvkTok)
	a := &Alias{Pos: kw.pos, Name: nameTok.text, Kind: k}
	p.aliases[a.Name] = a
	p.file.Aliases = append(p.file.Aliases, a)
}

// resolveGVK resolves "group/version/Kind" or "version/Kind" against the
// binds seen so far.
func (p *parser) resolveGVK(t token) *Kind {
	i := strings.LastIndex(t.text, "/")
	if i < 0 {
		p.fail(t.pos, "%q is not a group/version/kind", t.text)
	}
	gv, kind := t.text[:i], t.text[i+1:]
	group, version := p.parseGV(t, gv)
	if !isExported(kind) {
		p.fail(t.pos, "kind %q must be an exported Go identifier", kind)
	}
	gvKey := version
	if group != "" {
		gvKey = group + "/" + version
	}
	b, ok := p.binds[gvKey]
	if !ok {
		p.fail(t.pos, "group/version %s is not bound; add \"bind %s <package>\" before it", gvKey, gvKey)
	}
	return &Kind{Bind: b, Name: kind}
}

// resolveKind resolves an alias name or an inline group/version/kind.
func (p *parser) resolveKind(t token, s string) *Kind {
	if strings.Contains(s, "/") {
		return p.resolveGVK(token{kind: tokWord, text: s, pos: t.pos})
	}
	a, ok := p.aliases[s]
	if !ok {
		p.fail(t.pos, "unknown kind %q; declare it with \"alias %s <group/version/kind>\" first", s, s)
	}
	return a.Kind
}

func (p *parser) parseDecl(kw token) {
	nameTok := p.expect(tokWord, "a name after decl")
	if !isExported(nameTok.text) {
		p.fail(nameTok.pos, "decl name %q must be an exported Go identifier", nameTok.text)
	}
	if prev, ok := p.decls[nameTok.text]; ok {
		p.fail(nameTok.pos, "%s is already declared at %s", nameTok.text, prev.Pos)
	}
	forTok := p.expect(tokWord, "\"for\" after the decl name")
	if forTok.text != "for" {
		p.fail(forTok.pos, "expected \"for\", found %s", forTok)
	}
	kindTok := p.expect(tokWord, "a kind after \"for\"")
	if strings.HasPrefix(kindTok.text, "[]") {
		p.fail(kindTok.pos, "a manager is declared for one object, not a list")
	}
	d := &Decl{Pos: kw.pos, Doc: p.lx.doc(kw.pos.Line), Name: nameTok.text, For: p.resolveKind(kindTok, kindTok.text)}
	p.decls[d.Name] = d
	p.file.Decls = append(p.file.Decls, d)

	p.expect(tokLBrace, "'{' to open the decl body")
	for {
		p.skipNewlines()
		t := p.next()
		switch {
		case t.kind == tokRBrace:
			p.expectEOL()
			return
		case t.kind == tokWord && t.text == "state":
			p.parseStateBlock(d)
		case t.kind == tokWord && t.text == "action":
			p.parseActionBlock(d)
		case t.kind == tokEOF:
			p.fail(t.pos, "missing '}' to close decl %s opened at %s", d.Name, d.Pos)
		default:
			p.fail(t.pos, "expected a state or action block, found %s", t)
		}
	}
}

func (p *parser) parseStateBlock(d *Decl) {
	p.expect(tokLBrace, "'{' after state")
	p.expectEOL()
	for {
		p.skipNewlines()
		t := p.next()
		switch t.kind {
		case tokRBrace:
			p.expectEOL()
			return
		case tokWord:
			p.parseState(d, t)
		case tokEOF:
			p.fail(t.pos, "missing '}' to close the state block")
		default:
			p.fail(t.pos, "expected a state declaration (name Kind { selectors }), found %s", t)
		}
	}
}

// reservedNames returns the identifiers the generated action code uses next
// to the state variables: a state with one of these names would shadow
// them. A function rather than a package-level map, so nothing can change it.
func reservedNames() []string {
	return []string{
		"ctx", "logger", "err", "m", "s",
		"context", "fmt", "logr", "apierrors", "metav1",
		"ctrl", "client", "reconcile", "ctrlkit",
	}
}

func (p *parser) parseState(d *Decl, nameTok token) {
	st := &State{Pos: nameTok.pos, Doc: p.lx.doc(nameTok.pos.Line), Name: nameTok.text}
	if !gotoken.IsIdentifier(st.Name) {
		p.fail(nameTok.pos, "state name %q must be a Go identifier", st.Name)
	}
	if gotoken.IsKeyword(st.Name) || slices.Contains(reservedNames(), st.Name) {
		p.fail(nameTok.pos, "state name %q is reserved in generated code; choose another", st.Name)
	}
	for _, other := range d.States {
		if getterName(other) == getterName(st) {
			p.fail(nameTok.pos, "state %s is already declared at %s", other.Name, other.Pos)
		}
	}
	kindTok := p.expect(tokWord, "a kind or []kind after the state name")
	kind := kindTok.text
	if strings.HasPrefix(kind, "[]") {
		st.List, kind = true, kind[2:]
	}
	st.Kind = p.resolveKind(kindTok, kind)

	if p.peek().kind == tokLBrace {
		// Selectors go one per line; "{ owned }" on one line is fine too.
		p.next()
		for {
			p.skipNewlines()
			t := p.next()
			if t.kind == tokRBrace {
				break
			}
			if t.kind != tokWord {
				p.fail(t.pos, "expected a selector or '}', found %s", t)
			}
			p.parseSelector(st, t)
			if p.peek().kind != tokRBrace {
				p.expectEOL()
			}
		}
	}
	p.expectEOL()
	p.checkState(st)
	d.States = append(d.States, st)
}

func (p *parser) parseSelector(st *State, t token) {
	st.selectors = append(st.selectors, t.pos)
	text := t.text
	if text == "owned" {
		if st.Owned {
			p.fail(t.pos, "owned is given twice")
		}
		st.Owned = true
		return
	}
	key, raw, ok := strings.Cut(text, "=")
	if !ok {
		p.fail(t.pos, "unknown selector %q; expected name=<value>, labels/<key>=<value>, fields/<key>=<value> or owned", text)
	}
	valPos := t.pos
	valPos.Col += len(key) + 1
	val := p.parseValue(valPos, raw)
	switch {
	case key == "name":
		if st.List {
			p.fail(t.pos, "name selects one object, but state %s is a list; select with fields/metadata.name=<value> or make it an object state", st.Name)
		}
		if st.ByName != nil {
			p.fail(t.pos, "name is given twice")
		}
		if len(val.Parts) == 0 {
			p.fail(valPos, "name must not be empty")
		}
		st.ByName = val
	case strings.HasPrefix(key, "labels/"):
		k := strings.TrimPrefix(key, "labels/")
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			p.fail(t.pos, "invalid label key %q: %s", k, strings.Join(msgs, "; "))
		}
		if lit, ok := val.literal(); ok {
			if msgs := validation.IsValidLabelValue(lit); len(msgs) > 0 {
				p.fail(valPos, "invalid label value %q: %s", lit, strings.Join(msgs, "; "))
			}
		}
		st.Labels = p.addKeyValue(st.Labels, "label", KeyValue{Pos: t.pos, Key: k, Value: val})
	case strings.HasPrefix(key, "fields/"):
		k := strings.TrimPrefix(key, "fields/")
		if k == "" {
			p.fail(t.pos, "empty field selector key")
		}
		st.Fields = p.addKeyValue(st.Fields, "field", KeyValue{Pos: t.pos, Key: k, Value: val})
	default:
		p.fail(t.pos, "unknown selector %q; expected name, labels/<key>, fields/<key> or owned", key)
	}
}

func (p *parser) addKeyValue(kvs []KeyValue, what string, kv KeyValue) []KeyValue {
	for _, prev := range kvs {
		if prev.Key == kv.Key {
			p.fail(kv.Pos, "%s %q is selected twice (first at %s)", what, kv.Key, prev.Pos)
		}
	}
	return append(kvs, kv)
}

// parseValue splits a selector value into literal text and ${target.Path}
// references.
func (p *parser) parseValue(pos Pos, raw string) *Value {
	v := &Value{Pos: pos}
	for off := 0; off < len(raw); {
		i := strings.Index(raw[off:], "${")
		if i < 0 {
			v.Parts = append(v.Parts, ValuePart{Lit: raw[off:]})
			break
		}
		if i > 0 {
			v.Parts = append(v.Parts, ValuePart{Lit: raw[off : off+i]})
		}
		start := off + i
		end := strings.IndexByte(raw[start:], '}')
		refPos := pos
		refPos.Col += start
		if end < 0 {
			p.fail(refPos, "unterminated ${ in selector value")
		}
		ref := raw[start+2 : start+end]
		path := strings.Split(ref, ".")
		if path[0] != "target" {
			p.fail(refPos, "${%s} refers to %q; only ${target.<field path>} is supported", ref, path[0])
		}
		if len(path) == 1 {
			p.fail(refPos, "${target} is an object, not a string; refer to a field such as ${target.Name}")
		}
		for _, f := range path[1:] {
			if !isExported(f) {
				p.fail(refPos, "%q in ${%s} is not an exported Go field name", f, ref)
			}
		}
		v.Parts = append(v.Parts, ValuePart{Ref: path[1:]})
		off = start + end + 1
	}
	return v
}

func (v *Value) literal() (string, bool) {
	var b strings.Builder
	for _, part := range v.Parts {
		if part.Ref != nil {
			return "", false
		}
		b.WriteString(part.Lit)
	}
	return b.String(), true
}

// checkState applies the rules that need the whole state.
func (p *parser) checkState(st *State) {
	if !st.List && st.ByName == nil {
		p.fail(st.Pos, "object state %s needs a name=<value> selector; for many objects declare it as []%s", st.Name, st.Kind.Name)
	}
	if !st.List && (len(st.Labels) > 0 || len(st.Fields) > 0) {
		kv := append(st.Labels, st.Fields...)
		p.fail(kv[0].Pos, "labels and fields select lists, but state %s is one object; declare it as []%s", st.Name, st.Kind.Name)
	}
}

func (p *parser) parseActionBlock(d *Decl) {
	p.expect(tokLBrace, "'{' after action")
	p.expectEOL()
	for {
		p.skipNewlines()
		t := p.next()
		switch t.kind {
		case tokRBrace:
			p.expectEOL()
			return
		case tokWord:
			p.parseAction(d, t)
		case tokEOF:
			p.fail(t.pos, "missing '}' to close the action block")
		default:
			p.fail(t.pos, "expected an action declaration (Name(states...)), found %s", t)
		}
	}
}

func (p *parser) parseAction(d *Decl, nameTok token) {
	a := &ActionDecl{Pos: nameTok.pos, Doc: p.lx.doc(nameTok.pos.Line), Name: nameTok.text}
	if !isExported(a.Name) {
		p.fail(nameTok.pos, "action name %q must be an exported Go identifier", a.Name)
	}
	for _, other := range d.Actions {
		if other.Name == a.Name {
			p.fail(nameTok.pos, "action %s is already declared at %s", a.Name, other.Pos)
		}
	}
	p.expect(tokLParen, "'(' after the action name")
	if p.peek().kind == tokRParen {
		p.next()
	} else {
		for {
			arg := p.expect(tokWord, "a state name")
			a.States = append(a.States, p.lookupState(d, a, arg))
			sep := p.next()
			if sep.kind == tokRParen {
				break
			}
			if sep.kind != tokComma {
				p.fail(sep.pos, "expected ',' or ')', found %s", sep)
			}
		}
	}
	p.expectEOL()
	d.Actions = append(d.Actions, a)
}

func (p *parser) lookupState(d *Decl, a *ActionDecl, arg token) *State {
	for _, prev := range a.States {
		if prev.Name == arg.text {
			p.fail(arg.pos, "state %s is passed to %s twice", arg.text, a.Name)
		}
	}
	for _, st := range d.States {
		if st.Name == arg.text && st.Pos.before(arg.pos) {
			return st
		}
	}
	p.fail(arg.pos, "unknown state %q; declare it in a state block of %s before the actions that use it", arg.text, d.Name)
	return nil
}

func isExported(s string) bool {
	return gotoken.IsIdentifier(s) && gotoken.IsExported(s)
}

func getterName(st *State) string {
	return "Get" + strings.ToUpper(st.Name[:1]) + st.Name[1:]
}

// assignIdents gives each bind a unique import name, e.g. corev1 for v1 and
// appsv1 for apps/v1, avoiding the names generated code imports itself.
func assignIdents(f *File) {
	used := map[string]bool{}
	for _, name := range reservedNames() {
		used[name] = true
	}
	for _, b := range f.Binds {
		base := "core"
		if b.Group != "" {
			base = strings.Map(func(r rune) rune {
				if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
					return r
				}
				return -1
			}, strings.SplitN(b.Group, ".", 2)[0])
		}
		name := base + b.Version
		for n := 2; used[name] || gotoken.IsKeyword(name); n++ {
			name = base + b.Version + "_" + strconv.Itoa(n)
		}
		used[name] = true
		b.Ident = name
	}
}

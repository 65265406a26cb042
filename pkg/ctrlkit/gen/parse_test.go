package gen

import (
	"errors"
	"strings"
	"testing"
)

const header = "bind v1 k8s.io/api/core/v1\nalias Pod v1/Pod\nalias ConfigMap v1/ConfigMap\n"

func TestParseErrors(t *testing.T) {
	rows := []struct {
		name string
		src  string
		want string // the first error
	}{
		{"an unknown statement", "bnd v1 k8s.io/api/core/v1\n",
			`x.ctrlkit:1:1: unknown statement "bnd"; expected bind, alias or decl`},
		{"a bind without a package", "bind v1\n",
			`x.ctrlkit:1:8: expected a Go package path after the group/version, found end of line`},
		{"a bad version", "bind apps/version1 k8s.io/api/apps/v1\n",
			`x.ctrlkit:1:6: "version1" is not a valid API version (v1, v1beta1, v2alpha3, ...)`},
		{"a bind given twice", "bind v1 a/b\nbind v1 c/d\n",
			`x.ctrlkit:2:6: v1 is already bound at x.ctrlkit:1:1`},
		{"an alias of an unbound group", "alias Job batch/v1/Job\n",
			`x.ctrlkit:1:11: group/version batch/v1 is not bound; add "bind batch/v1 <package>" before it`},
		{"an alias to a lower-case kind", "bind v1 k8s.io/api/core/v1\nalias Pod v1/pod\n",
			`x.ctrlkit:2:11: kind "pod" must be an exported Go identifier`},
		{"an unknown kind", header + "decl M for Job {\n}\n",
			`x.ctrlkit:4:12: unknown kind "Job"; declare it with "alias Job <group/version/kind>" first`},
		{"a decl for a list", header + "decl M for []Pod {\n}\n",
			`x.ctrlkit:4:12: a manager is declared for one object, not a list`},
		{"a decl without for", header + "decl M of Pod {\n}\n",
			`x.ctrlkit:4:8: expected "for", found "of"`},
		{"an unclosed decl", header + "decl M for Pod {\n  action {\n  }\n",
			`x.ctrlkit:7:1: missing '}' to close decl M opened at x.ctrlkit:4:1`},
		{"an object state without a name", header + "decl M for Pod {\n  state {\n    cm ConfigMap {\n      owned\n    }\n  }\n}\n",
			`x.ctrlkit:6:5: object state cm needs a name=<value> selector; for many objects declare it as []ConfigMap`},
		{"a name selector on a list", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      name=x\n    }\n  }\n}\n",
			`x.ctrlkit:7:7: name selects one object, but state cms is a list; select with fields/metadata.name=<value> or make it an object state`},
		{"labels on an object state", header + "decl M for Pod {\n  state {\n    cm ConfigMap {\n      name=x\n      labels/a=b\n    }\n  }\n}\n",
			`x.ctrlkit:8:7: labels and fields select lists, but state cm is one object; declare it as []ConfigMap`},
		{"an unknown selector", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      annotations/a=b\n    }\n  }\n}\n",
			`x.ctrlkit:7:7: unknown selector "annotations/a"; expected name, labels/<key>, fields/<key> or owned`},
		{"a bare word selector", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      mine\n    }\n  }\n}\n",
			`x.ctrlkit:7:7: unknown selector "mine"; expected name=<value>, labels/<key>=<value>, fields/<key>=<value> or owned`},
		{"a label twice", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      labels/a=b\n      labels/a=c\n    }\n  }\n}\n",
			`x.ctrlkit:8:7: label "a" is selected twice (first at x.ctrlkit:7:7)`},
		{"an invalid label value", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      labels/a=-bad-\n    }\n  }\n}\n",
			`x.ctrlkit:7:16: invalid label value "-bad-": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`},
		{"a space in a value", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      labels/a=no spaces\n    }\n  }\n}\n",
			`x.ctrlkit:7:19: expected end of line, found "spaces"`},
		{"an invalid label key", header + "decl M for Pod {\n  state {\n    cms []ConfigMap {\n      labels/-a=b\n    }\n  }\n}\n",
			`x.ctrlkit:7:7: invalid label key "-a": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		{"a reference to something else than the target", header + "decl M for Pod {\n  state {\n    cm ConfigMap {\n      name=${owner.Name}\n    }\n  }\n}\n",
			`x.ctrlkit:7:12: ${owner.Name} refers to "owner"; only ${target.<field path>} is supported`},
		{"a reference to the target itself", header + "decl M for Pod {\n  state {\n    cm ConfigMap {\n      name=x-${target}\n    }\n  }\n}\n",
			`x.ctrlkit:7:14: ${target} is an object, not a string; refer to a field such as ${target.Name}`},
		{"an unterminated reference", header + "decl M for Pod {\n  state {\n    cm ConfigMap {\n      name=${target.Name\n    }\n  }\n}\n",
			`x.ctrlkit:7:12: unterminated ${ in selector value`},
		{"a reserved state name", header + "decl M for Pod {\n  state {\n    ctx ConfigMap {\n      name=x\n    }\n  }\n}\n",
			`x.ctrlkit:6:5: state name "ctx" is reserved in generated code; choose another`},
		{"states whose getters collide", header + "decl M for Pod {\n  state {\n    pods []Pod\n    Pods []Pod\n  }\n}\n",
			`x.ctrlkit:7:5: state pods is already declared at x.ctrlkit:6:5`},
		{"an action with an unknown state", header + "decl M for Pod {\n  action {\n    Sync(pods)\n  }\n}\n",
			`x.ctrlkit:6:10: unknown state "pods"; declare it in a state block of M before the actions that use it`},
		{"an action using a state declared after it", header + "decl M for Pod {\n  action {\n    Sync(pods)\n  }\n  state {\n    pods []Pod\n  }\n}\n",
			`x.ctrlkit:6:10: unknown state "pods"; declare it in a state block of M before the actions that use it`},
		{"a lower-case action", header + "decl M for Pod {\n  action {\n    sync()\n  }\n}\n",
			`x.ctrlkit:6:5: action name "sync" must be an exported Go identifier`},
		{"an action twice", header + "decl M for Pod {\n  action {\n    Sync()\n    Sync()\n  }\n}\n",
			`x.ctrlkit:7:5: action Sync is already declared at x.ctrlkit:6:5`},
		{"a state passed twice", header + "decl M for Pod {\n  state {\n    pods []Pod\n  }\n  action {\n    Sync(pods, pods)\n  }\n}\n",
			`x.ctrlkit:9:16: state pods is passed to Sync twice`},
		{"a missing parenthesis", header + "decl M for Pod {\n  action {\n    Sync(\n  }\n}\n",
			`x.ctrlkit:6:10: expected a state name, found end of line`},
		{"a decl twice", header + "decl M for Pod {\n}\ndecl M for Pod {\n}\n",
			`x.ctrlkit:6:6: M is already declared at x.ctrlkit:4:1`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			f, err := Parse("x.ctrlkit", []byte(row.src))
			var list ErrorList
			if !errors.As(err, &list) || f != nil {
				t.Fatalf("Parse(%s) = %v, %v; want no file and an ErrorList", row.name, f, err)
			}
			if got := list[0].Error(); got != row.want {
				t.Errorf("Parse(%s) = %q, want %q", row.name, got, row.want)
			}
			if out, err := GenerateFile("x.ctrlkit", []byte(row.src), Options{Package: "x"}); out != nil || err == nil {
				t.Errorf("GenerateFile(%s) generated %d bytes, want nothing", row.name, len(out))
			}
		})
	}
}

func TestParseReportsSeveralErrors(t *testing.T) {
	src := "bind v1\nalias Pod v1/Pod\nbogus\n"
	_, err := Parse("x.ctrlkit", []byte(src))
	got := strings.Split(err.Error(), "\n")
	want := []string{
		"x.ctrlkit:1:8: expected a Go package path after the group/version, found end of line",
		`x.ctrlkit:2:11: group/version v1 is not bound; add "bind v1 <package>" before it`,
		`x.ctrlkit:3:1: unknown statement "bogus"; expected bind, alias or decl`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Parse = \n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseResolvesTheDocument(t *testing.T) {
	src := header + `bind apps/v1 k8s.io/api/apps/v1
// M manages pods.
decl M for apps/v1/Deployment {
  state {
    // cfg is the config.
    cfg ConfigMap { name=${target.Name}-cfg }
    pods []Pod {
      labels/app=${target.Name}
      fields/spec.nodeName=n1
      owned
    }
  }
  action {
    Sync(cfg, pods)
  }
}
`
	f, err := Parse("x.ctrlkit", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	d := f.Decls[0]
	if d.For.GoType() != "appsv1.Deployment" || strings.Join(d.Doc, " ") != "M manages pods." {
		t.Errorf("decl = for %s doc %q, want for appsv1.Deployment doc %q", d.For.GoType(), d.Doc, "M manages pods.")
	}
	cfg, pods := d.States[0], d.States[1]
	if cfg.List || goExpr(cfg.ByName) != `string(s.target.Name) + "-cfg"` || cfg.Doc[0] != "cfg is the config." {
		t.Errorf("cfg = list %v name %s doc %q, want an object named string(s.target.Name) + \"-cfg\"", cfg.List, goExpr(cfg.ByName), cfg.Doc)
	}
	if !pods.List || !pods.Owned || len(pods.Labels) != 1 || len(pods.Fields) != 1 || goExpr(pods.Fields[0].Value) != `"n1"` {
		t.Errorf("pods = %+v, want an owned list with one label and one field", pods)
	}
	if a := d.Actions[0]; a.Name != "Sync" || len(a.States) != 2 || a.States[1] != pods {
		t.Errorf("action = %+v, want Sync(cfg, pods)", a)
	}
}

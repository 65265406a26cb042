package gen

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	goparser "go/parser"
	gotoken "go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Command is the ctrlkit command line: cmd/ctrlkit runs it, and so can
// `drover ctrlkit`.
//
//	ctrlkit gen    [-o out.go] [-package name] file.ctrlkit   write the generated code (stdout without -o)
//	ctrlkit check  -o out.go [-package name] file.ctrlkit     fail if out.go is not what gen would write
//	ctrlkit verify [dir ...]                                  run check for every //go:generate ctrlkit gen
//	                                                          line in .go files under the dirs (default .)
type Command struct {
	// Stdout and Stderr receive output. Nil means io.Discard.
	Stdout, Stderr io.Writer
	// Getenv reads GOPACKAGE, which go generate sets. Nil means os.Getenv.
	Getenv func(string) string
}

// ErrStale is returned by check and verify when a generated file is out of
// date.
var ErrStale = errors.New("generated code is out of date; run go generate")

const usage = `usage:
  ctrlkit gen    [-o out.go] [-package name] file.ctrlkit
  ctrlkit check  -o out.go [-package name] file.ctrlkit
  ctrlkit verify [dir ...]`

// Run runs the command with args (without the program name).
func (c Command) Run(args []string) error {
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "gen":
		return c.gen(args[1:], ".", false)
	case "check":
		return c.gen(args[1:], ".", true)
	case "verify":
		return c.verify(args[1:])
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

// gen runs gen or check with paths relative to dir.
func (c Command) gen(args []string, dir string, check bool) error {
	fset := flag.NewFlagSet("gen", flag.ContinueOnError)
	fset.SetOutput(c.Stderr)
	out := fset.String("o", "", "output file (default stdout)")
	pkg := fset.String("package", "", "Go package name (default $GOPACKAGE, else the output directory's package)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if fset.NArg() != 1 {
		return fmt.Errorf("want exactly one .ctrlkit file, got %d\n%s", fset.NArg(), usage)
	}
	if check && *out == "" {
		return errors.New("check needs -o, the file to compare with")
	}
	in := fset.Arg(0)
	in = resolve(dir, in)
	src, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	outPath := ""
	if *out != "" {
		outPath = resolve(dir, *out)
	}
	if *pkg == "" {
		*pkg = c.packageName(outPath, dir)
	}
	code, err := GenerateFile(in, src, Options{Package: *pkg, Source: filepath.Base(in)})
	if err != nil {
		return err
	}
	if outPath == "" {
		_, err := c.Stdout.Write(code)
		return err
	}
	old, err := os.ReadFile(outPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if bytes.Equal(old, code) {
		return nil
	}
	if check {
		return fmt.Errorf("%s: %w", outPath, ErrStale)
	}
	return writeAtomic(outPath, code)
}

// resolve makes a path from a command line relative to dir, the directory
// go generate would run the command in.
func resolve(dir, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

// packageName picks the package for generated code: $GOPACKAGE when run by
// go generate, else the package clause of a Go file next to the output,
// else the directory's name.
func (c Command) packageName(outPath, dir string) string {
	if p := c.Getenv("GOPACKAGE"); p != "" {
		return p
	}
	outDir := dir
	if outPath != "" {
		outDir = filepath.Dir(outPath)
	}
	if p := packageOf(outDir); p != "" {
		return p
	}
	abs, err := filepath.Abs(outDir)
	if err != nil {
		return "main"
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return -1
	}, strings.ToLower(filepath.Base(abs)))
	if !isIdent(name) {
		return "main"
	}
	return name
}

// packageOf returns the package clause of a non-test Go file in dir.
func packageOf(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(gotoken.NewFileSet(), m, nil, goparser.PackageClauseOnly)
		if err == nil {
			return f.Name.Name
		}
	}
	return ""
}

// writeAtomic replaces path, so that a failed write never leaves half a
// file for the compiler to trip on.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ctrlkit-*.go.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// verify finds //go:generate lines that run ctrlkit gen and checks them.
func (c Command) verify(dirs []string) error {
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	var errs []error
	checked := 0
	for _, root := range dirs {
		root = strings.TrimSuffix(root, "/...")
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				name := d.Name()
				if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") {
				return nil
			}
			lines, err := generateLines(path)
			if err != nil {
				return err
			}
			for _, args := range lines {
				checked++
				env := c
				pkg := packageOf(filepath.Dir(path))
				env.Getenv = func(k string) string {
					if k == "GOPACKAGE" {
						return pkg
					}
					return ""
				}
				if err := env.gen(args, filepath.Dir(path), true); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", path, err))
				}
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	fmt.Fprintf(c.Stdout, "ctrlkit verify: %d generated file(s) checked, %d stale or failing\n", checked, len(errs))
	return errors.Join(errs...)
}

// generateLines returns the arguments after "gen" of each //go:generate
// line in path that runs ctrlkit gen.
func generateLines(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "//go:generate ") {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, "//go:generate "))
		for i := 0; i+1 < len(fields); i++ {
			if (fields[i] == "ctrlkit" || strings.HasSuffix(fields[i], "/ctrlkit")) && fields[i+1] == "gen" {
				out = append(out, fields[i+2:])
				break
			}
		}
	}
	return out, sc.Err()
}

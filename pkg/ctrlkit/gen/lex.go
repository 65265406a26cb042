package gen

import (
	"fmt"

	"strings"
)

// Error is one problem in a DSL document.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

// ErrorList is every problem found in a document, in source order.
type ErrorList []*Error

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// maxErrors stops reporting after a few errors: later ones are usually
// echoes of the first.
const maxErrors = 10

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokNewline
	tokWord
	tokLBrace
	tokRBrace
	tokLParen
	tokRParen
	tokComma
)

func (k tokenKind) String() string {
	switch k {
	case tokEOF:
		return "end of file"
	case tokNewline:
		return "end of line"
	case tokWord:
		return "word"
	case tokLBrace:
		return "'{'"
	case tokRBrace:
		return "'}'"
	case tokLParen:
		return "'('"
	case tokRParen:
		return "')'"
	default:
		return "','"
	}
}

type token struct {
	kind tokenKind
	text string
	pos  Pos
}

func (t token) String() string {
	if t.kind == tokWord {
		return fmt.Sprintf("%q", t.text)
	}
	return t.kind.String()
}

// lexed is a tokenized document. Comments are not tokens: whole-line
// comments are kept by line, so that a declaration can pick up the lines
// just above it as its doc comment.
type lexed struct {
	tokens   []token
	comments map[int]string // line -> text after "//", whole-line comments only
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

func isPunct(c byte) bool {
	return c == '{' || c == '}' || c == '(' || c == ')' || c == ','
}

// lex splits src into tokens. A word is a run of anything but spaces and
// punctuation, except that "${...}" is taken whole so that selector values
// such as labels/app=${target.Name} are one word.
func lex(file string, src []byte) (*lexed, ErrorList) {
	out := &lexed{comments: map[int]string{}}
	var errs ErrorList
	line, lineStart := 1, 0
	codeOnLine := false
	pos := func(i int) Pos { return Pos{File: file, Line: line, Col: i - lineStart + 1} }
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			out.tokens = append(out.tokens, token{kind: tokNewline, pos: pos(i)})
			i++
			line, lineStart, codeOnLine = line+1, i, false
		case isSpace(c):
			i++
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			end := i
			for end < len(src) && src[end] != '\n' {
				end++
			}
			if !codeOnLine {
				out.comments[line] = strings.TrimSpace(string(src[i+2 : end]))
			}
			i = end
		case isPunct(c):
			kind := map[byte]tokenKind{'{': tokLBrace, '}': tokRBrace, '(': tokLParen, ')': tokRParen, ',': tokComma}[c]
			out.tokens = append(out.tokens, token{kind: kind, text: string(c), pos: pos(i)})
			codeOnLine = true
			i++
		default:
			start := i
			for i < len(src) && !isSpace(src[i]) && src[i] != '\n' && !isPunct(src[i]) {
				if src[i] == '$' && i+1 < len(src) && src[i+1] == '{' {
					end := strings.IndexAny(string(src[i:]), "}\n")
					if end < 0 || src[i+end] == '\n' {
						errs = append(errs, &Error{Pos: pos(i), Msg: "unterminated ${ in selector value"})
						for i < len(src) && src[i] != '\n' {
							i++
						}
						break
					}
					i += end + 1
					continue
				}
				i++
			}
			out.tokens = append(out.tokens, token{kind: tokWord, text: string(src[start:i]), pos: pos(start)})
			codeOnLine = true
		}
	}
	out.tokens = append(out.tokens, token{kind: tokNewline, pos: pos(len(src))}, token{kind: tokEOF, pos: pos(len(src))})
	return out, errs
}

// doc returns the whole-line comments directly above line.
func (l *lexed) doc(line int) []string {
	var lines []string
	for n := line - 1; ; n-- {
		c, ok := l.comments[n]
		if !ok {
			break
		}
		lines = append(lines, c)
	}
	for i, j := 0, len(lines)-1; i < j; i, j = i+1, j-1 {
		lines[i], lines[j] = lines[j], lines[i]
	}
	return lines
}

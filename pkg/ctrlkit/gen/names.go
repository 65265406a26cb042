package gen

import gotoken "go/token"

func isGoIdent(s string) bool { return gotoken.IsIdentifier(s) }

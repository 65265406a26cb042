//go:build !linux

package agent

func trimBinaryPages() int { return 0 }

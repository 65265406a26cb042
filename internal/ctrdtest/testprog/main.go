// Command testprog is the program of ctrdtest's test image: it runs its
// arguments as steps, in order:
//
//	echo TEXT      print TEXT to stdout
//	err TEXT       print TEXT to stderr
//	sleep DUR      sleep a Go duration
//	alloc MIB      allocate and touch MIB MiB, and keep them
//	ignore-term    ignore SIGTERM from now on
//	trap-term      on SIGTERM print "got SIGTERM" and exit 0
//	id             print uid=N gid=N groups=[...]
//	env NAME       print NAME=value
//	exit N         exit with code N
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	var keep [][]byte
	for len(args) > 0 {
		step := args[0]
		arg := ""
		if step != "ignore-term" && step != "trap-term" && step != "id" {
			if len(args) < 2 {
				fmt.Fprintf(os.Stderr, "testprog: %s needs an argument\n", step)
				os.Exit(2)
			}
			arg, args = args[1], args[1:]
		}
		args = args[1:]
		switch step {
		case "echo":
			fmt.Println(arg)
		case "err":
			fmt.Fprintln(os.Stderr, arg)
		case "sleep":
			d, _ := time.ParseDuration(arg)
			time.Sleep(d)
		case "alloc":
			n, _ := strconv.Atoi(arg)
			for i := 0; i < n; i++ {
				b := make([]byte, 1<<20)
				for j := range b {
					b[j] = 1
				}
				keep = append(keep, b)
			}
		case "ignore-term":
			signal.Ignore(syscall.SIGTERM)
		case "trap-term":
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGTERM)
			go func() {
				<-c
				fmt.Println("got SIGTERM")
				os.Exit(0)
			}()
		case "id":
			g, _ := os.Getgroups()
			fmt.Printf("uid=%d gid=%d groups=%v\n", os.Getuid(), os.Getgid(), g)
		case "env":
			fmt.Printf("%s=%s\n", arg, os.Getenv(arg))
		case "exit":
			n, _ := strconv.Atoi(arg)
			os.Exit(n)
		default:
			fmt.Fprintf(os.Stderr, "testprog: unknown step %q\n", step)
			os.Exit(2)
		}
	}
	_ = keep
}

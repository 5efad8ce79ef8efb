// Command oracle computes reference answers for kpssh's oracle tests (tests/oracles/).
//
// It is one long-running process per mode: it reads one JSON object per line on stdin and
// writes one JSON object per line on stdout, in order, until stdin closes.
//
//	oracle template      Go text/template with Option("missingkey=error") on the Go
//	                     provider's template data (package profile)
//	oracle joinhash      the Go provider's SSHNodeClass JoinHash
//	oracle nodepoolhash  Karpenter core's NodePool.Hash() and NodePoolHashVersion
//	oracle requirements  Karpenter core's scheduling.Requirements Compatible / Intersects
//
// Built by scripts/oracle.sh; see docs/development.md.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: oracle template|joinhash|nodepoolhash|requirements")
		os.Exit(2)
	}
	handlers := map[string]func([]byte) any{
		"template":     templateCase,
		"joinhash":     joinHashCase,
		"nodepoolhash": nodePoolHashCase,
		"requirements": requirementsCase,
	}
	handle, ok := handlers[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "oracle: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		if err := enc.Encode(handle(in.Bytes())); err != nil {
			fmt.Fprintln(os.Stderr, "oracle:", err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(1)
	}
}

// failure is the answer to a line the oracle could not decode.
type failure struct {
	Error string `json:"decodeError"`
}

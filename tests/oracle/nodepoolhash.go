package main

import (
	"encoding/json"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// nodePoolHashCase reads a NodePool as the API serves it and answers core's hash of its
// template and the hash version core stamps beside it.
func nodePoolHashCase(line []byte) any {
	var pool karpv1.NodePool
	if err := json.Unmarshal(line, &pool); err != nil {
		return failure{err.Error()}
	}
	return struct {
		Hash    string `json:"hash"`
		Version string `json:"version"`
	}{pool.Hash(), karpv1.NodePoolHashVersion}
}

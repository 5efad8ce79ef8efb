package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// The Go provider's SSHNodeClassSpec, the fields JoinHash reads, with its JSON names and Go
// types (pkg/apis/v1beta1/sshnodeclass_types.go of dklesev/karpenter-provider-ssh).
type nodeClassSpec struct {
	Vars             map[string]string            `json:"vars,omitempty"`
	JoinSecretRef    *corev1.LocalObjectReference `json:"joinSecretRef,omitempty"`
	ProviderIDSource string                       `json:"providerIDSource,omitempty"`
	Cluster          *clusterAccess               `json:"cluster,omitempty"`
}

type clusterAccess struct {
	Endpoint string `json:"endpoint"`
	CABundle []byte `json:"caBundle,omitempty"`
}

// joinHash: the first 8 bytes, hex, of SHA-256 over json.Marshal of vars, joinSecretRef,
// providerIDSource and cluster, in that order, each omitempty.
func joinHash(s *nodeClassSpec) string {
	b, _ := json.Marshal(struct {
		Vars             map[string]string            `json:"vars,omitempty"`
		JoinSecretRef    *corev1.LocalObjectReference `json:"joinSecretRef,omitempty"`
		ProviderIDSource string                       `json:"providerIDSource,omitempty"`
		Cluster          *clusterAccess               `json:"cluster,omitempty"`
	}{s.Vars, s.JoinSecretRef, s.ProviderIDSource, s.Cluster})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// joinHashCase reads an SSHNodeClass spec as the API serves it.
func joinHashCase(line []byte) any {
	var spec nodeClassSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return failure{err.Error()}
	}
	return struct {
		Hash    string `json:"hash"`
		Version string `json:"version"`
	}{joinHash(&spec), "v1"}
}

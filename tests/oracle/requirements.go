package main

import (
	"encoding/json"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/scheduling"
)

type requirementsRequest struct {
	// Existing is the receiver of Compatible / Intersects (e.g. an instance type's).
	Existing []karpv1.NodeSelectorRequirementWithMinValues `json:"existing"`
	// Incoming is the argument (e.g. a NodeClaim's or a pod's).
	Incoming []karpv1.NodeSelectorRequirementWithMinValues `json:"incoming"`
	// Labels are checked against Incoming as a node's labels: NewLabelRequirements(labels)
	// .Compatible(incoming).
	Labels map[string]string `json:"labels"`
}

func requirementsCase(line []byte) any {
	var req requirementsRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return failure{err.Error()}
	}
	existing := scheduling.NewNodeSelectorRequirementsWithMinValues(req.Existing...)
	incoming := scheduling.NewNodeSelectorRequirementsWithMinValues(req.Incoming...)
	labels := scheduling.NewLabelRequirements(req.Labels)
	return struct {
		Compatible          bool `json:"compatible"`
		CompatibleWellKnown bool `json:"compatibleWellKnown"`
		Intersects          bool `json:"intersects"`
		LabelsCompatible    bool `json:"labelsCompatible"`
	}{
		existing.Compatible(incoming) == nil,
		existing.Compatible(incoming, scheduling.AllowUndefinedWellKnownLabels) == nil,
		existing.Intersects(incoming) == nil,
		labels.Compatible(incoming) == nil,
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"text/template"

	"github.com/kpssh/kpssh/tests/oracle/profile"
)

type templateRequest struct {
	Src  string          `json:"src"`
	Data profile.Context `json:"data"`
}

// templateAnswer: parseError, or execError, or output (bytes, base64 in JSON). emptyError
// is the Go provider's leave rule: rendering against an empty Context (empty when it passes).
type templateAnswer struct {
	ParseError *string `json:"parseError,omitempty"`
	ExecError  *string `json:"execError,omitempty"`
	Output     []byte  `json:"output"`
	EmptyError *string `json:"emptyError,omitempty"`
}

func templateCase(line []byte) any {
	var req templateRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return failure{err.Error()}
	}
	// As the Go provider parses every phase script (internal/profile/profile.go).
	tpl, err := template.New("join").Option("missingkey=error").Parse(req.Src)
	if err != nil {
		msg := err.Error()
		return templateAnswer{ParseError: &msg}
	}
	var ans templateAnswer
	var buf bytes.Buffer
	if err := tpl.Execute(&buf, &req.Data); err != nil {
		msg := err.Error()
		ans.ExecError = &msg
	} else {
		// A copy: the buffer is reused below. Non-nil, so that "" is told from an error.
		ans.Output = append([]byte{}, buf.Bytes()...)
	}
	var empty bytes.Buffer
	if err := tpl.Execute(&empty, &profile.Context{}); err != nil {
		msg := err.Error()
		ans.EmptyError = &msg
	}
	return ans
}

// Package profile holds the template data of the Go provider's join profiles: the same
// package name, type name, fields (in order) and methods as its internal/profile.Context, so
// that everything a template can reach — fields, methods, %T, %#v, error texts — is what the
// Go provider's templates see.
package profile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Context is the data available to script templates.
type Context struct {
	ClusterEndpoint    string
	ClusterCACert      string
	BootstrapToken     string
	NodeName           string
	ProviderID         string
	NodeLabels         string
	RegisterWithTaints string
	HostAddress        string
	NodeAddress        string
	Vars               map[string]string
	Secrets            map[string]string
}

func secretEnvName(key string) string {
	return "KPSSH_SECRET_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(key))
}

// Env is the script environment of the context; colliding secret names are an error.
func (c *Context) Env() (map[string]string, error) {
	env := map[string]string{
		"KPSSH_CLUSTER_ENDPOINT": c.ClusterEndpoint,
		"KPSSH_CLUSTER_CA_B64":   c.ClusterCACert,
		"KPSSH_BOOTSTRAP_TOKEN":  c.BootstrapToken,
		"KPSSH_NODE_NAME":        c.NodeName,
		"KPSSH_PROVIDER_ID":      c.ProviderID,
		"KPSSH_NODE_LABELS":      c.NodeLabels,
		"KPSSH_TAINTS":           c.RegisterWithTaints,
		"KPSSH_HOST_ADDRESS":     c.HostAddress,
		"KPSSH_NODE_ADDRESS":     c.NodeAddress,
	}
	for k, v := range c.Vars {
		env["KPSSH_VAR_"+k] = v
	}
	seen := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(c.Secrets)) {
		name := secretEnvName(k)
		if prev, dup := seen[name]; dup {
			return nil, fmt.Errorf("secret keys %q and %q both map to %s", prev, k, name)
		}
		seen[name] = k
		env[name] = c.Secrets[k]
	}
	return env, nil
}

// Redact replaces the token, its secret half and every secret value of at least 8 bytes,
// longest first, with [REDACTED].
func (c *Context) Redact(msg string) string {
	values := make([]string, 0, len(c.Secrets)+1)
	if c.BootstrapToken != "" {
		values = append(values, c.BootstrapToken)
		if _, secret, ok := strings.Cut(c.BootstrapToken, "."); ok {
			values = append(values, secret)
		}
	}
	for _, v := range c.Secrets {
		values = append(values, v)
	}
	slices.SortFunc(values, func(a, b string) int { return len(b) - len(a) })
	for _, v := range values {
		if len(v) < 8 {
			continue
		}
		msg = strings.ReplaceAll(msg, v, "[REDACTED]")
	}
	return msg
}

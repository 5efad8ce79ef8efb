//! S61: kpssh's template engine against Go's `text/template` with `missingkey=error` on the Go
//! provider's template data (`tests/oracle/profile`): the same accept/reject at parse time, at
//! render time and for the leave rule (render against the empty context), and byte-identical
//! output. Where both reject, kpssh's error must carry a position.

use std::collections::BTreeMap;
use std::sync::Mutex;

use base64::Engine as _;
use kpssh::profile::template::{ContextData, Template};
use kpssh::secret::Secret;
use proptest::prelude::*;
use serde_json::json;

use crate::support::{Oracle, cases};

#[derive(serde::Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Answer {
    pub(crate) parse_error: Option<String>,
    pub(crate) exec_error: Option<String>,
    /// Base64 of the rendered bytes.
    output: Option<String>,
    empty_error: Option<String>,
}

/// Template text around actions: shell-ish, with braces, dashes and spaces next to actions so
/// that trim markers have something to trim.
pub(crate) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just(" \t\n ".to_string()),
        Just("echo \"$KPSSH_NODE_NAME\" }".to_string()),
        Just("{ -".to_string()),
        Just("ü".to_string()),
    ]
}

/// An operand: data fields (present and missing), map keys (present and missing), variables,
/// literals.
pub(crate) fn operand() -> BoxedStrategy<String> {
    prop_oneof![
        Just(".".to_string()),
        Just(".NodeName".to_string()),
        Just(".HostAddress".to_string()),
        Just(".ProviderID".to_string()),
        Just(".BootstrapToken".to_string()),
        Just(".ClusterCACert".to_string()),
        Just(".Vars".to_string()),
        Just(".Secrets".to_string()),
        Just(".Vars.k1".to_string()),
        Just(".Vars.k2".to_string()),
        Just(".Vars.nope".to_string()),
        Just(".Secrets.s1".to_string()),
        Just(".Nope".to_string()),
        Just(".NodeName.x".to_string()),
        Just("$".to_string()),
        Just("$.NodeAddress".to_string()),
        Just("$.Vars.k1".to_string()),
        Just("$v".to_string()),
        Just("\"a\"".to_string()),
        Just("\"\"".to_string()),
        Just("\"x\\ty\\\"z\"".to_string()),
        Just("`r\\n`".to_string()),
        // What html and urlquery escape: quotes, angle brackets, &, NUL, space, +, /, non-ASCII.
        Just("\"<a href='x?q=1&b=2'>\\x00 é+/~\"".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        Just("-2".to_string()),
        // Float, character and complex constants (template_builtins.rs has their own tier).
        Just("1.5".to_string()),
        Just("1e6".to_string()),
        Just("'a'".to_string()),
        Just("1i".to_string()),
        // A uint8 (ranges like an int in Go 1.22+).
        Just("(index \"ab\" 0)".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("nil".to_string()),
    ]
    .boxed()
}

/// A function call or an operand, possibly parenthesised.
pub(crate) fn command(depth: u32) -> BoxedStrategy<String> {
    let arg = if depth == 0 {
        operand()
    } else {
        prop_oneof![3 => operand(), 1 => command(depth - 1).prop_map(|c| format!("({c})"))].boxed()
    };
    let a = arg.clone();
    prop_oneof![
        3 => arg.clone(),
        2 => (prop_oneof![Just("eq"), Just("ne"), Just("lt"), Just("le"), Just("gt"), Just("ge")], a.clone(), a.clone())
            .prop_map(|(f, x, y)| format!("{f} {x} {y}")),
        1 => (a.clone(), a.clone(), a.clone()).prop_map(|(x, y, z)| format!("eq {x} {y} {z}")),
        2 => (prop_oneof![Just("and"), Just("or")], a.clone(), a.clone())
            .prop_map(|(f, x, y)| format!("{f} {x} {y}")),
        1 => a.clone().prop_map(|x| format!("not {x}")),
        1 => a.clone().prop_map(|x| format!("len {x}")),
        2 => (a.clone(), a.clone()).prop_map(|(x, y)| format!("index {x} {y}")),
        1 => (a.clone(), a.clone()).prop_map(|(x, y)| format!("slice {x} {y}")),
        1 => (a.clone(), a.clone()).prop_map(|(x, y)| format!("call {x} {y}")),
        1 => (a.clone(), a.clone()).prop_map(|(x, y)| format!("print {x} {y}")),
        1 => a.clone().prop_map(|x| format!("println {x}")),
        2 => (prop_oneof![Just("html"), Just("urlquery"), Just("js")], prop::collection::vec(a.clone(), 0..3))
            .prop_map(|(f, xs)| format!("{f} {}", xs.join(" "))),
        2 => (prop_oneof![
                Just("\"%s\""), Just("\"%v-%d\""), Just("\"%q %%\""), Just("\"<%s|%v>\""),
            ], prop::collection::vec(a.clone(), 0..3))
            .prop_map(|(f, xs)| format!("printf {f} {}", xs.join(" "))),
    ]
    .boxed()
}

/// A pipeline: a command, maybe piped into functions that take the value as last argument.
fn pipeline() -> BoxedStrategy<String> {
    (
        command(1),
        prop::collection::vec(
            prop_oneof![
                Just("len".to_string()),
                Just("not".to_string()),
                Just("print".to_string()),
                Just("printf \"[%v]\"".to_string()),
                Just("eq \"a\"".to_string()),
                Just("index .Vars".to_string()),
                Just("html".to_string()),
                Just("urlquery".to_string()),
                Just("js".to_string()),
            ],
            0..2,
        ),
    )
        .prop_map(|(c, pipes)| {
            let mut p = c;
            for f in pipes {
                p = format!("{p} | {f}");
            }
            p
        })
        .boxed()
}

fn action() -> BoxedStrategy<String> {
    (
        prop_oneof![Just("{{"), Just("{{ "), Just("{{- ")],
        pipeline(),
        prop_oneof![Just("}}"), Just(" }}"), Just(" -}}")],
    )
        .prop_map(|(l, p, r)| format!("{l}{p}{r}"))
        .boxed()
}

/// Statements: text, actions, comments, if/else if/else, with/else, range (with variables and
/// else), declarations and assignments.
pub(crate) fn statements(depth: u32) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        3 => text(),
        4 => action(),
        1 => Just("{{/* a comment */}}".to_string()),
        1 => Just("x {{- /* trimmed */ -}} y".to_string()),
        1 => operand().prop_map(|o| format!("{{{{ $v = {o} }}}}")),
        // Outside a range these are parse errors, inside they stop or skip an iteration.
        1 => prop_oneof![Just("{{break}}".to_string()), Just("{{continue}}".to_string())],
        1 => (prop_oneof![Just("a"), Just("b"), Just("nope")], prop::option::of(operand()))
            .prop_map(|(n, o)| match o {
                Some(o) => format!("{{{{template \"{n}\" {o}}}}}"),
                None => format!("{{{{template \"{n}\"}}}}"),
            }),
    ]
    .boxed();
    if depth == 0 {
        return prop::collection::vec(leaf, 0..4)
            .prop_map(|v| v.concat())
            .boxed();
    }
    let inner = statements(depth - 1);
    let block = prop_oneof![
        3 => leaf,
        1 => (pipeline(), inner.clone(), prop::option::of((pipeline(), inner.clone())), prop::option::of(inner.clone()))
            .prop_map(|(c, body, elif, other)| {
                let mut s = format!("{{{{if {c}}}}}{body}");
                if let Some((c2, b2)) = elif {
                    s.push_str(&format!("{{{{else if {c2}}}}}{b2}"));
                }
                if let Some(o) = other {
                    s.push_str(&format!("{{{{else}}}}{o}"));
                }
                s + "{{end}}"
            }),
        1 => (pipeline(), inner.clone(), prop::option::of(inner.clone()))
            .prop_map(|(c, body, other)| match other {
                Some(o) => format!("{{{{with {c}}}}}{body}{{{{else}}}}{o}{{{{end}}}}"),
                None => format!("{{{{with {c}}}}}{body}{{{{end}}}}"),
            }),
        1 => (prop_oneof![Just(""), Just("$x := "), Just("$k, $x := ")], operand(), inner.clone(), prop::option::of(inner))
            .prop_map(|(decl, c, body, other)| match other {
                Some(o) => format!("{{{{range {decl}{c}}}}}{body}{{{{else}}}}{o}{{{{end}}}}"),
                None => format!("{{{{range {decl}{c}}}}}{body}{{{{end}}}}"),
            }),
    ];
    prop::collection::vec(block, 0..4)
        .prop_map(|v| v.concat())
        .boxed()
}

/// `define`s and `block`s (of templates `a` and `b`, some empty, some twice) around the body.
fn definitions() -> impl Strategy<Value = String> {
    let def = (
        prop_oneof![Just("a"), Just("b")],
        prop_oneof![Just("define"), Just("block")],
        prop_oneof![
            2 => statements(1),
            1 => Just(" \n ".to_string()),
        ],
        operand(),
    )
        .prop_map(|(name, kw, body, arg)| {
            // No calls inside definitions: a template calling itself recurses to Go's depth
            // limit of 100,000, which takes Go minutes (kpssh stops at 200, see exec.rs).
            let body = body.replace("{{template \"", "{{print \"");
            if kw == "block" {
                format!("{{{{block \"{name}\" {arg}}}}}{body}{{{{end}}}}")
            } else {
                format!("{{{{define \"{name}\"}}}}{body}{{{{end}}}}")
            }
        });
    prop::collection::vec(def, 0..3).prop_map(|v| v.concat())
}

/// A whole template: `$v` declared first (so that it is defined everywhere), then definitions
/// and statements; now and then a stray `{{end}}`, `{{else}}` or an unclosed action.
fn template_src() -> impl Strategy<Value = String> {
    (
        operand(),
        (definitions(), statements(2)).prop_map(|(d, s)| d + &s),
        prop_oneof![
            8 => Just(""),
            1 => Just("{{end}}"),
            1 => Just("{{else}}"),
            1 => Just("{{ .NodeName"),
            1 => Just("{{ if true }}"),
        ],
    )
        .prop_map(|(v, body, tail)| format!("{{{{ $v := {v} }}}}{body}{tail}"))
}

#[derive(Debug, Clone)]
pub(crate) struct Data {
    pub(crate) fields: [String; 9],
    pub(crate) vars: Option<BTreeMap<String, String>>,
    pub(crate) secrets: Option<BTreeMap<String, String>>,
}

pub(crate) fn data() -> impl Strategy<Value = Data> {
    let s = || {
        prop_oneof![
            Just(String::new()),
            Just("0".to_string()),
            Just("a".to_string()),
            Just("b c".to_string()),
            Just("<&>".to_string()),
            Just("ü\"\\".to_string()),
        ]
    };
    let map = |keys: &'static [&'static str]| {
        prop::option::of(prop::collection::btree_map(
            prop::sample::select(keys).prop_map(str::to_string),
            prop_oneof![
                Just(String::new()),
                Just("0".to_string()),
                Just("a".to_string()),
                Just("b c".to_string()),
                Just("<&>".to_string()),
            ],
            0..3,
        ))
    };
    (
        prop::array::uniform9(s()),
        map(&["k1", "k2", "a-b"]),
        map(&["s1", "s2"]),
    )
        .prop_map(|(fields, vars, secrets)| Data {
            fields,
            vars,
            secrets,
        })
}

impl Data {
    pub(crate) fn go(&self) -> serde_json::Value {
        let f = &self.fields;
        json!({
            "ClusterEndpoint": f[0], "ClusterCACert": f[1], "BootstrapToken": f[2],
            "NodeName": f[3], "ProviderID": f[4], "NodeLabels": f[5],
            "RegisterWithTaints": f[6], "HostAddress": f[7], "NodeAddress": f[8],
            "Vars": self.vars, "Secrets": self.secrets,
        })
    }

    fn ours(&self) -> ContextData {
        let f = self.fields.clone();
        ContextData {
            cluster_endpoint: f[0].clone(),
            cluster_ca_cert: f[1].clone(),
            bootstrap_token: Secret::new(f[2].clone()),
            node_name: f[3].clone(),
            provider_id: f[4].clone(),
            node_labels: f[5].clone(),
            register_with_taints: f[6].clone(),
            host_address: f[7].clone(),
            node_address: f[8].clone(),
            vars: self.vars.clone(),
            secrets: self.secrets.as_ref().map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), Secret::new(v.clone())))
                    .collect()
            }),
        }
    }
}

/// Compares one template on one data set; `Err` describes the difference.
pub(crate) fn compare(go: &Answer, src: &str, data: &Data) -> Result<(), String> {
    let parsed = Template::parse(src);
    let t = match (&go.parse_error, parsed) {
        (Some(_), Err(e)) => {
            return (e.line > 0 && !e.msg.is_empty())
                .then_some(())
                .ok_or_else(|| format!("kpssh's parse error has no position: {e}"));
        }
        (Some(g), Ok(_)) => return Err(format!("Go rejects at parse ({g}), kpssh accepts")),
        (None, Err(e)) => return Err(format!("Go parses, kpssh rejects: {e}")),
        (None, Ok(t)) => t,
    };
    let ours = t.render(&data.ours().into_value());
    match (&go.exec_error, &go.output, ours) {
        (Some(_), _, Err(e)) if e.line > 0 => {}
        (Some(_), _, Err(e)) => return Err(format!("kpssh's render error has no position: {e}")),
        (Some(g), _, Ok(out)) => {
            return Err(format!(
                "Go fails ({g}), kpssh renders {:?}",
                String::from_utf8_lossy(&out)
            ));
        }
        (None, Some(b64), Ok(out)) => {
            let want = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| e.to_string())?;
            if out != want {
                return Err(format!(
                    "output differs:\n  go:    {:?}\n  kpssh: {:?}",
                    String::from_utf8_lossy(&want),
                    String::from_utf8_lossy(&out)
                ));
            }
        }
        (None, _, Err(e)) => return Err(format!("Go renders, kpssh fails: {e}")),
        (None, None, Ok(_)) => return Err("the oracle gave neither output nor error".into()),
    }
    let empty = t.render(&ContextData::default().into_value());
    match (&go.empty_error, empty) {
        (Some(_), Err(_)) | (None, Ok(_)) => Ok(()),
        (Some(g), Ok(_)) => Err(format!("leave rule: Go rejects ({g}), kpssh accepts")),
        (None, Err(e)) => Err(format!("leave rule: Go accepts, kpssh rejects: {e}")),
    }
}

#[test]
fn s61_templates_render_as_go_text_template() {
    let oracle = Mutex::new(Oracle::start("template"));
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    proptest!(config, |(src in template_src(), data in data())| {
        let go: Answer = oracle
            .lock()
            .unwrap()
            .ask(&json!({"src": src, "data": data.go()}));
        if let Err(diff) = compare(&go, &src, &data) {
            prop_assert!(false, "{diff}\n  template: {src:?}\n  data: {data:?}\n  go: {go:?}");
        }
    });
}

/// `html` and `urlquery` on arbitrary text (NUL, quotes, `<>&`, spaces, `+%/~`, non-ASCII) and
/// on mixed arguments (nil, numbers, several strings), against Go's escapers.
#[test]
fn s61_html_and_urlquery_escape_as_go() {
    let oracle = Mutex::new(Oracle::start("template"));
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    let text = || "[\\x00 a-zA-Z0-9<>&'\"+%/~.?=é\u{2028}\u{fffd}-]{0,12}";
    let src = "{{html .NodeName}}|{{urlquery .NodeName}}|{{html .NodeName .HostAddress 1 nil}}|\
               {{urlquery 1 2 .HostAddress nil}}|{{.HostAddress | html}}|{{.NodeName | urlquery}}|\
               {{html}}{{urlquery}}|{{html .Vars.k1}}|{{urlquery .Secrets.s1 .Vars}}";
    proptest!(config, |(name in text(), host in text(), k1 in text(), s1 in text())| {
        let mut fields: [String; 9] = Default::default();
        fields[3] = name;
        fields[7] = host;
        let data = Data {
            fields,
            vars: Some(BTreeMap::from([("k1".to_string(), k1)])),
            secrets: Some(BTreeMap::from([("s1".to_string(), s1)])),
        };
        let go: Answer = oracle
            .lock()
            .unwrap()
            .ask(&json!({"src": src, "data": data.go()}));
        prop_assert!(go.output.is_some(), "Go renders: {go:?}");
        if let Err(diff) = compare(&go, src, &data) {
            prop_assert!(false, "{diff}\n  data: {data:?}");
        }
    });
}

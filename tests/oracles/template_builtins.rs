//! S61, one property per construct that kpssh's template engine added after the first oracle
//! run: `call`, number and character constants, `js`, `slice`. Every case holds the construct
//! (in several positions: as a command, an argument, after a pipe, in branches that do and do
//! not run) and is compared with Go's `text/template` as in `templates.rs`: the same
//! accept/reject at parse time, at render time and for the leave rule, byte-identical output.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use serde_json::json;

use crate::support::{Oracle, cases};
use crate::templates::{Answer, compare, data, operand, text};

/// Runs `src` (a strategy of template texts) against the oracle, `cases()` times, and checks
/// that Go both rendered and rejected some of them (else the generator tests nothing).
fn against_go(what: &str, src: BoxedStrategy<String>) {
    let oracle = Mutex::new(Oracle::start("template"));
    let tally = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    proptest!(config, |(src in src, data in data())| {
        let go: Answer = oracle
            .lock()
            .unwrap()
            .ask(&json!({"src": src, "data": data.go()}));
        let outcome = match (&go.parse_error, &go.exec_error) {
            (Some(_), _) => 0,
            (None, Some(_)) => 1,
            (None, None) => 2,
        };
        tally[outcome].fetch_add(1, Ordering::Relaxed);
        if let Err(diff) = compare(&go, &src, &data) {
            prop_assert!(false, "{diff}\n  template: {src:?}\n  data: {data:?}\n  go: {go:?}");
        }
    });
    let [parse, exec, ok] = tally.map(|t| t.into_inner());
    eprintln!(
        "{what}: {} cases, 0 differences (Go: {parse} parse errors, {exec} exec errors, {ok} rendered)",
        parse + exec + ok
    );
    assert!(
        ok > 0 && parse + exec > 0,
        "{what}: Go rendered {ok} and rejected {} cases",
        parse + exec
    );
}

/// Wraps one construct (a function name and argument strategy) into the positions a template
/// can hold it: a command, a parenthesised argument, after a pipe, under `if`, `with`, `range`
/// (run or not), `and`/`or` (short-circuited or not), a `define` never called.
fn positions(call: BoxedStrategy<String>, arg: BoxedStrategy<String>) -> BoxedStrategy<String> {
    let one = prop_oneof![
        4 => call.clone().prop_map(|c| format!("{{{{{c}}}}}")),
        2 => call.clone().prop_map(|c| format!("{{{{print ({c}) \"|\"}}}}")),
        2 => (arg.clone(), call.clone()).prop_map(|(a, c)| format!("{{{{{a} | {c}}}}}")),
        1 => (arg.clone(), call.clone()).prop_map(|(a, c)| format!("{{{{if {a}}}}}{{{{{c}}}}}{{{{end}}}}")),
        1 => (arg.clone(), call.clone()).prop_map(|(a, c)| format!("{{{{with {a}}}}}{{{{{c}}}}}{{{{else}}}}e{{{{end}}}}")),
        1 => (arg.clone(), call.clone()).prop_map(|(a, c)| format!("{{{{range $i, $x := {a}}}}}{{{{{c}}}}}{{{{end}}}}")),
        1 => (prop_oneof![Just("and"), Just("or")], arg.clone(), call.clone())
            .prop_map(|(f, a, c)| format!("{{{{{f} {a} ({c})}}}}")),
        1 => call.clone().prop_map(|c| format!("{{{{define \"unused\"}}}}{{{{{c}}}}}{{{{end}}}}")),
        1 => call.prop_map(|c| format!("{{{{$v = {c}}}}}{{{{$v}}}}")),
    ];
    (operand(), prop::collection::vec((text(), one), 1..4))
        .prop_map(|(v, parts)| {
            let body: String = parts.into_iter().map(|(t, p)| t + &p).collect();
            format!("{{{{ $v := {v} }}}}{body}")
        })
        .boxed()
}

/// `call`: the data holds no func values, so every `call` that runs fails (Go: "call of nil",
/// "non-function … of type …", "wrong number of args"); one that does not run is fine.
#[test]
fn s61_call_fails_where_go_fails() {
    let arg = operand();
    let call = prop_oneof![
        1 => Just("call".to_string()),
        3 => arg.clone().prop_map(|a| format!("call {a}")),
        2 => (arg.clone(), arg.clone()).prop_map(|(a, b)| format!("call {a} {b}")),
        1 => arg.clone().prop_map(|a| format!("print call {a}")),
    ]
    .boxed();
    against_go("call", positions(call, arg));
}

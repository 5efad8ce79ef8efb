//! S61, one property per construct that kpssh's template engine added after the first oracle
//! run: `call`, number and character constants, `js`, `slice`. Every case holds the construct
//! (in several positions: as a command, an argument, after a pipe, in branches that do and do
//! not run) and is compared with Go's `text/template` as in `templates.rs`: the same
//! accept/reject at parse time, at render time and for the leave rule, byte-identical output.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use serde_json::json;

use crate::support::{Oracle, cases};
use crate::templates::{Answer, Data, compare, data, operand, text};

/// Runs `src` (a strategy of template texts) against the oracle on generated data,
/// `cases()` times (see [`against_go_with`]).
fn against_go(what: &str, src: BoxedStrategy<String>) {
    against_go_with(what, (src, data()).boxed());
}

/// Runs `cases` (template text and data) against the oracle, `cases()` times, and checks that
/// Go both rendered and rejected some of them (else the generator tests nothing).
fn against_go_with(what: &str, cases_of: BoxedStrategy<(String, Data)>) {
    let oracle = Mutex::new(Oracle::start("template"));
    let tally = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    proptest!(config, |((src, data) in cases_of)| {
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
        "{what}: {} cases, 0 differences (Go: {parse} parse errors, {exec} exec errors, {ok} \
         rendered)",
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

/// Number constants as Go's lexer and `strconv` see them: signs, base prefixes, digits with
/// underscores, points, exponents (`e` and hex `p`), imaginary `i` and complex `a+bi`, huge
/// ones (uint64 only, past uint64, past float64), and random runs of number characters.
fn number() -> BoxedStrategy<String> {
    let digits = |set: &'static str| {
        proptest::string::string_regex(&format!("[{set}]{{0,4}}")).expect("a valid regex")
    };
    let structured = (
        prop_oneof![4 => Just(""), 1 => Just("-"), 1 => Just("+")],
        prop_oneof![
            6 => (Just(""), digits("0-9")),
            1 => (Just("0"), digits("0-9_")),
            1 => (Just("0x"), digits("0-9a-fA-F_")),
            1 => (Just("0X"), digits("0-9a-f")),
            1 => (Just("0b"), digits("01_")),
            1 => (Just("0o"), digits("0-7_")),
        ],
        prop::option::of(digits("0-9")),
        prop_oneof![
            4 => Just(String::new()),
            1 => (prop_oneof![Just("e"), Just("E"), Just("p"), Just("P")], prop_oneof![Just(""), Just("-"), Just("+")], digits("0-9_"))
                .prop_map(|(e, s, d)| format!("{e}{s}{d}")),
        ],
        prop_oneof![6 => Just(""), 1 => Just("i")],
    )
        .prop_map(|(sign, (prefix, int), frac, exp, imag)| {
            let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
            let n = format!("{sign}{prefix}{int}{frac}{exp}{imag}");
            // Not `.` or `.e5`: those are the dot and a field, not numbers.
            if n.is_empty() || (n.starts_with('.') && !n[1..].starts_with(|c: char| c.is_ascii_digit())) {
                format!("0{n}")
            } else {
                n
            }
        })
        .boxed();
    let literal = prop_oneof![
        Just("0"),
        Just("1"),
        Just("-1"),
        Just("1.5"),
        Just("-0.0"),
        Just("1e6"),
        Just("1e21"),
        Just("123456.7"),
        Just("0.0001"),
        Just("0.00001"),
        Just("1e-400"),
        Just("1e400"),
        Just("0x1p-2"),
        Just("0x1.8p1"),
        Just("-0x1E"),
        Just("0x1E"),
        Just("017"),
        Just("08"),
        Just("08.5"),
        Just("1_000"),
        Just("1__0"),
        Just("1_"),
        Just("9223372036854775807"),
        Just("9223372036854775808"),
        Just("-9223372036854775808"),
        Just("18446744073709551615"),
        Just("18446744073709551616"),
        Just("0x8000000000000000"),
        Just("1.7976931348623157e308"),
        Just("5e-324"),
        Just("0x1p-1074"),
        Just("1i"),
        Just("-0i"),
        Just("1+2i"),
        Just("1-0i"),
        Just("1.5e3-2.5e-3i"),
        Just("0x10+1i"),
        Just(".5"),
        Just("-.5"),
        Just("1."),
        Just("+"),
        Just("2.5e+00"),
        Just("100000"),
        Just("1000000.0"),
        Just("0.1"),
        Just("3.14159"),
    ]
    .prop_map(str::to_string);
    let complex = (
        structured.clone(),
        prop_oneof![Just("+"), Just("-")],
        structured.clone(),
    )
        .prop_map(|(a, s, b)| format!("{a}{s}{}i", b.trim_start_matches(['+', '-'])));
    let random =
        proptest::string::string_regex("([0-9+-]|\\.[0-9])[0-9a-fA-FxXoObBpPeEi_.+-]{0,6}")
            .expect("a valid regex");
    prop_oneof![5 => structured, 8 => literal, 1 => complex, 1 => random].boxed()
}

/// Character constants: plain, multi-byte, every escape form (valid, out of range, malformed),
/// empty, two characters, unterminated.
fn character() -> BoxedStrategy<String> {
    let body = prop_oneof![
        Just("a"),
        Just("é"),
        Just("b"),
        Just("\\n"),
        Just("\\x41"),
        Just("日"),
        Just("Z"),
        Just("é"),
        Just("日"),
        Just("😀"),
        Just(" "),
        Just("\""),
        Just("'"),
        Just("\\a"),
        Just("\\b"),
        Just("\\f"),
        Just("\\n"),
        Just("\\r"),
        Just("\\t"),
        Just("\\v"),
        Just("\\\\"),
        Just("\\'"),
        Just("\\\""),
        Just("\\x41"),
        Just("\\xff"),
        Just("\\xg1"),
        Just("\\x4"),
        Just("\\101"),
        Just("\\377"),
        Just("\\400"),
        Just("\\18"),
        Just("\\u00e9"),
        Just("\\ud800"),
        Just("\\U0001F600"),
        Just("\\U00110000"),
        Just("\\q"),
        Just(""),
        Just("ab"),
        Just("\\"),
    ];
    (body, prop_oneof![8 => Just("'"), 1 => Just("")])
        .prop_map(|(b, close)| format!("'{b}{close}"))
        .boxed()
}

/// Commands that use a constant: printed, formatted, compared, tested, ranged over, indexed.
fn with_constant(c: BoxedStrategy<String>) -> BoxedStrategy<String> {
    let other = prop_oneof![2 => c.clone(), 1 => operand()];
    prop_oneof![
        4 => c.clone(),
        2 => c.clone().prop_map(|x| format!("printf \"%v %T|%d|%s|%q\" {x} {x} {x} {x} {x}")),
        2 => c.clone().prop_map(|x| format!("printf \"%e|%E|%f|%.2f|%g|%G|%.3g|%+v|%8.3f|%-6v|\" {x} {x} {x} {x} {x} {x} {x} {x} {x} {x}")),
        1 => c.clone().prop_map(|x| format!("printf \"%x|%X|%b|%.1x|%.0X|%+x\" {x} {x} {x} {x} {x} {x}")),
        1 => (c.clone(), other.clone()).prop_map(|(x, y)| format!("print {x} {y}")),
        2 => (prop_oneof![Just("eq"), Just("ne"), Just("lt"), Just("le"), Just("gt"), Just("ge")], c.clone(), other)
            .prop_map(|(f, x, y)| format!("{f} {x} {y}")),
        1 => c.clone().prop_map(|x| format!("not {x}")),
        1 => c.clone().prop_map(|x| format!("len {x}")),
        1 => c.clone().prop_map(|x| format!("index .Vars {x}")),
        1 => c.clone().prop_map(|x| format!("html {x} \"|\" {x}")),
        1 => c.clone().prop_map(|x| format!("{x}.x")),
        1 => c.prop_map(|x| format!("and {x} \"a\"")),
    ]
    .boxed()
}

/// Numbers: Go's lexer, `newNumber` and `idealConstant` (int, float64, complex128, the
/// overflow that fails only when it runs) and `fmt`'s float formats.
#[test]
fn s61_number_constants_as_go() {
    let n = number();
    against_go("numbers", positions(with_constant(n.clone()), n));
}

/// Character constants: `strconv.UnquoteChar`'s escapes; the value is an int.
#[test]
fn s61_character_constants_as_go() {
    let c = character();
    against_go("characters", positions(with_constant(c.clone()), c));
}

/// `js` on arbitrary text — every control character, `\` `'` `"` `<` `>` `&` `=`, printable and
/// non-printable runes past ASCII (NBSP, soft hyphen, U+2028, BOM, unassigned, private use,
/// astral) — and on mixed arguments (nil, numbers, several strings), against Go's `JSEscape`.
#[test]
fn s61_js_escapes_as_go() {
    let text = || {
        proptest::string::string_regex(
            "([\\x00-\\x1f\\x7f a-z0-9<>&='\"\\\\/+%.-]|é|日|😀|\u{85}|\u{a0}|\u{ad}|\u{2028}|\u{feff}|\u{378}|\u{e000}|\u{1ffff}|\u{10ffff}|\u{fffd}){0,10}",
        )
        .expect("a valid regex")
    };
    let src = prop_oneof![
        3 => Just("{{js .NodeName}}|{{js .NodeName .HostAddress 1 nil}}|{{.HostAddress | js}}|{{js}}|\
              {{js .Vars.k1 \"<=>\"}}|{{js (print .NodeName 1.5)}}|{{js .Secrets.s1 .Vars}}|\
              {{js 'a' 1i true}}"),
        3 => Just("{{printf \"%q\" .NodeName}}|{{printf \"%q\" (js .HostAddress)}}|\
              {{html (js .Vars.k1)}}|{{urlquery (js .NodeName)}}"),
        1 => Just("{{js .NodeName}}|{{js .Vars.nope}}"),
        1 => Just("{{js .NodeName}}|{{js .Nope}}"),
    ]
    .prop_map(str::to_string);
    let case = (src, text(), text(), text(), text()).prop_map(|(src, name, host, k1, s1)| {
        let mut fields: [String; 9] = Default::default();
        fields[3] = name;
        fields[7] = host;
        let data = Data {
            fields,
            vars: Some(BTreeMap::from([("k1".to_string(), k1)])),
            secrets: Some(BTreeMap::from([("s1".to_string(), s1)])),
        };
        (src, data)
    });
    against_go_with("js", case.boxed());
}

/// `slice` on strings (ASCII and multi-byte, cut inside a character too), secrets, maps, the
/// data, nil and numbers, with zero to four indexes (ints in and out of range, negative, nil,
/// floats, characters, strings, computed), its result printed, quoted, measured, indexed,
/// compared, escaped and sliced again.
#[test]
fn s61_slice_as_go() {
    let item = prop_oneof![
        1 => operand(),
        4 => prop_oneof![
            Just("\"é日😀x\""), Just("\"abcdef\""), Just("\"ü\""), Just(".Secrets.s1"),
            Just(".NodeName"), Just("(print .HostAddress \"é\")"),
        ]
        .prop_map(str::to_string),
    ]
    .boxed();
    let index = prop_oneof![
        12 => (0..4i32).prop_map(|i| i.to_string()),
        2 => (4..8i32).prop_map(|i| i.to_string()),
        1 => prop_oneof![
            Just("-1"), Just("9223372036854775807"), Just("nil"), Just("1.0"), Just("'a'"),
            Just("\"1\""), Just("(len .NodeName)"), Just("(index \"ab\" 0)"), Just(".NodeName"),
            Just("$v"),
        ]
        .prop_map(str::to_string),
    ];
    let count = prop_oneof![4 => 0..3usize, 1 => 3..5usize];
    let slice = (
        item.clone(),
        count.prop_flat_map(move |n| prop::collection::vec(index.clone(), n)),
    )
        .prop_map(|(x, idx)| format!("slice {x} {}", idx.join(" ")))
        .boxed();
    let used = prop_oneof![
        4 => slice.clone(),
        1 => slice.clone().prop_map(|s| format!("printf \"%q|%x|%5s|%.1s|%v\" ({s}) ({s}) ({s}) ({s}) ({s})")),
        1 => slice.clone().prop_map(|s| format!("len ({s})")),
        1 => slice.clone().prop_map(|s| format!("index ({s}) 0")),
        1 => slice.clone().prop_map(|s| format!("eq ({s}) \"bc\" \"\"")),
        1 => (prop_oneof![Just("js"), Just("html"), Just("urlquery"), Just("print")], slice.clone())
            .prop_map(|(f, s)| format!("{f} ({s})")),
        1 => slice.clone().prop_map(|s| format!("slice ({s}) 1")),
        1 => slice.clone().prop_map(|s| format!("index .Vars ({s})")),
        1 => slice.prop_map(|s| format!("if ({s})}}}}t{{{{else}}}}f{{{{end")),
    ]
    .boxed();
    against_go("slice", positions(used, item));
}

//! Unit tests of the template engine.

use super::*;
use crate::secret::Secret;
use std::collections::BTreeMap;

/// The Go provider's context, plus a list (which no profile data holds, but the engine
/// ranges over and indexes like Go slices).
fn root() -> Value {
    let data = ContextData {
        node_name: "node-a".into(),
        vars: Some(BTreeMap::from([
            ("clusterName".to_string(), "prod".to_string()),
            ("region".to_string(), "eu-west-1".to_string()),
            ("empty".to_string(), String::new()),
        ])),
        secrets: Some(BTreeMap::from([(
            "activationCode".to_string(),
            Secret::new("s3cret-activation"),
        )])),
        ..Default::default()
    };
    let Value::Root(mut fields) = data.into_value() else {
        unreachable!()
    };
    fields.push((
        "List".to_string(),
        Value::List(vec![Value::from("x"), Value::from("y")]),
    ));
    Value::Root(fields)
}

fn render(src: &str) -> Result<String, TemplateError> {
    let t = Template::parse(src)?;
    let out = t.render(&root())?;
    Ok(String::from_utf8(out).unwrap())
}

fn render_bytes(src: &str) -> Vec<u8> {
    Template::parse(src).unwrap().render(&root()).unwrap()
}

fn err(src: &str) -> TemplateError {
    match render(src) {
        Ok(s) => panic!("expected an error for {src:?}, got {s:?}"),
        Err(e) => e,
    }
}

#[test]
fn plain_text_passes_through_byte_for_byte() {
    let s = "#!/bin/bash\necho \"${KPSSH_NODE_NAME}\" } { }\n";
    assert_eq!(render(s).unwrap(), s);
}

#[test]
fn fields_vars_and_secrets() {
    assert_eq!(
        render("{{ .NodeName }}/{{.Vars.clusterName}}/{{ .Secrets.activationCode }}").unwrap(),
        "node-a/prod/s3cret-activation"
    );
}

#[test]
fn trim_markers() {
    assert_eq!(
        render("a  \n {{- .NodeName -}} \n\t b").unwrap(),
        "anode-ab"
    );
    assert_eq!(render("a {{- .NodeName}} b").unwrap(), "anode-a b");
    // `{{-3}}` is the number -3, not a trim marker.
    assert_eq!(render("a {{-3}}").unwrap(), "a -3");
}

#[test]
fn comments() {
    assert_eq!(render("a{{/* hidden }} */}}b").unwrap(), "ab");
    assert_eq!(render("a \n{{- /* x */ -}}\n b").unwrap(), "ab");
    assert!(err("a{{/* open").msg.contains("unclosed comment"));
}

#[test]
fn if_else_if_else() {
    let t = "{{ if eq .Vars.region \"us\" }}US{{ else if eq .Vars.region \"eu-west-1\" }}EU{{ else }}?{{ end }}";
    assert_eq!(render(t).unwrap(), "EU");
    assert_eq!(
        render("{{if .ProviderID}}p{{else}}adopt{{end}}").unwrap(),
        "adopt"
    );
    assert_eq!(render("{{if .Vars.empty}}y{{end}}").unwrap(), "");
}

#[test]
fn with_rebinds_dot() {
    assert_eq!(
        render("{{ with .Vars }}{{ .region }}{{ end }}").unwrap(),
        "eu-west-1"
    );
    assert_eq!(
        render("{{ with .ProviderID }}{{.}}{{ else }}none{{ end }}").unwrap(),
        "none"
    );
    assert_eq!(
        render("{{ with $r := .Vars.region }}{{ $r }}{{ end }}").unwrap(),
        "eu-west-1"
    );
    assert_eq!(
        render("{{ with .ProviderID }}a{{ else with .NodeName }}{{ . }}{{ end }}").unwrap(),
        "node-a"
    );
}

#[test]
fn range_over_maps_sorted_and_lists() {
    assert_eq!(
        render("{{ range $k, $v := .Vars }}{{ $k }}={{ $v }};{{ end }}").unwrap(),
        "clusterName=prod;empty=;region=eu-west-1;"
    );
    assert_eq!(
        render("{{ range .List }}<{{ . }}>{{ end }}").unwrap(),
        "<x><y>"
    );
    assert_eq!(
        render("{{ range $i, $v := .List }}{{ $i }}{{ $v }}{{ end }}").unwrap(),
        "0x1y"
    );
    assert!(render("{{ range .ProviderID }}x{{ end }}").is_err());
    assert!(render("{{ range .Secrets.none }}{{ end }}").is_err());
    // Like Go: nil is not a command.
    assert!(render("{{ range nil }}x{{ end }}").is_err());
}

#[test]
fn range_else_on_empty() {
    let t = Template::parse("{{ range .Vars }}x{{ else }}none{{ end }}").unwrap();
    assert_eq!(
        t.render(&ContextData::default().into_value()).unwrap(),
        b"none"
    );
}

#[test]
fn functions() {
    assert_eq!(render("{{ not .ProviderID }}").unwrap(), "true");
    assert_eq!(
        render("{{ and .NodeName .Vars.region }}").unwrap(),
        "eu-west-1"
    );
    assert_eq!(render("{{ or .ProviderID .NodeName }}").unwrap(), "node-a");
    assert_eq!(
        render("{{ len .Vars }}/{{ len .NodeName }}").unwrap(),
        "3/6"
    );
    assert_eq!(render("{{ ne .NodeName \"x\" }}").unwrap(), "true");
    assert_eq!(
        render("{{ eq .NodeName \"x\" \"node-a\" }}").unwrap(),
        "true"
    );
    assert_eq!(
        render("{{ lt 1 2 }}{{ ge \"b\" \"a\" }}").unwrap(),
        "truetrue"
    );
    assert_eq!(render("{{ index .Vars \"region\" }}").unwrap(), "eu-west-1");
    assert_eq!(render("{{ index .List 1 }}").unwrap(), "y");
    assert_eq!(
        render("{{ printf \"%s-%d-%q %%\" .NodeName 7 \"a\\\"b\" }}").unwrap(),
        "node-a-7-\"a\\\"b\" %"
    );
    assert_eq!(render("{{ print \"a\" 1 2 \"b\" }}").unwrap(), "a1 2b");
    assert_eq!(
        render("{{ .NodeName | printf \"<%s>\" }}").unwrap(),
        "<node-a>"
    );
    assert_eq!(
        render("{{ .NodeName | len | printf \"%d\" }}").unwrap(),
        "6"
    );
    assert_eq!(render("{{ (index .Vars \"region\") | len }}").unwrap(), "9");
}

#[test]
fn and_or_short_circuit() {
    // The second operand would fail; it is never evaluated.
    assert_eq!(render("{{ and .ProviderID .Vars.missing }}").unwrap(), "");
    assert_eq!(
        render("{{ or .NodeName .Vars.missing }}").unwrap(),
        "node-a"
    );
}

#[test]
fn variables() {
    assert_eq!(render("{{ $x := .NodeName }}{{ $x }}").unwrap(), "node-a");
    assert_eq!(
        render("{{ $x := \"a\" }}{{ if true }}{{ $x = \"b\" }}{{ end }}{{ $x }}").unwrap(),
        "b"
    );
    assert_eq!(render("{{ $.NodeName }}").unwrap(), "node-a");
    assert_eq!(
        render("{{ range .List }}{{ $.NodeName }}{{ end }}").unwrap(),
        "node-anode-a"
    );
    let e = err("{{ if true }}{{ $x := 1 }}{{ end }}{{ $x }}");
    assert!(e.msg.contains("undefined variable"), "{e}");
}

#[test]
fn unknown_keys_are_errors_with_position() {
    let e = err("line1\n  {{ .Nope }}");
    assert_eq!((e.line, e.col), (2, 6));
    assert!(e.msg.contains("Nope"));
    let e = err("{{ .Vars.missing }}");
    assert!(
        e.msg.contains("map has no entry for key \"missing\""),
        "{e}"
    );
    let e = err("{{ .NodeName.x }}");
    assert!(e.msg.contains("can't evaluate field x"), "{e}");
}

#[test]
fn unknown_functions_and_parse_errors_have_positions() {
    let e = Template::parse("ab\ncd {{ quote .NodeName }}").unwrap_err();
    assert_eq!((e.line, e.col), (2, 7));
    assert!(e.msg.contains("function \"quote\" not defined"), "{e}");
    assert!(Template::parse("{{ default \"x\" .A }}").is_err());
    assert!(
        Template::parse("{{ if .A }}")
            .unwrap_err()
            .msg
            .contains("without end")
    );
    assert!(Template::parse("{{ end }}").is_err());
    assert!(Template::parse("{{ else }}").is_err());
    assert!(
        Template::parse("{{ .A ")
            .unwrap_err()
            .msg
            .contains("unclosed action")
    );
    assert!(Template::parse("{{ \"abc }}").is_err());
    assert!(Template::parse("{{ }}").is_err());
    assert!(Template::parse("{{ .A | | len }}").is_err());
    // As Go: a trailing pipe is allowed, a constant after a pipe is not.
    assert!(Template::parse("{{ .A | }}").is_ok());
    assert!(Template::parse("{{ .A | \"a\" }}").is_err());
    assert!(Template::parse("{{ .A | 1.5 }}").is_err());
    assert!(Template::parse("{{ .A .B }}").is_err());
    assert!(Template::parse("{{ 1.5x }}").is_err());
    assert!(Template::parse("{{ (.A }}").is_err());
    // As Go: assigning an undeclared variable parses and fails when it runs.
    assert!(Template::parse("{{ $y = 1 }}").is_ok());
    assert!(render("{{ $y = 1 }}").is_err());
    assert!(Template::parse("{{ if .A }}{{ else }}{{ else }}{{ end }}").is_err());
}

#[test]
fn strings_with_delimiters_inside() {
    assert_eq!(render("{{ \"}}\" }}").unwrap(), "}}");
    assert_eq!(render("{{ `a\\n` }}").unwrap(), "a\\n");
    assert_eq!(render("{{ \"a\\tb\\x41\\u00e9\" }}").unwrap(), "a\tbAé");
}

#[test]
fn printing_the_root_prints_the_go_struct() {
    // S61: as Go prints the Go provider's *profile.Context.
    let data = ContextData {
        node_name: "n".into(),
        vars: Some(BTreeMap::from([("a".to_string(), "b".to_string())])),
        ..Default::default()
    }
    .into_value();
    let t = Template::parse("{{ . }}|{{ printf \"%v\" $ }}|{{ print . }}").unwrap();
    assert_eq!(
        String::from_utf8(t.render(&data).unwrap()).unwrap(),
        "{   n      map[a:b] map[]}|&{   n      map[a:b] map[]}|&{   n      map[a:b] map[]}"
    );
}

#[test]
fn errors_do_not_carry_secret_values() {
    // Indexing with a secret as key: the message must not repeat the key's value.
    let e = err("{{ .Vars.x }}{{ index .List .Secrets.activationCode }}");
    assert!(!e.to_string().contains("s3cret"));
    let e = err("{{ index .List .Secrets.activationCode }}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let e = err("{{ index .NodeName .Secrets.activationCode }}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
    // As Go: a verb that does not fit is printed in band, not an error.
    assert_eq!(
        render("{{ printf \"%d|%v|%s\" .NodeName }}").unwrap(),
        "%!d(string=node-a)|%!v(MISSING)|%!s(MISSING)"
    );
}

#[test]
fn unicode_columns_and_text() {
    let e = err("äö\nüß {{ .Nope }}");
    assert_eq!((e.line, e.col), (2, 7));
    assert_eq!(render("grüße {{ .NodeName }}").unwrap(), "grüße node-a");
}

proptest::proptest! {
    /// Parsing and rendering arbitrary text never panics (profiles are external data).
    #[test]
    fn prop_parse_and_render_never_panic(src in "(\\{\\{-? ?|-?\\}\\}| |\\.[A-Za-z]{1,4}|\\$[a-z]?|[a-z]{1,5}|\"[^\"]{0,3}\"?|`|[0-9]|[|():=,/*-]|ü|\n){0,24}") {
        if let Ok(t) = Template::parse(&src) {
            let _ = t.render(&root());
        }
    }

    /// Text without `{{` renders to itself, byte for byte.
    #[test]
    fn prop_plain_text_is_identity(src in "[^{]*") {
        let t = Template::parse(&src).unwrap();
        proptest::prop_assert_eq!(t.render(&root()).unwrap(), src.as_bytes());
    }
}

#[test]
fn define_template_block_break_continue() {
    // S61: as Go's text/template.
    assert_eq!(
        render("{{define \"greet\"}}hi {{.}}{{end}}{{template \"greet\" .NodeName}}|{{template \"greet\"}}")
            .unwrap(),
        "hi node-a|hi <no value>"
    );
    assert_eq!(
        render("{{block \"b\" .Vars.region}}[{{.}}]{{end}}").unwrap(),
        "[eu-west-1]"
    );
    // A later empty definition does not replace, two non-empty ones are an error.
    assert_eq!(
        render("{{define \"x\"}}1{{end}}{{define \"x\"}} {{end}}{{template \"x\"}}").unwrap(),
        "1"
    );
    assert!(Template::parse("{{define \"x\"}}1{{end}}{{define \"x\"}}2{{end}}").is_err());
    assert!(
        err("{{template \"missing\"}}")
            .msg
            .contains("no such template")
    );
    assert!(Template::parse("{{if true}}{{define \"x\"}}{{end}}{{end}}").is_err());
    assert_eq!(
        render("{{range $i, $v := .List}}{{if eq $i 1}}{{break}}{{end}}{{$v}}{{end}}").unwrap(),
        "x"
    );
    assert_eq!(
        render("{{range .List}}{{if eq . \"x\"}}{{continue}}{{end}}{{.}}{{end}}").unwrap(),
        "y"
    );
    assert!(Template::parse("{{break}}").is_err());
    assert!(Template::parse("{{range .List}}{{else}}{{break}}{{end}}").is_err());
    assert!(
        err("{{define \"r\"}}{{template \"r\"}}{{end}}{{template \"r\"}}")
            .msg
            .contains("depth")
    );
}

#[test]
fn number_and_character_constants_as_go() {
    for (src, want) in [
        ("{{1.5}}", "1.5"),
        ("{{1e6}}", "1e+06"),
        ("{{.5}} {{-.5}} {{1.}}", "0.5 -0.5 1"),
        ("{{-0x1E}} {{0x1E}}", "-30 30"),
        ("{{0x1p-2}} {{1_000}} {{017}} {{0b101}}", "0.25 1000 15 5"),
        ("{{'a'}} {{'\\n'}} {{'é'}} {{'\\xff'}}", "97 10 233 255"),
        ("{{1i}} {{1-2.5i}} {{-0i}}", "(0+1i) (1-2.5i) (0-0i)"),
        (
            "{{printf \"%T %T %T %T %T\" 1 1.0 'a' 1i -0x1E}}",
            "int float64 int complex128 float64",
        ),
        ("{{0.00001}} {{123456.7}} {{-0.0}}", "1e-05 123456.7 -0"),
        (
            "{{printf \"%.2f|%e|%g|%d\" 3.14159 1234.5 0.000012345 1.5}}",
            "3.14|1.234500e+03|1.2345e-05|%!d(float64=1.5)",
        ),
        (
            "{{lt 1.5 2.5}} {{eq 1i 1i}} {{if 0.0}}t{{else}}f{{end}}",
            "true true f",
        ),
        // Go's output for these, from the oracle.
        (
            "{{printf \"%x|%X|%b|%.1x|%.0X|%x|%x|%b|%x\" 1.5 -1.5 1.5 1.96875 1.5 0.0 5e-324 0.0 (1+2i)}}",
            "0x1.8p+00|-0X1.8P+00|6755399441055744p-52|0x1.0p+01|0X1P+01|0x0p+00|0x1p-1074|0p-1074|(0x1p+00+0x1p+01i)",
        ),
    ] {
        assert_eq!(render(src).unwrap(), want, "{src}");
    }
    for bad in [
        "{{08}}",
        "{{1__0}}",
        "{{'ab'}}",
        "{{''}}",
        "{{1e400}}",
        "{{99999999999999999999}}",
        "{{0x1.8}}",
        "{{'\\\"'}}",
        "{{1.5.x}}",
        "{{0x10+1i}}",
        "{{'a}}",
    ] {
        assert!(Template::parse(bad).is_err(), "{bad}");
    }
    // Fits a uint64, not an int: parses and fails when it runs, as in Go.
    assert!(render("{{9223372036854775808}}").is_err());
    assert!(render("{{eq 1.0 1}}").is_err());
    assert!(render("{{lt 1i 2i}}").is_err());
}

#[test]
fn js_escapes_as_go() {
    assert_eq!(
        render("{{js \"<a href='x'>\\\\\\\"&=\\x01\\u00a0\\u2028é😀\"}}").unwrap(),
        "\\u003Ca href\\u003D\\'x\\'\\u003E\\\\\\\"\\u0026\\u003D\\u0001\\u00A0\\u2028é😀"
    );
    // Arguments as text/template's evalArgs joins them; an unassigned astral rune is escaped
    // with five hex digits, as Go's %04X does.
    assert_eq!(
        render("{{js 1 2 nil}}").unwrap(),
        "1 2\\u003Cno value\\u003E"
    );
    assert_eq!(render("{{js \"\\U0001FFFF\"}}").unwrap(), "\\u1FFFF");
}

#[test]
fn slice_as_go() {
    let ok = |src: &str| render(src).unwrap();
    assert_eq!(
        ok("{{slice \"abcdef\" 1 3}}|{{slice \"abc\" 1}}|{{slice \"abc\"}}"),
        "bc|bc|abc"
    );
    assert_eq!(
        ok("{{slice .List 1}}|{{slice .List 0 1 2}}|{{len (slice .List 2)}}"),
        "[y]|[x]|0"
    );
    // Cut inside a character: the bytes, as Go prints them.
    assert_eq!(
        render_bytes(
            "{{slice \"é\" 0 1}}|{{len (slice \"é\" 1)}}|{{printf \"%q\" (slice \"é\" 1)}}"
        ),
        b"\xc3|1|\"\\xa9\"".to_vec()
    );
    for bad in [
        "{{slice}}",
        "{{slice nil}}",
        "{{slice 1}}",
        "{{slice .Vars 0}}",
        "{{slice . 0}}",
        "{{slice \"abc\" 1 2 3}}",
        "{{slice .List 0 1 2 3}}",
        "{{slice \"abc\" 4}}",
        "{{slice \"abc\" -1}}",
        "{{slice \"abc\" 2 1}}",
        "{{slice .List 0 2 1}}",
        "{{slice \"abc\" nil}}",
        "{{slice \"abc\" 1.0}}",
        "{{slice \"abc\" \"1\"}}",
    ] {
        assert!(render(bad).is_err(), "{bad}");
    }
    // No index in the error: it may come from a secret's bytes.
    let e = err("{{slice \"abc\" (index .Secrets.activationCode 0)}}");
    assert!(!e.msg.contains("115"), "{e}");
    let e = err("{{range $k, $v := index .Secrets.activationCode 0}}{{end}}");
    assert!(!e.msg.contains("115"), "{e}");
}

#[test]
fn range_over_a_byte_as_go() {
    // Go 1.22+ ranges over every integer kind; `index` of a string is a uint8.
    assert_eq!(
        render("{{range index \"\\x03\" 0}}{{.}}{{printf \"%T\" .}},{{end}}").unwrap(),
        "0uint8,1uint8,2uint8,"
    );
    assert!(render("{{range $i, $v := index \"a\" 0}}{{end}}").is_err());
}

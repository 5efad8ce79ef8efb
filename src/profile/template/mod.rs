//! A renderer for the subset of Go `text/template` that join profiles use.
//!
//! Profiles written for the Go provider were rendered with plain `text/template` (no sprig) and
//! `missingkey=error`; this module accepts what Go accepts, renders the same bytes and fails —
//! with a `line:col` position — where Go fails (see "Deviations" for what still differs).
//!
//! Supported:
//! - text and actions `{{ … }}`, trim markers `{{- ` / ` -}}`, comments `{{/* … */}}` (also
//!   with trim markers);
//! - `if` / `else if` / `else` / `end`, `with` / `else with` / `else` / `end`,
//!   `range` over maps (keys in sorted order), lists and integers, with `else`;
//! - variables: `$` (the root data), `{{ $x := pipeline }}`, `{{ $x = pipeline }}`,
//!   `range $v := …`, `range $k, $v := …`, `with $x := …`;
//! - operands: `.`, field chains `.A.B`, `$x.A`, `(pipeline).A`, string literals (`"…"` with Go
//!   escapes and raw `` `…` ``), numbers as Go reads them (integers with base prefixes and
//!   underscores, floats incl. hexadecimal ones, imaginary and complex constants, `'a'`
//!   character constants; see `number.rs`), `true`, `false`, `nil`;
//! - pipelines `a | b | c` (the previous result is the last argument of the next command);
//! - `define` / `template` / `block`, `break` / `continue`;
//! - functions: `eq`, `ne`, `lt`, `le`, `gt`, `ge`, `not`, `and`, `or` (short-circuit), `len`,
//!   `index`, `slice` (strings and lists, Go's index rules; a string may be cut inside a
//!   character), `print`, `println`, `printf`, `html`, `js`, `urlquery` (escape.rs), `call`
//!   (the data holds no functions, so a `call` that runs fails, as in Go).
//!
//! Strings are Go strings: bytes, not necessarily UTF-8 (`Value::Bytes`), and so is the output.
//! Values print as Go's `fmt` prints them, `{{ . }}` included (the data as the Go provider's
//! struct, secrets and all, exactly as Go would print it); `printf` keeps Go's in-band errors
//! (`%!s(MISSING)`, `%!d(string=x)`, `%!(EXTRA …)`).
//!
//! `quote` and `default` are sprig functions, which the Go provider never loaded, so no existing
//! profile can use them; they are unknown functions here too. docs/join-profiles.md has the
//! exact list, measured against Go by the oracle tier (`cargo test --test oracles s61`).
//!
//! Deviations from Go: error texts never contain evaluated values (only names that appear in
//! the template text) and are worded differently (accept/reject is Go's); `{{template}}` calls
//! nest at most 200 deep (Go: 100,000); the data's methods (`.Env`, `.Redact` of the Go
//! provider's `profile.Context`) are unknown fields; `printf` flags `#`, ` ` and `0` and widths
//! inside maps and structs are not Go's.

mod escape;
mod exec;
mod fmt;
mod fmt_float;
mod funcs;
mod lexer;
mod number;
mod parser;
mod unicode_print;
mod values;

pub use values::{ContextData, RawStr, Value};

use exec::Exec;
use lexer::{Lexer, line_col};
use parser::{Node, Parser, Terminator};

/// A template parse or execution error, with the 1-based line and column of the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {msg}")]
pub struct TemplateError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

// ---------------------------------------------------------------------------------------------
// Template

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    src: String,
    /// The template run by [`Template::render`].
    name: String,
    /// Every template of the set: `define`s, `block`s and the script itself.
    defines: Vec<(String, Vec<Node>)>,
}

impl Template {
    /// Parses `src` as the template `join` (see [`Template::parse_named`]).
    pub fn parse(src: &str) -> Result<Template, TemplateError> {
        Template::parse_named(src, "join")
    }

    /// Parses `src` as the template `name` — the Go provider names each script after its phase,
    /// which matters only to a `{{define}}` of that same name. Unknown functions, undefined
    /// variables and syntax errors fail here.
    pub fn parse_named(src: &str, name: &str) -> Result<Template, TemplateError> {
        let err = |(pos, msg): (usize, String)| {
            let (line, col) = line_col(src, pos);
            TemplateError { line, col, msg }
        };
        let items = Lexer { src }.items().map_err(err)?;
        let mut parser = Parser {
            items: items.into_iter(),
            vars: Vec::new(),
            depth: 0,
            range_depth: 0,
            defines: Vec::new(),
        };
        let (nodes, term) = parser.list().map_err(err)?;
        match term {
            Terminator::Eof => {}
            Terminator::End(p) => return Err(err((p, "unexpected {{end}}".into()))),
            Terminator::Else(p, _) => return Err(err((p, "unexpected {{else}}".into()))),
        }
        // The script itself is one more template of the set, added last (as Go's parser does).
        parser.add_define(0, name.to_string(), nodes).map_err(err)?;
        Ok(Template {
            src: src.to_string(),
            name: name.to_string(),
            defines: parser.defines,
        })
    }

    /// Renders against `data` (normally a [`Value::Root`]).
    pub fn render(&self, data: &Value) -> Result<Vec<u8>, TemplateError> {
        let mut ex = Exec::new(data.clone(), &self.defines);
        let main = self
            .defines
            .iter()
            .find(|(n, _)| *n == self.name)
            .map(|(_, nodes)| nodes.as_slice())
            .unwrap_or_default();
        ex.nodes(main, data).map_err(|(pos, msg)| {
            let (line, col) = line_col(&self.src, pos);
            TemplateError { line, col, msg }
        })?;
        Ok(ex.out)
    }
}

#[cfg(test)]
mod tests;

//! A renderer for the subset of Go `text/template` that join profiles use.
//!
//! Profiles written for the Go provider were rendered with plain `text/template` (no sprig) and
//! `missingkey=error`; this module accepts the same syntax for the features below and fails — with
//! a `line:col` position — where Go would fail, plus a few places where Go would print something
//! unsafe (see "Deviations").
//!
//! Supported:
//! - text and actions `{{ … }}`, trim markers `{{- ` / ` -}}`, comments `{{/* … */}}` (also
//!   with trim markers);
//! - `if` / `else if` / `else` / `end`, `with` / `else with` / `else` / `end`,
//!   `range` over maps (keys in sorted order) and lists, with `else`;
//! - variables: `$` (the root data), `{{ $x := pipeline }}`, `{{ $x = pipeline }}`,
//!   `range $v := …`, `range $k, $v := …`, `with $x := …`;
//! - operands: `.`, field chains `.A.B`, `$x.A`, `(pipeline).A`, string literals (`"…"` with Go
//!   escapes and raw `` `…` ``), integers, `true`, `false`, `nil`;
//! - pipelines `a | b | c` (the previous result is the last argument of the next command);
//! - functions: `eq`, `ne`, `lt`, `le`, `gt`, `ge`, `not`, `and`, `or` (short-circuit), `len`,
//!   `index`, `print`, `println`, `printf` (verbs `%s`, `%v`, `%d`, `%q`, `%%`).
//!
//! Not supported (a parse error naming the construct): `define`, `template`, `block`, `break`,
//! `continue`, `call`, `slice`, `html`, `js`, `urlquery`, floats, char constants. `quote` and
//! `default` are sprig functions, which the Go provider never loaded, so no existing profile can
//! use them; they are unknown functions here too.
//!
//! Deviations from Go: printing the whole root data (`{{ . }}` at the top level, `{{ $ }}`) is an
//! error instead of a struct dump (it would print every secret); `printf` with a missing or
//! mismatched argument is an error instead of `%!s(MISSING)`; error texts never contain evaluated
//! values (only names that appear in the template text).

use crate::secret::Secret;
use std::collections::BTreeMap;

/// A template parse or execution error, with the 1-based line and column of the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {msg}")]
pub struct TemplateError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

/// A value in the template data.
#[derive(Clone, Debug)]
pub enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    Str(String),
    /// Renders as its value; never appears in `Debug` output or error texts.
    Secret(Secret),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    /// The top-level data: behaves like a Go struct (unknown field = error, not indexable,
    /// not rangeable, not printable).
    Root(BTreeMap<String, Value>),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Str(_) | Value::Secret(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Root(_) => "context",
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            Value::Secret(s) => Some(s.expose()),
            _ => None,
        }
    }

    /// Go's notion of truth: false, 0, "", nil and empty collections are false.
    fn truthy(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Str(s) => !s.is_empty(),
            Value::Secret(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::Root(_) => true,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Dot,
    Field(String),
    Var(String), // "" for `$`
    Ident(String),
    Str(String),
    Int(i64),
    Pipe,
    LParen,
    RParen,
    Declare,
    Assign,
    Comma,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: usize,
    /// Whitespace (or the start of the action) directly before this token.
    spaced: bool,
}

enum Item {
    Text(String),
    Action { pos: usize, toks: Vec<Token> },
}

fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(src.len());
    let before = src.get(..pos).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let col = match before.rfind('\n') {
        Some(i) => before[i + 1..].chars().count() + 1,
        None => before.chars().count() + 1,
    };
    (line, col)
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

struct Lexer<'a> {
    src: &'a str,
}

type PResult<T> = Result<T, (usize, String)>;

impl<'a> Lexer<'a> {
    fn items(&self) -> PResult<Vec<Item>> {
        let src = self.src;
        let bytes = src.as_bytes();
        let mut items = Vec::new();
        let mut pos = 0;
        let mut trim_next = false;
        loop {
            let open = src[pos..].find("{{").map(|i| pos + i);
            let end = open.unwrap_or(src.len());
            let mut text = &src[pos..end];
            if trim_next {
                text = text.trim_start_matches([' ', '\t', '\r', '\n']);
            }
            let Some(open) = open else {
                if !text.is_empty() {
                    items.push(Item::Text(text.to_string()));
                }
                return Ok(items);
            };
            let mut p = open + 2;
            if bytes.get(p) == Some(&b'-') && bytes.get(p + 1).is_some_and(|b| is_space(*b)) {
                text = text.trim_end_matches([' ', '\t', '\r', '\n']);
                p += 2;
            }
            if !text.is_empty() {
                items.push(Item::Text(text.to_string()));
            }
            // Comment: `{{/*` or `{{- /*`, closed by `*/}}` or `*/ -}}`.
            if src[p..].starts_with("/*") {
                let Some(close) = src[p + 2..].find("*/").map(|i| p + 2 + i) else {
                    return Err((open, "unclosed comment".into()));
                };
                let after = close + 2;
                if src[after..].starts_with("}}") {
                    trim_next = false;
                    pos = after + 2;
                } else if src[after..].starts_with(" -}}") {
                    trim_next = true;
                    pos = after + 4;
                } else {
                    return Err((close, "comment ends before closing delimiter".into()));
                }
                continue;
            }
            let (toks, next, trim) = self.action(p, open)?;
            items.push(Item::Action { pos: open, toks });
            trim_next = trim;
            pos = next;
        }
    }

    /// Lexes one action starting at `p`; returns tokens, the position after `}}` and whether the
    /// action closed with a trim marker.
    fn action(&self, mut p: usize, open: usize) -> PResult<(Vec<Token>, usize, bool)> {
        let src = self.src;
        let b = src.as_bytes();
        let mut toks = Vec::new();
        let mut spaced = true;
        loop {
            let Some(&c) = b.get(p) else {
                return Err((open, "unclosed action".into()));
            };
            if is_space(c) {
                if src[p + 1..].starts_with("-}}") {
                    return Ok((toks, p + 4, true));
                }
                p += 1;
                spaced = true;
                continue;
            }
            if src[p..].starts_with("}}") {
                return Ok((toks, p + 2, false));
            }
            let start = p;
            let tok = match c {
                b'|' => {
                    p += 1;
                    Tok::Pipe
                }
                b'(' => {
                    p += 1;
                    Tok::LParen
                }
                b')' => {
                    p += 1;
                    Tok::RParen
                }
                b',' => {
                    p += 1;
                    Tok::Comma
                }
                b':' if b.get(p + 1) == Some(&b'=') => {
                    p += 2;
                    Tok::Declare
                }
                b'=' => {
                    p += 1;
                    Tok::Assign
                }
                b'.' => {
                    let n = ident_len(&src[p + 1..]);
                    if n == 0 {
                        if b.get(p + 1).is_some_and(|x| x.is_ascii_digit()) {
                            return Err((p, "floating-point numbers are not supported".into()));
                        }
                        p += 1;
                        Tok::Dot
                    } else {
                        let name = src[p + 1..p + 1 + n].to_string();
                        p += 1 + n;
                        Tok::Field(name)
                    }
                }
                b'$' => {
                    let n = ident_len(&src[p + 1..]);
                    let name = src[p + 1..p + 1 + n].to_string();
                    p += 1 + n;
                    Tok::Var(name)
                }
                b'"' => {
                    let (s, next) = lex_quoted(src, p)?;
                    p = next;
                    Tok::Str(s)
                }
                b'`' => {
                    let Some(end) = src[p + 1..].find('`').map(|i| p + 1 + i) else {
                        return Err((p, "unterminated raw string".into()));
                    };
                    let s = src[p + 1..end].to_string();
                    p = end + 1;
                    Tok::Str(s)
                }
                b'\'' => return Err((p, "character constants are not supported".into())),
                b'0'..=b'9' | b'-' | b'+' => {
                    let mut q = p + 1;
                    while b
                        .get(q)
                        .is_some_and(|x| x.is_ascii_alphanumeric() || *x == b'_')
                    {
                        q += 1;
                    }
                    if b.get(q) == Some(&b'.') {
                        return Err((p, "floating-point numbers are not supported".into()));
                    }
                    let text = src[p..q].replace('_', "");
                    let n = text
                        .parse::<i64>()
                        .map_err(|_| (p, format!("bad number syntax: {:?}", &src[p..q])))?;
                    p = q;
                    Tok::Int(n)
                }
                _ => {
                    let n = ident_len(&src[p..]);
                    if n == 0 {
                        let ch = src[p..].chars().next().unwrap_or('?');
                        return Err((p, format!("unexpected {ch:?} in action")));
                    }
                    let name = src[p..p + n].to_string();
                    p += n;
                    Tok::Ident(name)
                }
            };
            toks.push(Token {
                tok,
                pos: start,
                spaced,
            });
            spaced = false;
        }
    }
}

fn ident_len(s: &str) -> usize {
    s.char_indices()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map(|(i, _)| i)
        .unwrap_or(s.len())
}

fn lex_quoted(src: &str, start: usize) -> PResult<(String, usize)> {
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, start + 1 + i + 1)),
            '\n' => break,
            '\\' => {
                let Some((j, e)) = chars.next() else { break };
                match e {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    '\\' => out.push('\\'),
                    '"' => out.push('"'),
                    '\'' => out.push('\''),
                    'a' => out.push('\u{7}'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'v' => out.push('\u{b}'),
                    'x' | 'u' | 'U' => {
                        let n = match e {
                            'x' => 2,
                            'u' => 4,
                            _ => 8,
                        };
                        let mut v = 0u32;
                        for _ in 0..n {
                            let d = chars
                                .next()
                                .and_then(|(_, h)| h.to_digit(16))
                                .ok_or((start + 1 + j, "bad escape in string".to_string()))?;
                            v = v * 16 + d;
                        }
                        let ch = char::from_u32(v)
                            .ok_or((start + 1 + j, "bad escape in string".to_string()))?;
                        out.push(ch);
                    }
                    _ => return Err((start + 1 + j, format!("unknown escape \\{e} in string"))),
                }
            }
            c => out.push(c),
        }
    }
    Err((start, "unterminated quoted string".into()))
}

// ---------------------------------------------------------------------------------------------
// AST

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Action(Pipeline),
    If {
        branches: Vec<(Pipeline, Vec<Node>)>,
        otherwise: Vec<Node>,
    },
    With {
        branches: Vec<(Pipeline, Vec<Node>)>,
        otherwise: Vec<Node>,
    },
    Range {
        pipe: Pipeline,
        body: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

#[derive(Debug, Clone)]
struct Pipeline {
    pos: usize,
    decl: Vec<(usize, String)>,
    assign: bool,
    cmds: Vec<Command>,
}

#[derive(Debug, Clone)]
struct Command {
    args: Vec<Operand>,
}

#[derive(Debug, Clone)]
enum OpKind {
    Dot,
    Field(Vec<String>),
    Var(String, Vec<String>),
    Func(String),
    Str(String),
    Int(i64),
    Bool(bool),
    Nil,
    Sub(Box<Pipeline>, Vec<String>),
}

#[derive(Debug, Clone)]
struct Operand {
    pos: usize,
    kind: OpKind,
}

const FUNCS: &[&str] = &[
    "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "len", "index", "print", "printf",
    "println",
];
const UNSUPPORTED: &[&str] = &[
    "define", "template", "block", "break", "continue", "call", "slice", "html", "js", "urlquery",
];

enum Terminator {
    Eof,
    End(usize),
    Else(usize, Vec<Token>),
}

struct Parser {
    items: std::vec::IntoIter<Item>,
    vars: Vec<String>,
}

impl Parser {
    fn list(&mut self) -> PResult<(Vec<Node>, Terminator)> {
        let mut nodes = Vec::new();
        while let Some(item) = self.items.next() {
            match item {
                Item::Text(t) => nodes.push(Node::Text(t)),
                Item::Action { pos, toks } => {
                    let Some(first) = toks.first() else {
                        return Err((pos, "missing value for command".into()));
                    };
                    match &first.tok {
                        Tok::Ident(k) if k == "end" => {
                            if toks.len() > 1 {
                                return Err((toks[1].pos, "unexpected token after end".into()));
                            }
                            return Ok((nodes, Terminator::End(pos)));
                        }
                        Tok::Ident(k) if k == "else" => {
                            return Ok((nodes, Terminator::Else(pos, toks[1..].to_vec())));
                        }
                        Tok::Ident(k) if k == "if" || k == "with" => {
                            let kw = k.clone();
                            nodes.push(self.conditional(&kw, pos, toks[1..].to_vec())?);
                        }
                        Tok::Ident(k) if k == "range" => {
                            nodes.push(self.range(pos, toks[1..].to_vec())?);
                        }
                        Tok::Ident(k) if UNSUPPORTED.contains(&k.as_str()) => {
                            return Err((first.pos, format!("\"{k}\" is not supported")));
                        }
                        _ => {
                            let pipe = self.pipeline(pos, &toks, true)?;
                            nodes.push(Node::Action(pipe));
                        }
                    }
                }
            }
        }
        Ok((nodes, Terminator::Eof))
    }

    fn conditional(&mut self, kw: &str, pos: usize, toks: Vec<Token>) -> PResult<Node> {
        let mark = self.vars.len();
        let mut branches = Vec::new();
        let mut otherwise = Vec::new();
        let mut cond_toks = toks;
        let mut cond_pos = pos;
        loop {
            let pipe = self.pipeline(cond_pos, &cond_toks, true)?;
            let body_mark = self.vars.len();
            let (body, term) = self.list()?;
            self.vars.truncate(body_mark);
            branches.push((pipe, body));
            match term {
                Terminator::End(_) => break,
                Terminator::Eof => return Err((pos, format!("unexpected EOF: {kw} without end"))),
                Terminator::Else(epos, rest) => {
                    if rest.is_empty() {
                        let body_mark = self.vars.len();
                        let (body, term) = self.list()?;
                        self.vars.truncate(body_mark);
                        otherwise = body;
                        match term {
                            Terminator::End(_) => break,
                            Terminator::Eof => {
                                return Err((pos, format!("unexpected EOF: {kw} without end")));
                            }
                            Terminator::Else(p2, _) => {
                                return Err((p2, "else after the final else".into()));
                            }
                        }
                    }
                    match &rest[0].tok {
                        Tok::Ident(k) if k == kw => {
                            cond_toks = rest[1..].to_vec();
                            cond_pos = epos;
                        }
                        _ => {
                            return Err((rest[0].pos, format!("expected \"{kw}\" after else")));
                        }
                    }
                }
            }
        }
        self.vars.truncate(mark);
        Ok(if kw == "if" {
            Node::If {
                branches,
                otherwise,
            }
        } else {
            Node::With {
                branches,
                otherwise,
            }
        })
    }

    fn range(&mut self, pos: usize, toks: Vec<Token>) -> PResult<Node> {
        let mark = self.vars.len();
        let pipe = self.pipeline(pos, &toks, true)?;
        if pipe.assign {
            return Err((pos, "range cannot assign to existing variables".into()));
        }
        if pipe.decl.len() > 2 {
            return Err((pos, "range can declare at most two variables".into()));
        }
        let (body, term) = self.list()?;
        self.vars.truncate(mark);
        let otherwise = match term {
            Terminator::End(_) => Vec::new(),
            Terminator::Eof => return Err((pos, "unexpected EOF: range without end".into())),
            Terminator::Else(epos, rest) => {
                if !rest.is_empty() {
                    return Err((epos, "range only takes a plain else".into()));
                }
                let (body, term) = self.list()?;
                match term {
                    Terminator::End(_) => body,
                    Terminator::Eof => {
                        return Err((pos, "unexpected EOF: range without end".into()));
                    }
                    Terminator::Else(p2, _) => return Err((p2, "else after range else".into())),
                }
            }
        };
        self.vars.truncate(mark);
        Ok(Node::Range {
            pipe,
            body,
            otherwise,
        })
    }

    fn pipeline(&mut self, pos: usize, toks: &[Token], allow_decl: bool) -> PResult<Pipeline> {
        let mut rest = toks;
        let mut decl = Vec::new();
        let mut assign = false;
        // Declarations: `$x :=`, `$k, $v :=`, `$x =`.
        let mut probe = 0;
        let mut names = Vec::new();
        while let Some(Token {
            tok: Tok::Var(name),
            pos: vpos,
            ..
        }) = toks.get(probe)
        {
            names.push((*vpos, name.clone()));
            match toks.get(probe + 1).map(|t| &t.tok) {
                Some(Tok::Comma) => probe += 2,
                Some(Tok::Declare) | Some(Tok::Assign) => {
                    assign = toks[probe + 1].tok == Tok::Assign;
                    probe += 2;
                    if !allow_decl {
                        return Err((toks[0].pos, "declaration not allowed here".into()));
                    }
                    decl = names.clone();
                    rest = &toks[probe..];
                    break;
                }
                _ => break,
            }
        }
        if decl.is_empty() {
            assign = false;
        } else if assign {
            for (p, n) in &decl {
                if !self.vars.contains(n) {
                    return Err((*p, format!("undefined variable \"${n}\"")));
                }
            }
        }
        let cmds = self.commands(pos, rest)?;
        if !assign {
            for (_, n) in &decl {
                self.vars.push(n.clone());
            }
        }
        Ok(Pipeline {
            pos,
            decl,
            assign,
            cmds,
        })
    }

    fn commands(&mut self, pos: usize, toks: &[Token]) -> PResult<Vec<Command>> {
        let mut cmds = Vec::new();
        let mut i = 0;
        loop {
            let cpos = toks.get(i).map(|t| t.pos).unwrap_or(pos);
            let mut args = Vec::new();
            while i < toks.len() && toks[i].tok != Tok::Pipe {
                let (op, next) = self.operand(toks, i)?;
                if !args.is_empty() && !toks[i].spaced && toks[i].tok != Tok::LParen {
                    return Err((toks[i].pos, "missing space between arguments".into()));
                }
                args.push(op);
                i = next;
            }
            if args.is_empty() {
                return Err((cpos, "missing value for command".into()));
            }
            if args.len() > 1 && !matches!(args[0].kind, OpKind::Func(_)) {
                return Err((args[1].pos, "can't give argument to non-function".into()));
            }
            cmds.push(Command { args });
            if i >= toks.len() {
                return Ok(cmds);
            }
            i += 1; // the pipe
            if i >= toks.len() {
                return Err((toks[i - 1].pos, "missing command after |".into()));
            }
        }
    }

    fn chain(toks: &[Token], mut i: usize) -> (Vec<String>, usize) {
        let mut chain = Vec::new();
        while let Some(Token {
            tok: Tok::Field(f),
            spaced: false,
            ..
        }) = toks.get(i)
        {
            chain.push(f.clone());
            i += 1;
        }
        (chain, i)
    }

    fn operand(&mut self, toks: &[Token], i: usize) -> PResult<(Operand, usize)> {
        let t = &toks[i];
        let pos = t.pos;
        let (kind, next) = match &t.tok {
            Tok::Dot => (OpKind::Dot, i + 1),
            Tok::Field(f) => {
                let (mut chain, next) = Self::chain(toks, i + 1);
                chain.insert(0, f.clone());
                (OpKind::Field(chain), next)
            }
            Tok::Var(name) => {
                if !name.is_empty() && !self.vars.contains(name) {
                    return Err((pos, format!("undefined variable \"${name}\"")));
                }
                let (chain, next) = Self::chain(toks, i + 1);
                (OpKind::Var(name.clone(), chain), next)
            }
            Tok::Str(s) => (OpKind::Str(s.clone()), i + 1),
            Tok::Int(n) => (OpKind::Int(*n), i + 1),
            Tok::Ident(k) => match k.as_str() {
                "true" => (OpKind::Bool(true), i + 1),
                "false" => (OpKind::Bool(false), i + 1),
                "nil" => (OpKind::Nil, i + 1),
                _ if FUNCS.contains(&k.as_str()) => (OpKind::Func(k.clone()), i + 1),
                _ if UNSUPPORTED.contains(&k.as_str()) => {
                    return Err((pos, format!("function \"{k}\" is not supported")));
                }
                "if" | "else" | "end" | "range" | "with" => {
                    return Err((pos, format!("unexpected \"{k}\" in command")));
                }
                _ => return Err((pos, format!("function \"{k}\" not defined"))),
            },
            Tok::LParen => {
                let mut depth = 0usize;
                let mut j = i;
                let close = loop {
                    match toks.get(j).map(|t| &t.tok) {
                        Some(Tok::LParen) => depth += 1,
                        Some(Tok::RParen) => {
                            depth -= 1;
                            if depth == 0 {
                                break j;
                            }
                        }
                        Some(_) => {}
                        None => return Err((pos, "unclosed left paren".into())),
                    }
                    j += 1;
                };
                let inner = self.pipeline(pos, &toks[i + 1..close], true)?;
                let (chain, next) = Self::chain(toks, close + 1);
                (OpKind::Sub(Box::new(inner), chain), next)
            }
            Tok::RParen => return Err((pos, "unexpected right paren".into())),
            Tok::Pipe => return Err((pos, "missing value for command".into())),
            Tok::Comma | Tok::Declare | Tok::Assign => {
                return Err((pos, "unexpected declaration or assignment".into()));
            }
        };
        if matches!(kind, OpKind::Dot | OpKind::Str(_) | OpKind::Int(_))
            && let Some(Token {
                tok: Tok::Field(_),
                spaced: false,
                pos,
            }) = toks.get(next)
        {
            return Err((*pos, "unexpected field access on this operand".into()));
        }
        Ok((Operand { pos, kind }, next))
    }
}

// ---------------------------------------------------------------------------------------------
// Template

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    src: String,
    nodes: Vec<Node>,
}

/// A place where a template reaches into its data, for static checks (the leave rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataRef {
    /// A field name in any chain (`.Vars.x` yields `Vars` and `x`).
    Field {
        line: usize,
        col: usize,
        name: String,
    },
    /// The whole root data: `$`, or `.` while dot is still the root.
    Root { line: usize, col: usize },
}

impl Template {
    /// Parses `src`. Unknown functions, undefined variables and syntax errors fail here.
    pub fn parse(src: &str) -> Result<Template, TemplateError> {
        let err = |(pos, msg): (usize, String)| {
            let (line, col) = line_col(src, pos);
            TemplateError { line, col, msg }
        };
        let items = Lexer { src }.items().map_err(err)?;
        let mut parser = Parser {
            items: items.into_iter(),
            vars: Vec::new(),
        };
        let (nodes, term) = parser.list().map_err(err)?;
        match term {
            Terminator::Eof => Ok(Template {
                src: src.to_string(),
                nodes,
            }),
            Terminator::End(p) => Err(err((p, "unexpected {{end}}".into()))),
            Terminator::Else(p, _) => Err(err((p, "unexpected {{else}}".into()))),
        }
    }

    /// Renders against `data` (normally a [`Value::Root`]).
    pub fn render(&self, data: &Value) -> Result<Vec<u8>, TemplateError> {
        let mut ex = Exec {
            root: data,
            vars: Vec::new(),
            out: String::new(),
        };
        ex.nodes(&self.nodes, data).map_err(|(pos, msg)| {
            let (line, col) = line_col(&self.src, pos);
            TemplateError { line, col, msg }
        })?;
        Ok(ex.out.into_bytes())
    }

    /// Every reference into the data, in source order.
    pub fn data_refs(&self) -> Vec<DataRef> {
        let mut raw = Vec::new();
        refs_nodes(&self.nodes, true, &mut raw);
        raw.into_iter()
            .map(|(pos, name)| {
                let (line, col) = line_col(&self.src, pos);
                match name {
                    Some(name) => DataRef::Field { line, col, name },
                    None => DataRef::Root { line, col },
                }
            })
            .collect()
    }
}

type RawRef = (usize, Option<String>);

fn refs_nodes(nodes: &[Node], dot_is_root: bool, out: &mut Vec<RawRef>) {
    for n in nodes {
        match n {
            Node::Text(_) => {}
            Node::Action(p) => refs_pipe(p, dot_is_root, out),
            Node::If {
                branches,
                otherwise,
            } => {
                for (p, body) in branches {
                    refs_pipe(p, dot_is_root, out);
                    refs_nodes(body, dot_is_root, out);
                }
                refs_nodes(otherwise, dot_is_root, out);
            }
            Node::With {
                branches,
                otherwise,
            } => {
                for (p, body) in branches {
                    refs_pipe(p, dot_is_root, out);
                    refs_nodes(body, false, out);
                }
                refs_nodes(otherwise, dot_is_root, out);
            }
            Node::Range {
                pipe,
                body,
                otherwise,
            } => {
                refs_pipe(pipe, dot_is_root, out);
                refs_nodes(body, false, out);
                refs_nodes(otherwise, dot_is_root, out);
            }
        }
    }
}

fn refs_pipe(p: &Pipeline, dot_is_root: bool, out: &mut Vec<RawRef>) {
    for c in &p.cmds {
        for a in &c.args {
            let chain = match &a.kind {
                OpKind::Dot => {
                    if dot_is_root {
                        out.push((a.pos, None));
                    }
                    continue;
                }
                OpKind::Field(chain) => chain,
                OpKind::Var(name, chain) => {
                    if name.is_empty() && chain.is_empty() {
                        out.push((a.pos, None));
                    }
                    chain
                }
                OpKind::Sub(inner, chain) => {
                    refs_pipe(inner, dot_is_root, out);
                    chain
                }
                _ => continue,
            };
            for f in chain {
                out.push((a.pos, Some(f.clone())));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Execution

struct Exec<'a> {
    root: &'a Value,
    vars: Vec<(String, Value)>,
    out: String,
}

type EResult<T> = Result<T, (usize, String)>;

impl Exec<'_> {
    fn nodes(&mut self, nodes: &[Node], dot: &Value) -> EResult<()> {
        for n in nodes {
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(p) => {
                    let v = self.pipeline(p, dot)?;
                    if p.decl.is_empty() {
                        print_value(&v, &mut self.out).map_err(|m| (p.pos, m))?;
                    }
                }
                Node::If {
                    branches,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let mut done = false;
                    for (p, body) in branches {
                        let v = self.pipeline(p, dot)?;
                        if v.truthy() {
                            self.nodes(body, dot)?;
                            done = true;
                            break;
                        }
                    }
                    if !done {
                        self.nodes(otherwise, dot)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::With {
                    branches,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let mut done = false;
                    for (p, body) in branches {
                        let v = self.pipeline(p, dot)?;
                        if v.truthy() {
                            self.nodes(body, &v)?;
                            done = true;
                            break;
                        }
                    }
                    if !done {
                        self.nodes(otherwise, dot)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::Range {
                    pipe,
                    body,
                    otherwise,
                } => {
                    let mark = self.vars.len();
                    let v = self.eval_cmds(&pipe.cmds, dot)?;
                    let elems: Vec<(Value, Value)> = match v {
                        Value::Map(m) => m.into_iter().map(|(k, v)| (Value::Str(k), v)).collect(),
                        Value::List(l) => l
                            .into_iter()
                            .enumerate()
                            .map(|(i, v)| (Value::Int(i64::try_from(i).unwrap_or(i64::MAX)), v))
                            .collect(),
                        Value::Nil => Vec::new(),
                        other => {
                            return Err((
                                pipe.pos,
                                format!("range can't iterate over {}", other.type_name()),
                            ));
                        }
                    };
                    if elems.is_empty() {
                        self.nodes(otherwise, dot)?;
                    }
                    for (k, v) in elems {
                        let iter_mark = self.vars.len();
                        match pipe.decl.as_slice() {
                            [] => {}
                            [(_, x)] => self.vars.push((x.clone(), v.clone())),
                            [(_, a), (_, b)] => {
                                self.vars.push((a.clone(), k));
                                self.vars.push((b.clone(), v.clone()));
                            }
                            _ => return Err((pipe.pos, "too many range variables".into())),
                        }
                        self.nodes(body, &v)?;
                        self.vars.truncate(iter_mark);
                    }
                    self.vars.truncate(mark);
                }
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, p: &Pipeline, dot: &Value) -> EResult<Value> {
        let v = self.eval_cmds(&p.cmds, dot)?;
        if p.assign {
            for (vpos, name) in &p.decl {
                let slot = self
                    .vars
                    .iter_mut()
                    .rev()
                    .find(|(n, _)| n == name)
                    .ok_or((*vpos, format!("undefined variable \"${name}\"")))?;
                slot.1 = v.clone();
            }
        } else {
            for (_, name) in &p.decl {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn eval_cmds(&mut self, cmds: &[Command], dot: &Value) -> EResult<Value> {
        let mut prev: Option<Value> = None;
        for c in cmds {
            prev = Some(self.command(c, dot, prev)?);
        }
        Ok(prev.unwrap_or(Value::Nil))
    }

    fn command(&mut self, c: &Command, dot: &Value, piped: Option<Value>) -> EResult<Value> {
        let first = &c.args[0];
        if let OpKind::Func(name) = &first.kind {
            return self.call(name, first.pos, &c.args[1..], dot, piped);
        }
        if piped.is_some() {
            return Err((first.pos, "can't give argument to non-function".into()));
        }
        self.operand(first, dot)
    }

    fn operand(&mut self, a: &Operand, dot: &Value) -> EResult<Value> {
        let (base, chain) = match &a.kind {
            OpKind::Dot => return Ok(dot.clone()),
            OpKind::Str(s) => return Ok(Value::Str(s.clone())),
            OpKind::Int(n) => return Ok(Value::Int(*n)),
            OpKind::Bool(b) => return Ok(Value::Bool(*b)),
            OpKind::Nil => return Err((a.pos, "nil is not a command".into())),
            OpKind::Func(name) => return self.call(name, a.pos, &[], dot, None),
            OpKind::Field(chain) => (dot.clone(), chain.as_slice()),
            OpKind::Var(name, chain) => {
                let v = if name.is_empty() {
                    self.root.clone()
                } else {
                    self.vars
                        .iter()
                        .rev()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                        .ok_or((a.pos, format!("undefined variable \"${name}\"")))?
                };
                (v, chain.as_slice())
            }
            OpKind::Sub(inner, chain) => (self.pipeline(inner, dot)?, chain.as_slice()),
        };
        let mut cur = base;
        for f in chain {
            cur = field(cur, f).map_err(|m| (a.pos, m))?;
        }
        Ok(cur)
    }

    fn arg(&mut self, a: &Operand, dot: &Value) -> EResult<Value> {
        if let OpKind::Nil = a.kind {
            return Ok(Value::Nil);
        }
        self.operand(a, dot)
    }

    fn call(
        &mut self,
        name: &str,
        pos: usize,
        args: &[Operand],
        dot: &Value,
        piped: Option<Value>,
    ) -> EResult<Value> {
        let nargs = args.len() + usize::from(piped.is_some());
        // Short-circuit functions evaluate lazily.
        if name == "and" || name == "or" {
            if nargs == 0 {
                return Err((
                    pos,
                    format!("wrong number of args for {name}: want at least 1"),
                ));
            }
            let mut last = Value::Nil;
            for a in args {
                last = self.arg(a, dot)?;
                if last.truthy() != (name == "and") {
                    return Ok(last);
                }
            }
            if let Some(p) = piped {
                last = p;
            }
            return Ok(last);
        }
        let mut vals = Vec::with_capacity(nargs);
        for a in args {
            vals.push(self.arg(a, dot)?);
        }
        if let Some(p) = piped {
            vals.push(p);
        }
        let want = |n: usize| -> EResult<()> {
            if vals.len() == n {
                Ok(())
            } else {
                Err((
                    pos,
                    format!(
                        "wrong number of args for {name}: want {n} got {}",
                        vals.len()
                    ),
                ))
            }
        };
        match name {
            "not" => {
                want(1)?;
                Ok(Value::Bool(!vals[0].truthy()))
            }
            "len" => {
                want(1)?;
                let n = match &vals[0] {
                    Value::Str(s) => s.len(),
                    Value::Secret(s) => s.expose().len(),
                    Value::List(l) => l.len(),
                    Value::Map(m) => m.len(),
                    other => {
                        return Err((pos, format!("len of type {}", other.type_name())));
                    }
                };
                Ok(Value::Int(i64::try_from(n).unwrap_or(i64::MAX)))
            }
            "eq" => {
                if vals.len() < 2 {
                    return Err((pos, "missing argument for comparison".into()));
                }
                for other in &vals[1..] {
                    if compare(&vals[0], other).map_err(|m| (pos, m))? == std::cmp::Ordering::Equal
                    {
                        return Ok(Value::Bool(true));
                    }
                }
                Ok(Value::Bool(false))
            }
            "ne" | "lt" | "le" | "gt" | "ge" => {
                want(2)?;
                let ord = compare(&vals[0], &vals[1]).map_err(|m| (pos, m))?;
                if name != "ne"
                    && !matches!(vals[0], Value::Int(_) | Value::Str(_) | Value::Secret(_))
                {
                    return Err((
                        pos,
                        format!("invalid type for comparison: {}", vals[0].type_name()),
                    ));
                }
                use std::cmp::Ordering::*;
                Ok(Value::Bool(match name {
                    "ne" => ord != Equal,
                    "lt" => ord == Less,
                    "le" => ord != Greater,
                    "gt" => ord == Greater,
                    _ => ord != Less,
                }))
            }
            "index" => {
                if vals.is_empty() {
                    return Err((
                        pos,
                        "wrong number of args for index: want at least 1".into(),
                    ));
                }
                let mut cur = vals[0].clone();
                for k in &vals[1..] {
                    cur = match (cur, k) {
                        (Value::Map(mut m), k) => {
                            let key = k.as_str().ok_or((
                                pos,
                                format!("cannot index a map with a {}", k.type_name()),
                            ))?;
                            m.remove(key).unwrap_or(Value::Str(String::new()))
                        }
                        (Value::List(mut l), Value::Int(i)) => {
                            let idx = usize::try_from(*i)
                                .ok()
                                .filter(|i| *i < l.len())
                                .ok_or((pos, "index out of range".to_string()))?;
                            l.swap_remove(idx)
                        }
                        (c, k) => {
                            return Err((
                                pos,
                                format!(
                                    "can't index item of type {} with {}",
                                    c.type_name(),
                                    k.type_name()
                                ),
                            ));
                        }
                    };
                }
                Ok(cur)
            }
            "print" | "println" => {
                let mut s = String::new();
                for (i, v) in vals.iter().enumerate() {
                    if i > 0 {
                        let both_non_str = v.as_str().is_none() && vals[i - 1].as_str().is_none();
                        if name == "println" || both_non_str {
                            s.push(' ');
                        }
                    }
                    print_value(v, &mut s).map_err(|m| (pos, m))?;
                }
                if name == "println" {
                    s.push('\n');
                }
                Ok(Value::Str(s))
            }
            "printf" => {
                let Some(fmt) = vals.first().and_then(Value::as_str) else {
                    return Err((
                        pos,
                        "printf needs a string format as its first argument".into(),
                    ));
                };
                let fmt = fmt.to_string();
                printf(&fmt, &vals[1..])
                    .map(Value::Str)
                    .map_err(|m| (pos, m))
            }
            _ => Err((pos, format!("function \"{name}\" not defined"))),
        }
    }
}

fn field(v: Value, name: &str) -> Result<Value, String> {
    match v {
        Value::Root(mut m) => m.remove(name).ok_or_else(|| {
            format!("can't evaluate field {name}: no such key in the template data")
        }),
        Value::Map(mut m) => m
            .remove(name)
            .ok_or_else(|| format!("map has no entry for key \"{name}\"")),
        Value::Nil => Err(format!("nil pointer evaluating .{name}")),
        other => Err(format!(
            "can't evaluate field {name} in type {}",
            other.type_name()
        )),
    }
}

fn compare(a: &Value, b: &Value) -> Result<std::cmp::Ordering, String> {
    use std::cmp::Ordering::*;
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
        (Value::Nil, Value::Nil) => Ok(Equal),
        _ => match (a.as_str(), b.as_str()) {
            (Some(x), Some(y)) => Ok(x.cmp(y)),
            _ => Err(format!(
                "incompatible types for comparison: {} and {}",
                a.type_name(),
                b.type_name()
            )),
        },
    }
}

fn print_value(v: &Value, out: &mut String) -> Result<(), String> {
    match v {
        Value::Nil => out.push_str("<no value>"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Str(s) => out.push_str(s),
        Value::Secret(s) => out.push_str(s.expose()),
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(x, out)?;
            }
            out.push(']');
        }
        Value::Map(m) => {
            out.push_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                print_value(x, out)?;
            }
            out.push(']');
        }
        Value::Root(_) => {
            return Err("refusing to print the whole template data (it holds secrets)".into());
        }
    }
    Ok(())
}

fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn printf(fmt: &str, args: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    let mut it = fmt.chars();
    let mut next = args.iter();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let verb = it.next().ok_or("printf: format ends with %")?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = next
            .next()
            .ok_or_else(|| format!("printf: missing argument for %{verb}"))?;
        match verb {
            's' | 'v' => print_value(arg, &mut out)?,
            'd' => match arg {
                Value::Int(i) => out.push_str(&i.to_string()),
                other => return Err(format!("printf: %d of {}", other.type_name())),
            },
            'q' => match arg.as_str() {
                Some(s) => go_quote(s, &mut out),
                None => return Err(format!("printf: %q of {}", arg.type_name())),
            },
            other => return Err(format!("printf: verb %{other} is not supported")),
        }
    }
    if next.next().is_some() {
        return Err("printf: too many arguments for the format".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Value {
        let mut vars = BTreeMap::new();
        vars.insert("clusterName".to_string(), Value::from("prod"));
        vars.insert("region".to_string(), Value::from("eu-west-1"));
        vars.insert("empty".to_string(), Value::from(""));
        let mut secrets = BTreeMap::new();
        secrets.insert(
            "activationCode".to_string(),
            Value::Secret(Secret::new("s3cret-activation")),
        );
        let mut m = BTreeMap::new();
        m.insert("Vars".to_string(), Value::Map(vars));
        m.insert("Secrets".to_string(), Value::Map(secrets));
        m.insert("NodeName".to_string(), Value::from("node-a"));
        m.insert("ProviderID".to_string(), Value::from(""));
        m.insert(
            "List".to_string(),
            Value::List(vec![Value::from("x"), Value::from("y")]),
        );
        Value::Root(m)
    }

    fn render(src: &str) -> Result<String, TemplateError> {
        let t = Template::parse(src)?;
        let out = t.render(&root())?;
        Ok(String::from_utf8(out).unwrap())
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
        let mut m = BTreeMap::new();
        m.insert("Vars".to_string(), Value::Map(BTreeMap::new()));
        let t = Template::parse("{{ range .Vars }}x{{ else }}none{{ end }}").unwrap();
        assert_eq!(t.render(&Value::Root(m)).unwrap(), b"none");
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
            Template::parse("{{ template \"x\" }}")
                .unwrap_err()
                .msg
                .contains("not supported")
        );
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
        assert!(Template::parse("{{ .A | }}").is_err());
        assert!(Template::parse("{{ .A .B }}").is_err());
        assert!(Template::parse("{{ 1.5 }}").is_err());
        assert!(Template::parse("{{ (.A }}").is_err());
        assert!(Template::parse("{{ $y = 1 }}").is_err());
        assert!(Template::parse("{{ if .A }}{{ else }}{{ else }}{{ end }}").is_err());
    }

    #[test]
    fn strings_with_delimiters_inside() {
        assert_eq!(render("{{ \"}}\" }}").unwrap(), "}}");
        assert_eq!(render("{{ `a\\n` }}").unwrap(), "a\\n");
        assert_eq!(render("{{ \"a\\tb\\x41\\u00e9\" }}").unwrap(), "a\tbAé");
    }

    #[test]
    fn printing_the_root_is_refused() {
        assert!(err("{{ . }}").msg.contains("refusing"));
        assert!(err("{{ printf \"%v\" $ }}").msg.contains("refusing"));
    }

    #[test]
    fn errors_do_not_carry_secret_values() {
        // Indexing with a secret as key: the message must not repeat the key's value.
        let e = err("{{ .Vars.x }}{{ index .List .Secrets.activationCode }}");
        assert!(!e.to_string().contains("s3cret"));
        let e = err("{{ index .List .Secrets.activationCode }}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = err("{{ printf \"%d\" .Secrets.activationCode }}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn data_refs_for_static_checks() {
        let t = Template::parse(
            "{{ .HostAddress }}{{ with .Vars }}{{ .x }}{{ . }}{{ end }}{{ $ }}{{ . }}{{ (.Secrets).k }}",
        )
        .unwrap();
        let names: Vec<String> = t
            .data_refs()
            .into_iter()
            .map(|r| match r {
                DataRef::Field { name, .. } => name,
                DataRef::Root { .. } => "<root>".into(),
            })
            .collect();
        assert_eq!(
            names,
            vec![
                "HostAddress",
                "Vars",
                "x",
                "<root>",
                "<root>",
                "Secrets",
                "k"
            ]
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
                let _ = t.data_refs();
            }
        }

        /// Text without `{{` renders to itself, byte for byte.
        #[test]
        fn prop_plain_text_is_identity(src in "[^{]*") {
            let t = Template::parse(&src).unwrap();
            proptest::prop_assert_eq!(t.render(&root()).unwrap(), src.as_bytes());
        }
    }
}

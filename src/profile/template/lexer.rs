//! The lexer: text and actions, with positions.

use super::number;

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Dot,
    Field(String),
    Var(String), // "" for `$`
    Ident(String),
    Str(String),
    /// A number or character constant as written; `true`: Go's `itemComplex` (`1+2i`).
    Num(String, bool),
    Pipe,
    LParen,
    RParen,
    Declare,
    Assign,
    Comma,
}

#[derive(Debug, Clone)]
pub(super) struct Token {
    pub(super) tok: Tok,
    pub(super) pos: usize,
    /// Whitespace (or the start of the action) directly before this token.
    pub(super) spaced: bool,
}

pub(super) enum Item {
    Text(String),
    Action { pos: usize, toks: Vec<Token> },
}

pub(super) fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(src.len());
    let before = src.get(..pos).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let col = match before.rfind('\n') {
        Some(i) => before[i + 1..].chars().count() + 1,
        None => before.chars().count() + 1,
    };
    (line, col)
}

pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

pub(super) struct Lexer<'a> {
    pub(super) src: &'a str,
}

pub(super) type PResult<T> = Result<T, (usize, String)>;

impl<'a> Lexer<'a> {
    pub(super) fn items(&self) -> PResult<Vec<Item>> {
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
    pub(super) fn action(&self, mut p: usize, open: usize) -> PResult<(Vec<Token>, usize, bool)> {
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
                    if b.get(p + 1).is_some_and(|x| x.is_ascii_digit()) {
                        // `.5`: a number.
                        let (tok, next) = lex_number(src, p)?;
                        p = next;
                        tok
                    } else if n == 0 {
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
                b'\'' => {
                    let next = number::scan_char(src, p)?;
                    let tok = Tok::Num(src[p..next].to_string(), false);
                    p = next;
                    tok
                }
                b'0'..=b'9' | b'-' | b'+' => {
                    let (tok, next) = lex_number(src, p)?;
                    p = next;
                    tok
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

/// Go's `lexNumber` at `p`: a number, or a complex constant `1+2i`.
fn lex_number(src: &str, p: usize) -> PResult<(Tok, usize)> {
    let bad = |q: usize| (p, format!("bad number syntax: {:?}", &src[p..q]));
    let (q, ok) = number::scan_number(src, p);
    if !ok {
        return Err(bad(q));
    }
    if matches!(src.as_bytes().get(q), Some(b'+' | b'-')) {
        let (q2, ok) = number::scan_number(src, q);
        if !ok || src.as_bytes().get(q2 - 1) != Some(&b'i') {
            return Err(bad(q2));
        }
        return Ok((Tok::Num(src[p..q2].to_string(), true), q2));
    }
    Ok((Tok::Num(src[p..q].to_string(), false), q))
}

pub(super) fn ident_len(s: &str) -> usize {
    s.char_indices()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map(|(i, _)| i)
        .unwrap_or(s.len())
}

pub(super) fn lex_quoted(src: &str, start: usize) -> PResult<(String, usize)> {
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

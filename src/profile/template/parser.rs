//! The parser: actions into a tree of nodes.

use super::lexer::{Item, PResult, Tok, Token};
use super::number::{Const, constant};

// ---------------------------------------------------------------------------------------------
// AST

#[derive(Debug, Clone)]
pub(super) enum Node {
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
    /// `{{template "name" pipeline}}` (also what `{{block}}` leaves in place).
    Template {
        pos: usize,
        name: String,
        pipe: Option<Pipeline>,
    },
    Break,
    Continue,
}

/// The quoted name of `define`, `template` or `block`.
fn template_name(toks: &[Token], pos: usize, kw: &str) -> PResult<String> {
    match toks.get(1) {
        Some(Token {
            tok: Tok::Str(name),
            ..
        }) => Ok(name.clone()),
        Some(t) => Err((
            t.pos,
            format!("unexpected token in {kw} clause: expected a quoted name"),
        )),
        None => Err((pos, format!("missing name in {kw} clause"))),
    }
}

/// Go's `IsEmptyTree`: nothing but white space (comments leave no node).
pub(super) fn is_empty_tree(nodes: &[Node]) -> bool {
    nodes.iter().all(|n| match n {
        Node::Text(t) => t.trim().is_empty(),
        _ => false,
    })
}

#[derive(Debug, Clone)]
pub(super) struct Pipeline {
    pub(super) pos: usize,
    pub(super) decl: Vec<(usize, String)>,
    pub(super) assign: bool,
    pub(super) cmds: Vec<Command>,
}

#[derive(Debug, Clone)]
pub(super) struct Command {
    pub(super) args: Vec<Operand>,
}

#[derive(Debug, Clone)]
pub(super) enum OpKind {
    Dot,
    Field(Vec<String>),
    Var(String, Vec<String>),
    Func(String),
    Str(String),
    Num(Const),
    Bool(bool),
    Nil,
    Sub(Box<Pipeline>, Vec<String>),
}

#[derive(Debug, Clone)]
pub(super) struct Operand {
    pub(super) pos: usize,
    pub(super) kind: OpKind,
}

pub(super) const FUNCS: &[&str] = &[
    "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "len", "index", "print", "printf",
    "println", "html", "urlquery", "call", "js", "slice",
];

pub(super) enum Terminator {
    Eof,
    End(usize),
    Else(usize, Vec<Token>),
}

pub(super) struct Parser {
    pub(super) items: std::vec::IntoIter<Item>,
    pub(super) vars: Vec<String>,
    /// Nesting of control structures: `define` is allowed at 0 only.
    pub(super) depth: usize,
    /// Range bodies around the current list: `break` and `continue` need one.
    pub(super) range_depth: usize,
    /// `define`d and `block` templates, by name.
    pub(super) defines: Vec<(String, Vec<Node>)>,
}

impl Parser {
    pub(super) fn list(&mut self) -> PResult<(Vec<Node>, Terminator)> {
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
                        Tok::Ident(k) if k == "define" => {
                            if self.depth > 0 {
                                return Err((first.pos, "unexpected <define> in command".into()));
                            }
                            let name = template_name(&toks, pos, "define")?;
                            if toks.len() > 2 {
                                return Err((
                                    toks[2].pos,
                                    "unexpected token in define clause".into(),
                                ));
                            }
                            let body = self.definition(pos, "define")?;
                            self.add_define(pos, name, body)?;
                        }
                        Tok::Ident(k) if k == "template" => {
                            let name = template_name(&toks, pos, "template")?;
                            let pipe = if toks.len() > 2 {
                                Some(self.pipeline(toks[2].pos, &toks[2..], true)?)
                            } else {
                                None
                            };
                            nodes.push(Node::Template { pos, name, pipe });
                        }
                        Tok::Ident(k) if k == "block" => {
                            let name = template_name(&toks, pos, "block")?;
                            if toks.len() < 3 {
                                return Err((pos, "missing value for block clause".into()));
                            }
                            let pipe = self.pipeline(toks[2].pos, &toks[2..], true)?;
                            let body = self.definition(pos, "block")?;
                            self.add_define(pos, name.clone(), body)?;
                            nodes.push(Node::Template {
                                pos,
                                name,
                                pipe: Some(pipe),
                            });
                        }
                        Tok::Ident(k) if k == "break" || k == "continue" => {
                            if toks.len() > 1 {
                                return Err((
                                    toks[1].pos,
                                    format!("unexpected token in {{{{{k}}}}}"),
                                ));
                            }
                            if self.range_depth == 0 {
                                return Err((pos, format!("{{{{{k}}}}} outside {{{{range}}}}")));
                            }
                            nodes.push(if k == "break" {
                                Node::Break
                            } else {
                                Node::Continue
                            });
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

    /// A list inside a control structure; `range_body`: a range's body, where `break` and
    /// `continue` are allowed.
    fn nested_list(&mut self, range_body: bool) -> PResult<(Vec<Node>, Terminator)> {
        self.depth += 1;
        self.range_depth += usize::from(range_body);
        let listed = self.list();
        self.range_depth -= usize::from(range_body);
        self.depth -= 1;
        listed
    }

    /// The body of a `define` or `block`, up to its `end`: its own variables (only `$`) and
    /// no enclosing range.
    fn definition(&mut self, pos: usize, kw: &str) -> PResult<Vec<Node>> {
        let vars = std::mem::take(&mut self.vars);
        let range_depth = std::mem::replace(&mut self.range_depth, 0);
        self.depth += 1;
        let listed = self.list();
        self.depth -= 1;
        self.vars = vars;
        self.range_depth = range_depth;
        match listed? {
            (body, Terminator::End(_)) => Ok(body),
            (_, Terminator::Else(p, _)) => Err((p, format!("unexpected else in {kw} clause"))),
            (_, Terminator::Eof) => Err((pos, format!("unexpected EOF: {kw} without end"))),
        }
    }

    /// Go's rule for a second definition: an empty one never replaces, two non-empty ones are
    /// an error.
    pub(super) fn add_define(&mut self, pos: usize, name: String, body: Vec<Node>) -> PResult<()> {
        match self.defines.iter_mut().find(|(n, _)| *n == name) {
            None => self.defines.push((name, body)),
            Some((_, old)) if is_empty_tree(old) => *old = body,
            Some(_) if is_empty_tree(&body) => {}
            Some(_) => {
                return Err((
                    pos,
                    format!("template: multiple definition of template \"{name}\""),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn conditional(&mut self, kw: &str, pos: usize, toks: Vec<Token>) -> PResult<Node> {
        let mark = self.vars.len();
        let mut branches = Vec::new();
        let mut otherwise = Vec::new();
        let mut cond_toks = toks;
        let mut cond_pos = pos;
        loop {
            let pipe = self.pipeline(cond_pos, &cond_toks, true)?;
            // As Go: variables declared in one branch stay declared (for parsing) until the
            // end of the whole if/with; running an unset one is an error.
            let (body, term) = self.nested_list(false)?;
            branches.push((pipe, body));
            match term {
                Terminator::End(_) => break,
                Terminator::Eof => return Err((pos, format!("unexpected EOF: {kw} without end"))),
                Terminator::Else(epos, rest) => {
                    if rest.is_empty() {
                        let (body, term) = self.nested_list(false)?;
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

    pub(super) fn range(&mut self, pos: usize, toks: Vec<Token>) -> PResult<Node> {
        let mark = self.vars.len();
        let pipe = self.pipeline(pos, &toks, true)?;
        if pipe.assign {
            return Err((pos, "range cannot assign to existing variables".into()));
        }
        if pipe.decl.len() > 2 {
            return Err((pos, "range can declare at most two variables".into()));
        }
        let (body, term) = self.nested_list(true)?;
        let otherwise = match term {
            Terminator::End(_) => Vec::new(),
            Terminator::Eof => return Err((pos, "unexpected EOF: range without end".into())),
            Terminator::Else(epos, rest) => {
                if !rest.is_empty() {
                    return Err((epos, "range only takes a plain else".into()));
                }
                let (body, term) = self.nested_list(false)?;
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

    pub(super) fn pipeline(
        &mut self,
        pos: usize,
        toks: &[Token],
        allow_decl: bool,
    ) -> PResult<Pipeline> {
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
        }
        // As Go's parser: a declared (or assigned) name counts as defined from here on, also
        // inside its own pipeline; whether it has a value is checked when it runs.
        for (_, n) in &decl {
            self.vars.push(n.clone());
        }
        let cmds = self.commands(pos, rest)?;
        Ok(Pipeline {
            pos,
            decl,
            assign,
            cmds,
        })
    }

    pub(super) fn commands(&mut self, pos: usize, toks: &[Token]) -> PResult<Vec<Command>> {
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
            // As Go's checkPipeline: only the first command may be a constant or `.`.
            if !cmds.is_empty()
                && matches!(
                    args[0].kind,
                    OpKind::Bool(_) | OpKind::Dot | OpKind::Nil | OpKind::Num(_) | OpKind::Str(_)
                )
            {
                return Err((
                    args[0].pos,
                    format!(
                        "non executable command in pipeline stage {}",
                        cmds.len() + 1
                    ),
                ));
            }
            cmds.push(Command { args });
            i += 1; // the pipe
            // As Go: a pipe at the end of the pipeline is allowed (`{{ .A | }}`).
            if i >= toks.len() {
                return Ok(cmds);
            }
        }
    }

    pub(super) fn chain(toks: &[Token], mut i: usize) -> (Vec<String>, usize) {
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

    pub(super) fn operand(&mut self, toks: &[Token], i: usize) -> PResult<(Operand, usize)> {
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
            Tok::Num(text, complex) => (
                OpKind::Num(constant(text, *complex).map_err(|m| (pos, m))?),
                i + 1,
            ),
            Tok::Ident(k) => match k.as_str() {
                "true" => (OpKind::Bool(true), i + 1),
                "false" => (OpKind::Bool(false), i + 1),
                "nil" => (OpKind::Nil, i + 1),
                _ if FUNCS.contains(&k.as_str()) => (OpKind::Func(k.clone()), i + 1),
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
        if matches!(kind, OpKind::Dot | OpKind::Str(_) | OpKind::Num(_))
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

//! Execution: a parsed tree against the data.

use super::Value;
use super::escape::{html_escape, js_escape, query_escape};
use super::fmt;
use super::funcs::{field, go_eq, go_lt, go_slice};
use super::number::Const;
use super::parser::{Command, Node, OpKind, Operand, Pipeline};

// ---------------------------------------------------------------------------------------------
// Execution

/// How deep `{{template}}` calls may nest (Go allows 100,000; a thread stack does not).
const MAX_TEMPLATE_DEPTH: usize = 200;

/// A `break` or `continue` on its way out to the enclosing range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    Break,
    Continue,
}

pub(super) struct Exec<'a> {
    /// `$`: the data, or the value a `{{template}}` call passed.
    pub(super) root: Value,
    pub(super) vars: Vec<(String, Value)>,
    /// What the template printed: bytes, as Go strings are.
    pub(super) out: Vec<u8>,
    pub(super) defines: &'a [(String, Vec<Node>)],
    pub(super) depth: usize,
    flow: Option<Flow>,
}

pub(super) type EResult<T> = Result<T, (usize, String)>;

impl<'a> Exec<'a> {
    pub(super) fn new(root: Value, defines: &'a [(String, Vec<Node>)]) -> Self {
        Exec {
            root,
            vars: Vec::new(),
            out: Vec::new(),
            defines,
            depth: 0,
            flow: None,
        }
    }

    pub(super) fn nodes(&mut self, nodes: &[Node], dot: &Value) -> EResult<()> {
        for n in nodes {
            if self.flow.is_some() {
                return Ok(());
            }
            match n {
                Node::Break => self.flow = Some(Flow::Break),
                Node::Continue => self.flow = Some(Flow::Continue),
                Node::Template { pos, name, pipe } => {
                    let defines = self.defines;
                    let Some((_, body)) = defines.iter().find(|(n, _)| n == name) else {
                        return Err((*pos, format!("no such template \"{name}\"")));
                    };
                    let new_dot = match pipe {
                        Some(p) => self.pipeline(p, dot)?,
                        None => Value::Nil,
                    };
                    if self.depth >= MAX_TEMPLATE_DEPTH {
                        return Err((
                            *pos,
                            format!("exceeded maximum template depth ({MAX_TEMPLATE_DEPTH})"),
                        ));
                    }
                    // The called template sees only `$`, which is the value passed.
                    let root = std::mem::replace(&mut self.root, new_dot.clone());
                    let vars = std::mem::take(&mut self.vars);
                    self.depth += 1;
                    let ran = self.nodes(body, &new_dot);
                    self.depth -= 1;
                    self.root = root;
                    self.vars = vars;
                    ran?;
                }
                Node::Text(t) => self.out.extend_from_slice(t.as_bytes()),
                Node::Action(p) => {
                    let v = self.pipeline(p, dot)?;
                    if p.decl.is_empty() {
                        fmt::action_text(&v, &mut self.out);
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
                        Value::Nil | Value::NilMap => Vec::new(),
                        // Go 1.22+: an integer n ranges over 0..n, the element only.
                        Value::Int(n) => {
                            if pipe.decl.len() > 1 {
                                return Err((
                                    pipe.pos,
                                    // No value: the int may come from a secret.
                                    "can't use an int to iterate over more than one variable"
                                        .to_string(),
                                ));
                            }
                            (0..n.max(0)).map(|i| (Value::Nil, Value::Int(i))).collect()
                        }
                        // Any integer kind: a byte (`index "ab" 0`) ranges over bytes.
                        Value::Uint8(n) => {
                            if pipe.decl.len() > 1 {
                                return Err((
                                    pipe.pos,
                                    "can't use a uint8 to iterate over more than one variable"
                                        .to_string(),
                                ));
                            }
                            (0..n).map(|i| (Value::Nil, Value::Uint8(i))).collect()
                        }
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
                        if self.flow.take() == Some(Flow::Break) {
                            break;
                        }
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
            OpKind::Num(c) => {
                return match c {
                    Const::Int(n) => Ok(Value::Int(*n)),
                    Const::Float(f) => Ok(Value::Float(*f)),
                    Const::Complex(re, im) => Ok(Value::Complex(*re, *im)),
                    Const::Overflow => Err((a.pos, "number constant overflows int".into())),
                };
            }
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
                    Value::Bytes(b) => b.0.len(),
                    Value::List(l) => l.len(),
                    Value::Map(m) => m.len(),
                    Value::NilMap => 0,
                    other => {
                        return Err((pos, format!("len of type {}", other.type_name())));
                    }
                };
                Ok(Value::Int(i64::try_from(n).unwrap_or(i64::MAX)))
            }
            "eq" => match vals.split_first() {
                Some((first, rest)) => go_eq(first, rest).map(Value::Bool).map_err(|m| (pos, m)),
                None => Err((pos, "wrong number of args for eq: want at least 1".into())),
            },
            "ne" | "lt" | "le" | "gt" | "ge" => {
                want(2)?;
                let (a, b) = (&vals[0], &vals[1]);
                let r = match name {
                    "ne" => go_eq(a, std::slice::from_ref(b)).map(|e| !e),
                    "lt" => go_lt(a, b),
                    "le" => go_lt(a, b).and_then(|l| Ok(l || go_eq(a, std::slice::from_ref(b))?)),
                    "gt" => {
                        go_lt(a, b).and_then(|l| Ok(!(l || go_eq(a, std::slice::from_ref(b))?)))
                    }
                    _ => go_lt(a, b).map(|l| !l),
                };
                r.map(Value::Bool).map_err(|m| (pos, m))
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
                        (Value::NilMap, k) if k.as_bytes().is_some() => Value::Str(String::new()),
                        (Value::Map(mut m), k) => {
                            let key = k.as_bytes().ok_or((
                                pos,
                                format!("cannot index a map with a {}", k.type_name()),
                            ))?;
                            // A key that is not UTF-8 is in no map (their keys are).
                            std::str::from_utf8(key)
                                .ok()
                                .and_then(|k| m.remove(k))
                                .unwrap_or(Value::Str(String::new()))
                        }
                        (Value::List(mut l), Value::Int(i)) => {
                            let idx = usize::try_from(*i)
                                .ok()
                                .filter(|i| *i < l.len())
                                .ok_or((pos, "index out of range".to_string()))?;
                            l.swap_remove(idx)
                        }
                        // A string indexes to its byte (Go's uint8).
                        (
                            c @ (Value::Str(_) | Value::Secret(_) | Value::Bytes(_)),
                            Value::Int(i),
                        ) => {
                            let bytes = c.as_bytes().unwrap_or_default();
                            let b = usize::try_from(*i)
                                .ok()
                                .and_then(|i| bytes.get(i))
                                .ok_or((pos, "string index out of range".to_string()))?;
                            Value::Uint8(*b)
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
            "slice" => match vals.split_first() {
                None => Err((
                    pos,
                    "wrong number of args for slice: want at least 1 got 0".into(),
                )),
                Some((item, indexes)) => {
                    go_slice(item, indexes).map_err(|m| (pos, format!("error calling slice: {m}")))
                }
            },
            // Go's `call fn args…` calls a func value; the template data has none (no field of
            // the Go provider's `profile.Context` and no value a template makes is a func), so
            // every call that runs fails, as in Go, once its arguments are evaluated.
            "call" => match vals.first() {
                None => Err((
                    pos,
                    "wrong number of args for call: want at least 1 got 0".into(),
                )),
                Some(f) => Err((
                    pos,
                    format!(
                        "error calling call: the first argument ({}) is not a function: the \
                         template data holds no functions",
                        fmt::go_type(f)
                    ),
                )),
            },
            "print" | "println" => Ok(Value::from_bytes(fmt::sprint(&vals, name == "println"))),
            "html" => Ok(Value::from_bytes(html_escape(&fmt::eval_args(&vals)))),
            "js" => Ok(Value::from_bytes(js_escape(&fmt::eval_args(&vals)))),
            "urlquery" => Ok(Value::from_bytes(query_escape(&fmt::eval_args(&vals)))),
            "printf" => {
                let Some(format) = vals.first().and_then(Value::as_bytes) else {
                    return Err((
                        pos,
                        "printf needs a string format as its first argument".into(),
                    ));
                };
                Ok(Value::from_bytes(fmt::sprintf(format, &vals[1..])))
            }
            _ => Err((pos, format!("function \"{name}\" not defined"))),
        }
    }
}

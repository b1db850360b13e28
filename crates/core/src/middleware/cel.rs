//! CEL over the call: compiling an expression (a Middleware with one that does not compile
//! is not Ready, with the compiler's message) and evaluating it against a [`CallView`].
//!
//! An expression sees one variable, `call` (see [`CallView::to_json`]), the CEL standard
//! library with its macros (`has`, `all`, `exists`, `exists_one`, `map`, `filter`), and
//! `min`/`max`. Expressions are written by operators; still, their size is bounded
//! ([`MAX_SOURCE_BYTES`], and the parser's nesting limit), they can only name `call`, and
//! evaluating one never panics the caller: every failure is an `Err` with a message.

use super::CallView;
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock};

/// Longest expression source accepted.
pub const MAX_SOURCE_BYTES: usize = 4096;

/// The one variable an expression may name.
pub const CALL: &str = "call";

static ENV: LazyLock<Arc<cel::Env>> = LazyLock::new(|| Arc::new(cel::Env::stdlib()));

/// A compiled CEL expression.
#[derive(Debug)]
pub struct Expression {
    pub source: String,
    program: cel::Program,
    /// How deeply comprehensions (`all`, `exists`, `map`, ...) nest.
    loops: u32,
}

impl Expression {
    /// Compiles `source` (`Err`: the compiler's message).
    pub fn compile(source: &str) -> Result<Self, String> {
        if source.trim().is_empty() {
            return Err("the expression is empty".into());
        }
        if source.len() > MAX_SOURCE_BYTES {
            return Err(format!(
                "the expression is {} bytes long; the limit is {MAX_SOURCE_BYTES}",
                source.len()
            ));
        }
        let program = compile_on_big_stack(source)?;
        let mut shape = Shape::default();
        shape.walk(program.expression(), 1, 0);
        if shape.depth > MAX_DEPTH {
            return Err(format!(
                "the expression nests {} levels deep; the limit is {MAX_DEPTH}",
                shape.depth
            ));
        }
        // The variables comprehensions bind (`call.args.tags.all(t, t != "")`) are
        // referenced too; an expression naming anything else could never evaluate.
        if let Some(unknown) = program
            .references()
            .variables()
            .into_iter()
            .find(|v| *v != CALL && !shape.bound.iter().any(|b| b == v))
        {
            return Err(format!(
                "undeclared reference to {unknown:?} (an expression sees only `call`)"
            ));
        }
        Ok(Expression {
            source: source.to_string(),
            program,
            loops: shape.loops,
        })
    }

    /// Evaluates to a boolean (`Err`: an evaluation error, or a value that is not one).
    pub fn eval_bool(&self, call: &CallView) -> Result<bool, String> {
        match self.eval(call)? {
            cel::Value::Bool(b) => Ok(b),
            other => Err(format!(
                "{:?} evaluated to a {}, not a bool",
                self.source,
                other.type_of()
            )),
        }
    }

    /// Evaluates to a JSON value (for a rewrite's `set`).
    pub fn eval_json(&self, call: &CallView) -> Result<Value, String> {
        let value = self.eval(call)?;
        to_json(&value).map_err(|e| format!("{:?}: {e}", self.source))
    }

    fn eval(&self, call: &CallView) -> Result<cel::Value, String> {
        let json = call.to_json();
        if self.loops > 0 {
            // Work grows with the input's size to the power of the comprehensions' nesting
            // (plus one: a step in a loop may scan a string): bound it before starting.
            let size =
                serde_json::to_string(&json).map_or(usize::MAX, |t| t.len()) + self.source.len();
            let limit = MAX_WORK.powf(1.0 / f64::from(self.loops + 1)) as usize;
            if size > limit {
                return Err(format!(
                    "{:?}: the call is {size} bytes; with comprehensions nested {} deep an \
                     expression evaluates over at most {limit}",
                    self.source, self.loops
                ));
            }
        }
        let input = to_cel(&json);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut context = cel::Context::with_env(ENV.clone());
            context
                .add_function("min", cel::functions::min)
                .map_err(|e| e.to_string())?;
            context
                .add_function("max", cel::functions::max)
                .map_err(|e| e.to_string())?;
            context.add_variable_from_value(CALL, input);
            self.program
                .execute(&context)
                .map_err(|e| format!("{:?}: {e}", self.source))
        }));
        match outcome {
            Ok(result) => result,
            Err(_) => Err(format!("{:?}: the CEL evaluator failed", self.source)),
        }
    }
}

/// Bound of an evaluation's work, in steps over the bytes of the call: with comprehensions
/// nested `d` deep, a call of `n` bytes is evaluated only when `n^(d+1)` stays below it.
pub const MAX_WORK: f64 = 1e9;

/// Deepest expression tree accepted: evaluation recurses once per level, on the
/// caller's stack.
pub const MAX_DEPTH: usize = 48;

/// Stack of the thread that parses (the generated parser recurses deeply per level).
const PARSER_STACK_BYTES: usize = 64 << 20;

/// Parses on a thread of its own with a large stack, so that no expression (they nest at
/// most [`MAX_SOURCE_BYTES`] levels) can overflow the caller's.
fn compile_on_big_stack(source: &str) -> Result<cel::Program, String> {
    let owned = source.to_string();
    let parse = move || {
        catch_unwind(AssertUnwindSafe(|| ENV.compile(&owned)))
            .map_err(|_| "the CEL compiler failed on this expression".to_string())?
            .map_err(|e| e.to_string())
    };
    std::thread::Builder::new()
        .name("cel-compile".into())
        .stack_size(PARSER_STACK_BYTES)
        .spawn(parse)
        .map_err(|e| format!("could not start the CEL compiler: {e}"))?
        .join()
        .map_err(|_| "the CEL compiler failed on this expression".to_string())?
}

/// An expression tree's depth and the variables its comprehensions bind.
#[derive(Default)]
struct Shape {
    depth: usize,
    /// Deepest nesting of comprehensions.
    loops: u32,
    bound: Vec<String>,
}

impl Shape {
    fn walk(&mut self, e: &cel::IdedExpr, level: usize, loops: u32) {
        use cel::common::ast::{EntryExpr, Expr};
        self.depth = self.depth.max(level);
        self.loops = self.loops.max(loops);
        if level > MAX_DEPTH {
            return;
        }
        let next = level + 1;
        match &e.expr {
            Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    self.walk(t, next, loops);
                }
                for a in &c.args {
                    self.walk(a, next, loops);
                }
            }
            Expr::Comprehension(c) => {
                self.bound.push(c.iter_var.clone());
                self.bound.extend(c.iter_var2.iter().cloned());
                self.bound.push(c.accu_var.clone());
                for once in [&c.iter_range, &c.accu_init, &c.result] {
                    self.walk(once, next, loops);
                }
                for each in [&c.loop_cond, &c.loop_step] {
                    self.walk(each, next, loops + 1);
                }
            }
            Expr::List(l) => {
                for x in &l.elements {
                    self.walk(x, next, loops);
                }
            }
            Expr::Select(s) => self.walk(&s.operand, next, loops),
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            self.walk(&me.key, next, loops);
                            self.walk(&me.value, next, loops);
                        }
                        EntryExpr::StructField(f) => self.walk(&f.value, next, loops),
                    }
                }
            }
            Expr::Struct(st) => {
                for entry in &st.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            self.walk(&me.key, next, loops);
                            self.walk(&me.value, next, loops);
                        }
                        EntryExpr::StructField(f) => self.walk(&f.value, next, loops),
                    }
                }
            }
        }
    }
}

/// A JSON value as CEL sees it: integers stay integers (unsigned past `i64`), other
/// numbers are doubles.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                cel::Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                cel::Value::UInt(u)
            } else {
                cel::Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let map: HashMap<cel::objects::Key, cel::Value> = map
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::from(map)
        }
    }
}

/// A CEL value as JSON (`Err`: a value JSON cannot hold: a non-finite double, bytes, a
/// function, a duration or timestamp, a map keyed by something else than strings).
fn to_json(value: &cel::Value) -> Result<Value, String> {
    Ok(match value {
        cel::Value::Null => Value::Null,
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .ok_or_else(|| format!("{f} is not a JSON number"))?,
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::List(items) => {
            Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?)
        }
        cel::Value::Map(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map.map.iter() {
                let cel::objects::Key::String(k) = k else {
                    return Err(format!("a map key {k} is not a string"));
                };
                out.insert(k.to_string(), to_json(v)?);
            }
            Value::Object(out)
        }
        other => return Err(format!("a {} is not a JSON value", other.type_of())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Effect;
    use serde_json::json;

    fn call(args: Value) -> CallView {
        CallView {
            agent: "reporter".into(),
            namespace: "team".into(),
            tool: "semver".into(),
            command: "compare".into(),
            args: args.as_object().cloned().unwrap_or_default(),
            effect: Effect::Write,
            release: "1.2.0".into(),
            dry_run: false,
        }
    }

    fn eval_bool(source: &str, args: Value) -> Result<bool, String> {
        Expression::compile(source)?.eval_bool(&call(args))
    }

    #[test]
    fn every_field_of_call_is_visible() {
        let c = json!({"a": "1.0.0", "limit": 50, "tags": ["x", "y"], "deep": {"k": true}});
        for source in [
            r#"call.agent == "reporter""#,
            r#"call.namespace == "team""#,
            r#"call.tool == "semver" && call.command == "compare""#,
            r#"call.effect == "write""#,
            r#"call.release == "1.2.0""#,
            "!call.dryRun",
            r#"call.args.a == "1.0.0""#,
            "call.args.limit > 10",
            r#""x" in call.args.tags"#,
            "call.args.deep.k",
            r#"has(call.args.limit) && !has(call.args.missing)"#,
            r#"call.args.tags.exists(t, t == "y")"#,
            r#"call.tool.startsWith("sem")"#,
            "size(call.args) == 4",
        ] {
            assert_eq!(eval_bool(source, c.clone()), Ok(true), "{source}");
        }
        assert_eq!(eval_bool(r#"call.command == "parse""#, c), Ok(false));
    }

    #[test]
    fn a_syntax_error_is_the_compilers_message() {
        let e = Expression::compile("call.tool ==").unwrap_err();
        assert!(!e.is_empty());
        assert!(Expression::compile("call.tool == 'a' &&& x").is_err());
        assert!(Expression::compile("  ").is_err());
        let long = format!("call.tool == \"{}\"", "a".repeat(MAX_SOURCE_BYTES));
        assert!(Expression::compile(&long).unwrap_err().contains("limit"));
    }

    #[test]
    fn only_call_may_be_named() {
        let e = Expression::compile("request.tool == 'x'").unwrap_err();
        assert!(e.contains("request"), "{e}");
        assert!(Expression::compile("call.args.tags.all(t, t != '')").is_ok());
    }

    #[test]
    fn deep_nesting_is_refused_not_a_crash() {
        for source in [
            format!("{}true{}", "(".repeat(1000), ")".repeat(1000)),
            format!("1{} == 1", " + 1".repeat(800)),
            format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
        ] {
            assert!(Expression::compile(&source).is_err(), "{}", &source[..20]);
        }
        // The parser folds repeated negations.
        let e = Expression::compile(&format!("{}true", "!".repeat(2001))).unwrap();
        assert_eq!(e.eval_bool(&call(json!({}))), Ok(false));
        // Up to the limit it evaluates, on this (small) stack.
        let source = format!(
            "{}true{}",
            "[".repeat(MAX_DEPTH - 3),
            "]".repeat(MAX_DEPTH - 3)
        );
        let e = Expression::compile(&format!("size({source}) == 1")).unwrap();
        assert_eq!(e.eval_bool(&call(json!({}))), Ok(true));
        let e = Expression::compile(&format!("1{} == {}", " + 1".repeat(40), 41)).unwrap();
        assert_eq!(e.eval_bool(&call(json!({}))), Ok(true));
    }

    #[test]
    fn nested_comprehensions_over_a_large_call_are_refused_before_running() {
        let e = Expression::compile("call.args.l.all(x, call.args.l.exists(y, y == x))").unwrap();
        assert_eq!(e.loops, 2);
        assert_eq!(e.eval_bool(&call(json!({"l": [1, 2, 3]}))), Ok(true));
        let big: Vec<u32> = (0..1000).collect();
        let err = e.eval_bool(&call(json!({"l": big}))).unwrap_err();
        assert!(err.contains("at most"), "{err}");
        // One level handles it; none has no bound but the input's size.
        let e = Expression::compile("call.args.l.all(x, x >= 0)").unwrap();
        assert_eq!(e.loops, 1);
        assert_eq!(e.eval_bool(&call(json!({"l": big}))), Ok(true));
        assert_eq!(
            Expression::compile("size(call.args.l) > 1").unwrap().loops,
            0
        );
    }

    #[test]
    fn evaluation_errors_are_errors() {
        // A missing argument.
        let e = eval_bool("call.args.nope == 1", json!({})).unwrap_err();
        assert!(e.contains("nope"), "{e}");
        // Not a bool.
        let e = eval_bool("call.tool", json!({})).unwrap_err();
        assert!(e.contains("not a bool"), "{e}");
        // Division by zero, type mismatch.
        assert!(eval_bool("1 / 0 == 1", json!({})).is_err());
        assert!(eval_bool("call.tool + 1 == 2", json!({})).is_err());
    }

    #[test]
    fn values_come_back_as_json() {
        let view = call(json!({"limit": 50, "name": "a"}));
        let eval = |s: &str| Expression::compile(s).unwrap().eval_json(&view);
        assert_eq!(eval("min(call.args.limit, 10)"), Ok(json!(10)));
        assert_eq!(eval("max(call.args.limit, 10)"), Ok(json!(50)));
        assert_eq!(eval(r#""main""#), Ok(json!("main")));
        assert_eq!(eval(r#"call.args.name + "-x""#), Ok(json!("a-x")));
        assert_eq!(
            eval("[1, 2.5, true, null]"),
            Ok(json!([1, 2.5, true, null]))
        );
        assert_eq!(
            eval(r#"{"k": [call.agent]}"#),
            Ok(json!({"k": ["reporter"]}))
        );
        assert_eq!(eval("call.args"), Ok(json!({"limit": 50, "name": "a"})));
        assert!(eval("{1: 2}").is_err());
        assert!(eval("b'xy'").is_err());
    }
}

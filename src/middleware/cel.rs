//! CEL over the call: compiling an expression (a Middleware with one that does not compile
//! is not Ready, with the compiler's message) and evaluating it against a [`CallView`].
//!
//! CONTRACT(issue 10, helper A): implement with the `cel` crate.

use super::CallView;
use serde_json::Value;

/// A compiled CEL expression.
#[derive(Debug)]
pub struct Expression {
    pub source: String,
}

impl Expression {
    /// Compiles `source` (`Err`: the compiler's message).
    pub fn compile(source: &str) -> Result<Self, String> {
        Ok(Expression {
            source: source.to_string(),
        })
    }

    /// Evaluates to a boolean (`Err`: an evaluation error, or a value that is not one).
    pub fn eval_bool(&self, _call: &CallView) -> Result<bool, String> {
        Err(format!("CEL is not implemented yet ({})", self.source))
    }

    /// Evaluates to a JSON value (for a rewrite's `set`).
    pub fn eval_json(&self, _call: &CallView) -> Result<Value, String> {
        Err(format!("CEL is not implemented yet ({})", self.source))
    }
}

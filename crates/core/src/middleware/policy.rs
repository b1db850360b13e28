//! Policy: ordered rules, the first whose `when` holds decides allow, deny or rewrite.
//! No rule holding applies `default`.
//!
//! A rewrite changes the command (when it names one) and the arguments: the call's current
//! arguments, then every `set` (by name, each value a CEL expression over the call as it
//! came in), then every `remove`. The gateway validates and authorizes the rewritten call
//! again before the next step sees it.

use super::cel::Expression;
use super::{CallView, Rewrite, StepOutcome};
use crate::spec::{PolicyAction, PolicyDefault, PolicyStep};

/// A policy step, compiled.
#[derive(Debug)]
pub struct Policy {
    pub spec: PolicyStep,
    rules: Vec<Rule>,
}

#[derive(Debug)]
struct Rule {
    /// `None`: every call.
    when: Option<Expression>,
    action: Action,
}

#[derive(Debug)]
enum Action {
    Allow,
    Deny(String),
    Rewrite {
        command: Option<String>,
        set: Vec<(String, Expression)>,
        remove: Vec<String>,
    },
}

impl Policy {
    /// Compiles every expression of `spec` (`Err`: the field and the compiler's message,
    /// `rules[1].when: ...`).
    pub fn compile(spec: &PolicyStep) -> Result<Self, String> {
        let mut rules = Vec::with_capacity(spec.rules.len());
        for (i, rule) in spec.rules.iter().enumerate() {
            let when = match &rule.when {
                Some(source) => {
                    Some(Expression::compile(source).map_err(|e| format!("rules[{i}].when: {e}"))?)
                }
                None => None,
            };
            let action = match (rule.action, &rule.rewrite) {
                (PolicyAction::Rewrite, None) => {
                    return Err(format!(
                        "rules[{i}].rewrite: a rewrite rule says what it changes"
                    ));
                }
                (PolicyAction::Allow | PolicyAction::Deny, Some(_)) => {
                    return Err(format!(
                        "rules[{i}].rewrite: only a rule with action rewrite rewrites"
                    ));
                }
                (PolicyAction::Allow, None) => Action::Allow,
                (PolicyAction::Deny, None) => Action::Deny(if rule.message.is_empty() {
                    format!("rule {i} denies it")
                } else {
                    rule.message.clone()
                }),
                (PolicyAction::Rewrite, Some(rewrite)) => {
                    if rewrite.command.is_none()
                        && rewrite.set.is_empty()
                        && rewrite.remove.is_empty()
                    {
                        return Err(format!("rules[{i}].rewrite: set a command, set or remove"));
                    }
                    if let Some(name) = rewrite.remove.iter().find(|n| rewrite.set.contains_key(*n))
                    {
                        return Err(format!(
                            "rules[{i}].rewrite: {name:?} is both set and removed"
                        ));
                    }
                    let mut set = Vec::with_capacity(rewrite.set.len());
                    for (name, source) in &rewrite.set {
                        let e = Expression::compile(source)
                            .map_err(|e| format!("rules[{i}].rewrite.set.{name}: {e}"))?;
                        set.push((name.clone(), e));
                    }
                    Action::Rewrite {
                        command: rewrite.command.clone(),
                        set,
                        remove: rewrite.remove.clone(),
                    }
                }
            };
            rules.push(Rule { when, action });
        }
        Ok(Policy {
            spec: spec.clone(),
            rules,
        })
    }

    /// What the policy decides about `call`.
    pub fn decide(&self, call: &CallView) -> StepOutcome {
        for (i, rule) in self.rules.iter().enumerate() {
            let holds = match &rule.when {
                None => true,
                Some(when) => match when.eval_bool(call) {
                    Ok(holds) => holds,
                    Err(e) => return StepOutcome::Failed(format!("rules[{i}].when: {e}")),
                },
            };
            if !holds {
                continue;
            }
            return match &rule.action {
                Action::Allow => StepOutcome::Allow,
                Action::Deny(message) => StepOutcome::Deny(message.clone()),
                Action::Rewrite {
                    command,
                    set,
                    remove,
                } => {
                    let mut args = call.args.clone();
                    for (name, e) in set {
                        match e.eval_json(call) {
                            Ok(value) => {
                                args.insert(name.clone(), value);
                            }
                            Err(e) => {
                                return StepOutcome::Failed(format!(
                                    "rules[{i}].rewrite.set.{name}: {e}"
                                ));
                            }
                        }
                    }
                    for name in remove {
                        args.remove(name);
                    }
                    StepOutcome::Rewrite(Rewrite {
                        command: command.clone().unwrap_or_else(|| call.command.clone()),
                        args,
                    })
                }
            };
        }
        match self.spec.default {
            PolicyDefault::Allow => StepOutcome::Allow,
            PolicyDefault::Deny => StepOutcome::Deny(if self.spec.message.is_empty() {
                "no rule allows it".to_string()
            } else {
                self.spec.message.clone()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Effect;
    use serde_json::json;

    fn policy(yaml: &str) -> Result<Policy, String> {
        let spec: PolicyStep = serde_yaml::from_str(yaml).expect("a policy spec");
        Policy::compile(&spec)
    }

    fn call(command: &str, args: serde_json::Value) -> CallView {
        CallView {
            agent: "reporter".into(),
            namespace: "team".into(),
            tool: "semver".into(),
            command: command.into(),
            args: args.as_object().cloned().unwrap_or_default(),
            effect: Effect::Read,
            release: "1.0.0".into(),
            dry_run: false,
        }
    }

    const RULES: &str = r#"
rules:
  - when: 'call.command == "parse"'
    action: allow
  - when: 'call.command == "compare" && call.args.a == "0.0.0"'
    action: deny
    message: zero is not a version we compare
  - when: 'call.command == "compare" && has(call.args.b) && call.args.b == "latest"'
    action: rewrite
    rewrite:
      set: {b: '"9.9.9"', note: 'call.agent + "/" + call.args.a'}
      remove: [extra]
  - when: 'call.command == "bump"'
    action: rewrite
    rewrite: {command: parse}
  - when: 'call.command == "broken"'
    action: deny
default: deny
message: only listed calls
"#;

    #[test]
    fn the_first_rule_that_holds_decides() {
        let p = policy(RULES).unwrap();
        assert_eq!(p.decide(&call("parse", json!({}))), StepOutcome::Allow);
        assert_eq!(
            p.decide(&call("compare", json!({"a": "0.0.0", "b": "latest"}))),
            StepOutcome::Deny("zero is not a version we compare".into())
        );
        assert_eq!(
            p.decide(&call(
                "compare",
                json!({"a": "1.0.0", "b": "latest", "extra": 1})
            )),
            StepOutcome::Rewrite(Rewrite {
                command: "compare".into(),
                args: json!({"a": "1.0.0", "b": "9.9.9", "note": "reporter/1.0.0"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            })
        );
        assert_eq!(
            p.decide(&call("bump", json!({"v": "1.0.0"}))),
            StepOutcome::Rewrite(Rewrite {
                command: "parse".into(),
                args: json!({"v": "1.0.0"}).as_object().cloned().unwrap(),
            })
        );
        assert_eq!(
            p.decide(&call("broken", json!({}))),
            StepOutcome::Deny("rule 4 denies it".into())
        );
    }

    #[test]
    fn no_rule_holding_applies_the_default() {
        let p = policy(RULES).unwrap();
        assert_eq!(
            p.decide(&call("compare", json!({"a": "1.0.0", "b": "2.0.0"}))),
            StepOutcome::Deny("only listed calls".into())
        );
        let p = policy("rules: [{when: 'false', action: deny}]\ndefault: deny").unwrap();
        assert_eq!(
            p.decide(&call("x", json!({}))),
            StepOutcome::Deny("no rule allows it".into())
        );
        let p = policy("rules: [{when: 'false', action: deny}]").unwrap();
        assert_eq!(p.decide(&call("x", json!({}))), StepOutcome::Allow);
        let p = policy("rules: [{action: deny, message: never}]").unwrap();
        assert_eq!(
            p.decide(&call("x", json!({}))),
            StepOutcome::Deny("never".into())
        );
    }

    #[test]
    fn an_evaluation_error_fails_the_step() {
        let p = policy("rules: [{when: 'call.args.limit > 3', action: deny}]").unwrap();
        let StepOutcome::Failed(m) = p.decide(&call("x", json!({}))) else {
            panic!("expected Failed");
        };
        assert!(m.starts_with("rules[0].when: "), "{m}");
        let p = policy("rules: [{when: 'call.tool', action: allow}]").unwrap();
        assert!(matches!(
            p.decide(&call("x", json!({}))),
            StepOutcome::Failed(_)
        ));
        let p =
            policy("rules: [{action: rewrite, rewrite: {set: {n: 'call.args.n + 1'}}}]").unwrap();
        let StepOutcome::Failed(m) = p.decide(&call("x", json!({"n": "a"}))) else {
            panic!("expected Failed");
        };
        assert!(m.starts_with("rules[0].rewrite.set.n: "), "{m}");
    }

    #[test]
    fn compile_errors_name_the_field() {
        let e =
            policy("rules: [{action: allow}, {when: 'call.tool ==', action: allow}]").unwrap_err();
        assert!(e.starts_with("rules[1].when: "), "{e}");
        let e = policy("rules: [{action: rewrite, rewrite: {set: {b: '1 +'}}}]").unwrap_err();
        assert!(e.starts_with("rules[0].rewrite.set.b: "), "{e}");
        let e = policy("rules: [{action: rewrite}]").unwrap_err();
        assert!(e.starts_with("rules[0].rewrite: "), "{e}");
        let e = policy("rules: [{action: deny, rewrite: {command: x}}]").unwrap_err();
        assert!(e.starts_with("rules[0].rewrite: "), "{e}");
        let e = policy("rules: [{action: rewrite, rewrite: {}}]").unwrap_err();
        assert!(e.starts_with("rules[0].rewrite: "), "{e}");
        let e = policy("rules: [{action: rewrite, rewrite: {set: {a: '1'}, remove: [a]}}]")
            .unwrap_err();
        assert!(e.contains("both set and removed"), "{e}");
        let e = policy("rules: [{when: 'other == 1', action: allow}]").unwrap_err();
        assert!(e.starts_with("rules[0].when: undeclared reference"), "{e}");
    }
}

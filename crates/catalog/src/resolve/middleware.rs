//! Middleware: checked, and compiled into a step (an expression, or a wasm component);
//! one that does not compile is not Ready and not in the snapshot.

use super::Resolver;
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{Kind, KindStatus, Middleware};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::FieldError;

impl<'a> Resolver<'a> {
    pub(super) fn middleware(&mut self) -> BTreeMap<ObjectKey, &'a Middleware> {
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Middleware, &self.input.set.middleware) {
            match check_middleware(d.object) {
                Err(e) => self.invalid(&d, e),
                Ok(step) => {
                    let columns = vec![
                        ("Step".into(), step.to_string()),
                        ("Enforce".into(), d.object.spec.enforce.to_string()),
                    ];
                    let compiled = match &d.object.spec.wasm {
                        Some(wasm) => {
                            self.wasm_step(&d.id.key, wasm)
                                .map_err(|(reason, message)| {
                                    (reason, format!("{message}{}", d.source.suffix()))
                                })
                        }
                        None => crate::middleware::compile(&d.object.spec).map_err(|e| {
                            (
                                Reason::InvalidExpression,
                                format!("spec.{step}.{e}{}", d.source.suffix()),
                            )
                        }),
                    };
                    let ready = match compiled {
                        Ok(compiled) => {
                            self.snapshot.middleware.insert(
                                d.id.key.clone(),
                                Arc::new(toolgrid_core::middleware::ResolvedMiddleware {
                                    key: d.id.key.clone(),
                                    enforce: d.object.spec.enforce,
                                    step: compiled,
                                }),
                            );
                            Desired::ready(Reason::Resolved, format!("{step} step"))
                        }
                        Err((reason, message)) => {
                            tracing::warn!(kind = %d.id.kind, resource = %d.id.key, "{message}");
                            Desired::not_ready(reason, message)
                        }
                    };
                    self.record_declared(&d, ready, KindStatus::empty(Kind::Middleware), columns);
                    valid.insert(d.id.key.clone(), d.object);
                }
            }
        }
        valid
    }

    /// The step of a wasm Middleware `key`, or why it has none (a condition reason and
    /// message): its component is loading, missing, wrong, or its limits are.
    fn wasm_step(
        &self,
        key: &ObjectKey,
        spec: &toolgrid_api::WasmStep,
    ) -> Result<toolgrid_core::middleware::Step, (Reason, String)> {
        use crate::artifacts::WasmArtifact;
        match self.input.wasm.get(key) {
            None => Err((
                Reason::ArtifactPending,
                "spec.wasm.artifact has not been loaded yet".into(),
            )),
            Some(WasmArtifact::Failed { reason, message }) => Err((*reason, message.clone())),
            Some(WasmArtifact::Ready { digest, bytes }) => {
                toolgrid_core::middleware::compile_wasm(spec, digest, bytes.clone())
                    .map_err(|m| (Reason::InvalidSpec, m))
            }
        }
    }
}

fn check_middleware(middleware: &Middleware) -> Result<&'static str, FieldError> {
    let spec = &middleware.spec;
    let steps = spec.steps();
    let [step] = steps.as_slice() else {
        return Err(FieldError::new(
            "spec",
            format!(
                "set exactly one of policy, approval, redact, audit, rateLimit or wasm (found {})",
                if steps.is_empty() {
                    "none".to_string()
                } else {
                    steps.join(", ")
                }
            ),
        ));
    };
    if let Some(policy) = &spec.policy
        && policy.rules.is_empty()
        && policy.default == toolgrid_api::PolicyDefault::Allow
    {
        return Err(FieldError::new(
            "spec.policy.rules",
            "give at least one rule (or default: deny)",
        ));
    }
    if let Some(rate) = &spec.rate_limit
        && (rate.requests == 0 || rate.per.get().is_zero())
    {
        return Err(FieldError::new(
            "spec.rateLimit",
            "requests and per must be above zero",
        ));
    }
    if let Some(redact) = &spec.redact {
        for (i, path) in redact.paths.iter().enumerate() {
            if !path.is_empty() && !path.starts_with('/') {
                return Err(FieldError::new(
                    format!("spec.redact.paths[{i}]"),
                    format!("{path:?} is not a JSON pointer (it starts with /)"),
                ));
            }
        }
        for (i, pattern) in redact.patterns.iter().enumerate() {
            if let Err(error) = toolgrid_core::middleware::redact::compile_pattern(pattern) {
                return Err(FieldError::new(
                    format!("spec.redact.patterns[{i}]"),
                    format!("{pattern:?} is not a usable regular expression: {error}"),
                ));
            }
        }
    }
    Ok(step)
}

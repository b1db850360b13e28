//! Runs a bound call's middleware chain at admission (the order is
//! [`toolgrid_core::middleware`]'s): deciding steps in chain order, each rewrite checked again as
//! the rewritten call, then the approval the call may have to wait for. The result-side
//! steps (redact, audit) are only collected here, into the call's [`ChainRecord`]; the
//! scheduler and the store apply them when the call ends.

use super::{Gateway, authz};
use std::sync::Arc;
use toolgrid_api::Effect;
use toolgrid_catalog::middleware::{Chain, chain_for};
use toolgrid_catalog::{ResolvedTool, Snapshot};
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{
    AuditOptions, ChainRecord, Decision, RedactRules, StepKind, Verdict, now_ms,
};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::interface::{CommandInterface, ValidArgs};
use toolgrid_core::middleware::{CallView, Step, StepOutcome};

/// A call on its way through admission: what the chain may change.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub command: Arc<CommandInterface>,
    pub args: ValidArgs,
    pub grant: authz::Grant,
    /// The version of the release the call runs (CEL's `call.release`).
    pub release_version: String,
}

/// A refusal, with the decisions made before it (for the audit record).
#[derive(Debug)]
pub(crate) struct Refused {
    pub error: ApiError,
    pub decisions: Vec<Decision>,
    /// The chain's audit steps, when the refusal came after the chain was known: they
    /// shape the refusal's audit record (excluded arguments, a copy on stdout).
    pub audit: Option<AuditOptions>,
    /// The command and validated arguments, once admission knew them (the audit record
    /// names them rather than what the caller sent).
    pub call: Option<(String, serde_json::Value)>,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Refused {
            error,
            decisions: Vec::new(),
            audit: None,
            call: None,
        }
    }
}

/// The union of a chain's audit steps, if it has any.
pub(crate) fn audit_options(chain: &Chain) -> Option<AuditOptions> {
    let mut all: Option<AuditOptions> = None;
    for link in &chain.links {
        if let Step::Audit(options) = &link.step {
            let all = all.get_or_insert_with(Default::default);
            all.exclude_args
                .extend(options.exclude_args.iter().cloned());
            all.stdout |= options.stdout;
        }
    }
    all
}

fn decision(link: &str, kind: StepKind, verdict: Verdict, message: impl Into<String>) -> Decision {
    Decision {
        middleware: link.to_string(),
        kind,
        verdict,
        message: message.into(),
    }
}

impl Gateway {
    /// The chain of `caller`'s call through its binding: empty for an operator's own call
    /// (operators are not bound; their calls are audited), refused when a Middleware the
    /// binding needs is not Ready.
    pub(crate) fn chain_of(
        snapshot: &Snapshot,
        caller: &Principal,
        grant: &authz::Grant,
    ) -> Result<Chain, ApiError> {
        let (Principal::Agent { .. }, Some(binding)) = (caller, grant.binding.as_ref()) else {
            return Ok(Chain::default());
        };
        let Some(binding) = snapshot.bindings.get(binding) else {
            return Err(ApiError::new(
                ErrorKind::Internal,
                "the catalog changed while the call was authorized",
            ));
        };
        chain_for(snapshot, binding)
            .map_err(|e| ApiError::new(ErrorKind::MiddlewareFailed, e.to_string()))
    }

    fn view(
        caller: &Principal,
        tool: &ResolvedTool,
        candidate: &Candidate,
        namespace: &str,
        dry_run: bool,
    ) -> CallView {
        CallView {
            agent: authz::agent_scope(caller).to_string(),
            namespace: namespace.to_string(),
            tool: tool.key.name.clone(),
            command: candidate.command.name.clone(),
            args: candidate.args.0.clone(),
            effect: tool.effect,
            release: candidate.release_version.clone(),
            dry_run,
        }
    }

    /// Runs the chain over `candidate`, which it may rewrite. Returns what the call keeps
    /// of it; an approval that applies is in [`ChainRecord::approval`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_chain(
        &self,
        snapshot: &Snapshot,
        caller: &Principal,
        tool: &ResolvedTool,
        namespace: &str,
        candidate: &mut Candidate,
        stdin: Option<&[u8]>,
        dry_run: bool,
    ) -> Result<ChainRecord, Refused> {
        let chain = Self::chain_of(snapshot, caller, &candidate.grant)?;
        let mut record = ChainRecord::default();
        let audit = audit_options(&chain);
        let refuse = |record: &mut ChainRecord, d: Decision, error: ApiError| Refused {
            error,
            decisions: {
                record.decisions.push(d);
                std::mem::take(&mut record.decisions)
            },
            audit: audit.clone(),
            call: None,
        };

        // 1. Deciding steps, in chain order.
        for link in &chain.links {
            let name = link.name();
            let view = Self::view(caller, tool, candidate, namespace, dry_run);
            let outcome = match &link.step {
                Step::RateLimit(limit) => {
                    let key = limit.bucket_key(&link.key, &view);
                    match self
                        .store
                        .take_token(&key, limit.burst, limit.per_second, now_ms())
                        .await
                    {
                        Ok(None) => StepOutcome::Allow,
                        Ok(Some(retry_ms)) => {
                            let message = format!(
                                "rate limit {name}: no calls left for {key}; retry in {retry_ms} ms"
                            );
                            let d = decision(name, StepKind::RateLimit, Verdict::Deny, &message);
                            return Err(refuse(
                                &mut record,
                                d,
                                ApiError::new(ErrorKind::RateLimited, message)
                                    .with_retry_after(retry_ms),
                            ));
                        }
                        Err(e) => {
                            let message = format!("rate limit {name}: the store failed: {e}");
                            let d = decision(name, StepKind::RateLimit, Verdict::Error, &message);
                            return Err(refuse(
                                &mut record,
                                d,
                                ApiError::new(ErrorKind::Unavailable, message),
                            ));
                        }
                    }
                }
                Step::Policy(policy) => policy.decide(&view),
                Step::Wasm(module) => self.wasm.decide(name, module, &view).await,
                Step::Approval(_) | Step::Redact(_) | Step::Audit(_) => continue,
            };
            let kind = link.step.kind();
            match outcome {
                StepOutcome::Allow => {
                    record
                        .decisions
                        .push(decision(name, kind, Verdict::Allow, ""));
                }
                StepOutcome::Deny(message) => {
                    let message = format!("{kind} {name} denied the call: {message}");
                    let d = decision(name, kind, Verdict::Deny, &message);
                    return Err(refuse(
                        &mut record,
                        d,
                        ApiError::new(ErrorKind::Denied, message),
                    ));
                }
                StepOutcome::Failed(message) => {
                    let message =
                        format!("{kind} {name} failed, so the call is refused: {message}");
                    let d = decision(name, kind, Verdict::Error, &message);
                    return Err(refuse(
                        &mut record,
                        d,
                        ApiError::new(ErrorKind::MiddlewareFailed, message),
                    ));
                }
                StepOutcome::Rewrite(rewrite) => {
                    let summary = format!(
                        "{} {} -> {} {}",
                        candidate.command.name,
                        serde_json::Value::Object(candidate.args.0.clone()),
                        rewrite.command,
                        serde_json::Value::Object(rewrite.args.clone())
                    );
                    match self.recheck(snapshot, caller, tool, candidate, stdin, rewrite) {
                        Ok(()) => {
                            record
                                .decisions
                                .push(decision(name, kind, Verdict::Rewrite, summary))
                        }
                        Err(error) => {
                            let message = format!(
                                "{kind} {name} rewrote the call ({summary}): {}",
                                error.message
                            );
                            let d = decision(name, kind, Verdict::Deny, &message);
                            return Err(refuse(&mut record, d, ApiError::new(error.kind, message)));
                        }
                    }
                }
            }
        }

        // 3. Approval: the first approval step whose `when` holds. A dry run of a command
        // that does not run needs none.
        let runs = !dry_run || tool.effect == Effect::Read;
        for link in &chain.links {
            let Step::Approval(rule) = &link.step else {
                continue;
            };
            let name = link.name();
            if !runs {
                record.decisions.push(decision(
                    name,
                    StepKind::Approval,
                    Verdict::Allow,
                    "a dry run that does not run needs no approval",
                ));
                break;
            }
            let view = Self::view(caller, tool, candidate, namespace, dry_run);
            match rule.matches(&view) {
                Ok(false) => {
                    record
                        .decisions
                        .push(decision(name, StepKind::Approval, Verdict::Allow, ""))
                }
                Ok(true) => {
                    record.decisions.push(decision(
                        name,
                        StepKind::Approval,
                        Verdict::AwaitApproval,
                        "",
                    ));
                    record.approval = Some(rule.wait(name, now_ms()));
                    break;
                }
                Err(message) => {
                    let message =
                        format!("approval {name} failed, so the call is refused: {message}");
                    let d = decision(name, StepKind::Approval, Verdict::Error, &message);
                    return Err(refuse(
                        &mut record,
                        d,
                        ApiError::new(ErrorKind::MiddlewareFailed, message),
                    ));
                }
            }
        }

        // 4. Result-side steps: collected, applied when the call ends.
        for link in &chain.links {
            match &link.step {
                Step::Redact(rules) => {
                    let all = record.redact.get_or_insert_with(|| RedactRules {
                        replacement: rules.replacement.clone(),
                        ..RedactRules::default()
                    });
                    all.paths.extend(rules.paths.iter().cloned());
                    all.patterns.extend(rules.patterns.iter().cloned());
                    record.decisions.push(decision(
                        link.name(),
                        StepKind::Redact,
                        Verdict::Applied,
                        "",
                    ));
                }
                Step::Audit(_) => {
                    record.decisions.push(decision(
                        link.name(),
                        StepKind::Audit,
                        Verdict::Applied,
                        "",
                    ));
                }
                _ => {}
            }
        }
        record.audit = audit;
        Ok(record)
    }

    /// Checks a rewritten call as if the caller had asked for it: the command exists, the
    /// agent's binding and permissions allow it, the arguments pass the schema, the call's
    /// stdin suits the (new) command. On success `candidate` becomes the rewritten call.
    fn recheck(
        &self,
        snapshot: &Snapshot,
        caller: &Principal,
        tool: &ResolvedTool,
        candidate: &mut Candidate,
        stdin: Option<&[u8]>,
        rewrite: toolgrid_core::middleware::Rewrite,
    ) -> Result<(), ApiError> {
        let Some(command) = tool.command(&rewrite.command).cloned() else {
            return Err(ApiError::new(
                ErrorKind::UnknownCommand,
                format!(
                    "tool {:?} has no command {:?}",
                    tool.key.name, rewrite.command
                ),
            ));
        };
        let grant = authz::authorize_call(snapshot, caller, tool, &command.name)?;
        if grant.binding != candidate.grant.binding || grant.release != candidate.grant.release {
            return Err(ApiError::new(
                ErrorKind::PermissionDenied,
                "the rewritten call would go through another binding or release",
            ));
        }
        let args = command.validate(rewrite.args)?;
        if command.name != candidate.command.name {
            command.check_stdin(stdin)?;
        }
        candidate.command = command;
        candidate.args = args;
        candidate.grant = grant;
        Ok(())
    }
}

//! Admission: a caller's [`Invocation`] becomes a recorded call, or a refusal with its
//! kind. The steps, in order, each its own function:
//!
//! 1. the tool ([`Gateway::tool`]) and its command ([`command::command_of`]);
//! 2. the caller's grant (`authz::authorize_call`: a Ready binding and the agent's
//!    permissions, or an operator);
//! 3. the request checked against the command ([`request::validate`]);
//! 4. an earlier call with the same idempotency key and the same request is the answer
//!    ([`Gateway::earlier_call`]), before the chain runs again;
//! 5. the release the grant allows ([`Gateway::release_for`]);
//! 6. the middleware chain (`Gateway::run_chain`), which may refuse, rewrite or hold the
//!    call for approval;
//! 7. the release's pool is ready;
//! 8. the record ([`record::new_call`], pure);
//! 9. recorded, with a worker slot reserved when one is free (else a place in the agent's
//!    queue: `queue-full` when it holds as many calls as it may), and handed to the
//!    scheduler ([`Gateway::record_call`]).
//!
//! Every refusal, at any step, gets an audit record ([`Gateway::audit_refusal`]).

mod command;
mod record;
mod request;

pub use request::MAX_IDEMPOTENCY_KEY_BYTES;

use super::{Gateway, authz, caller_name, chain};
use crate::scheduler::CallUpdate;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use toolgrid_api::Kind;
use toolgrid_catalog::{ResolvedTool, Snapshot};
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{CallRecord, Created, Decision, NewCall, StepKind, Verdict, now_ms};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::CommandInterface;
use toolgrid_store::Durable;
use tracing::Instrument as _;

/// How long an agent's identical call is refused as `repeated-call` when the Tool sets no
/// `repeatWindow`.
pub const DEFAULT_REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// A call as a caller asks for it, from any front door.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    pub namespace: String,
    pub tool: String,
    /// None: the first argv token when it names a command, else the tool's only command.
    pub command: Option<String>,
    /// Command-line tokens, parsed against the Tool definition.
    pub argv: Vec<String>,
    /// Or arguments by name; merged over argv.
    pub args: Option<Value>,
    pub stdin: Option<Vec<u8>>,
    pub idempotency_key: Option<String>,
    /// A dry run: `read` commands run for real, others are answered without running.
    pub dry_run: bool,
    /// Made by a program of the `code` tool (a child call): allowed only where the
    /// binding's exposure lets programs call the tool, as direct calls only where it lets
    /// the model call it.
    pub from_program: bool,
    /// The caller's W3C trace context (a `traceparent` header, gRPC metadata or MCP
    /// `_meta`): the call's spans join the caller's trace. None: a trace of its own (or the
    /// current span's).
    pub traceparent: Option<String>,
}

/// A recorded call, and whether it is an earlier one returned for the same key.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub record: CallRecord,
    pub deduplicated: bool,
    /// News of a new call, subscribed before it was queued so its end cannot be missed.
    pub updates: Option<watch::Receiver<CallUpdate>>,
}

impl Gateway {
    /// Validates and records a call, and queues it for a worker. The same idempotency key
    /// returns the earlier call instead.
    ///
    /// `caller` must be allowed ([`authz::authorize_call`]): an agent's call runs its
    /// binding's release with the access the binding grants; its idempotency keys are its
    /// own.
    pub async fn admit(
        &self,
        caller: &Principal,
        invocation: Invocation,
    ) -> Result<Admitted, ApiError> {
        let namespace = Self::namespace(caller, &invocation.namespace);
        // The call's root span (under the caller's, when it sent its trace context); the
        // scheduler's and the worker's spans of the call are its children.
        let span = tracing::info_span!(
            "call",
            call = tracing::field::Empty,
            tool = %invocation.tool,
            namespace = %namespace,
            agent = %authz::agent_scope(caller),
        );
        if let Some(traceparent) = &invocation.traceparent {
            toolgrid_trace::adopt(&span, traceparent);
        }
        self.admit_in(caller, namespace, invocation)
            .instrument(span)
            .await
    }

    async fn admit_in(
        &self,
        caller: &Principal,
        namespace: String,
        invocation: Invocation,
    ) -> Result<Admitted, ApiError> {
        let tool_name = invocation.tool.clone();
        let command_hint = invocation.command.clone();
        let args_hint = invocation.args.clone();
        let dry_run = invocation.dry_run;
        match self.admit_checked(caller, &namespace, invocation).await {
            Ok(admitted) => Ok(admitted),
            Err(refused) => {
                crate::metrics::refused("caller", refused.error.kind.as_str());
                let (command, args) = refused.call.clone().unwrap_or_else(|| {
                    (
                        command_hint.unwrap_or_default(),
                        args_hint.unwrap_or(Value::Null),
                    )
                });
                self.audit_refusal(
                    caller, &namespace, &tool_name, &command, args, dry_run, &refused,
                )
                .await;
                Err(refused.error)
            }
        }
    }

    /// Appends the audit record of a refused call (best effort: a store that cannot take
    /// it is logged, and the refusal stands).
    #[allow(clippy::too_many_arguments)]
    async fn audit_refusal(
        &self,
        caller: &Principal,
        namespace: &str,
        tool: &str,
        command: &str,
        args: Value,
        dry_run: bool,
        refused: &chain::Refused,
    ) {
        let record = toolgrid_core::call::AuditRecord {
            call_id: uuid::Uuid::now_v7().to_string(),
            at_ms: now_ms(),
            namespace: namespace.to_string(),
            agent: authz::agent_scope(caller).to_string(),
            caller: caller_name(caller),
            tool: tool.to_string(),
            command: command.to_string(),
            args: toolgrid_core::middleware::audit::exclude_args(
                &args,
                refused
                    .audit
                    .as_ref()
                    .map(|a| a.exclude_args.as_slice())
                    .unwrap_or(&[]),
            ),
            decisions: refused.decisions.clone(),
            outcome: toolgrid_core::call::AuditOutcome::Refused,
            error_kind: Some(refused.error.kind),
            error_message: refused.error.message.clone(),
            duration_ms: 0,
            dry_run,
        };
        let line = toolgrid_core::middleware::audit::stdout_line(refused.audit.as_ref(), &record);
        if let Err(error) = self.store.append_audit(record).await {
            tracing::error!(%error, "the audit record of a refused call could not be stored");
        }
        if let Some(line) = line {
            toolgrid_core::middleware::audit::print_line(&line);
        }
    }

    async fn admit_checked(
        &self,
        caller: &Principal,
        namespace: &str,
        invocation: Invocation,
    ) -> Result<Admitted, chain::Refused> {
        let started = std::time::Instant::now();
        let snapshot = self.catalog.current();
        let tool = self.tool(&snapshot, caller, namespace, &invocation.tool)?;
        let mut argv = invocation.argv;
        let command = command::command_of(&tool, invocation.command, &mut argv)?;
        let grant = authz::authorize_call(&snapshot, caller, &tool, &command.name)?;
        authz::check_exposure(&grant, &tool, invocation.from_program)?;
        let request::Request {
            args,
            idempotency_key,
        } = request::validate(
            &command,
            &argv,
            invocation.args,
            invocation.stdin.as_deref(),
            invocation.idempotency_key,
        )?;
        let dry_run = invocation.dry_run;
        // The same key for the same request returns the earlier call before the chain runs
        // again: a retry takes no rate-limit token, is no repeated call, and finds a call
        // that waits for approval. (A rewritten call is stored under its rewritten request;
        // its retries go through the chain to the same rewrite, and the store matches them.)
        if let Some(key) = &idempotency_key
            && let Some(earlier) = self
                .earlier_call(
                    caller,
                    namespace,
                    &tool,
                    &command,
                    &args,
                    invocation.stdin.as_deref().unwrap_or_default(),
                    dry_run,
                    key,
                )
                .await?
        {
            return Ok(earlier);
        }

        let id = uuid::Uuid::now_v7().to_string();
        tracing::Span::current().record("call", id.as_str());
        // A rollout splits new calls by their key (a retry keeps its side), else by id.
        let split = idempotency_key.as_deref().unwrap_or(&id);
        let release = self.release_for(&snapshot, &tool, namespace, &grant, split)?;
        let mut candidate = chain::Candidate {
            command,
            args,
            grant,
            release_version: release.version.to_string(),
        };
        let chain = self
            .run_chain(
                &snapshot,
                caller,
                &tool,
                namespace,
                &mut candidate,
                invocation.stdin.as_deref(),
                dry_run,
            )
            .instrument(tracing::info_span!("middleware"))
            .await
            .map_err(|mut refused| {
                refused.call.get_or_insert_with(|| {
                    (
                        candidate.command.name.clone(),
                        Value::Object(candidate.args.0.clone()),
                    )
                });
                refused
            })?;
        let refused = Refusing {
            decisions: chain.decisions.clone(),
            audit: chain.audit.clone(),
            call: (
                candidate.command.name.clone(),
                Value::Object(candidate.args.0.clone()),
            ),
        };
        // A rewrite keeps the binding and release (checked), so the release stands.
        let chain::Candidate {
            command,
            args,
            grant,
            ..
        } = candidate;
        let pool = ObjectKey::new(namespace, release.pool.clone());
        if !snapshot.pools.contains_key(&pool) {
            return Err(refused.with(ApiError::new(
                ErrorKind::Unavailable,
                format!("worker pool {pool} is not ready"),
            )));
        }
        let stdin = invocation.stdin.unwrap_or_default();
        let new = record::new_call(record::Admission {
            id,
            now_ms: now_ms(),
            caller,
            namespace,
            tool: &tool,
            command: &command,
            args: &args,
            stdin,
            idempotency_key,
            dry_run,
            release: &release,
            pool: &pool,
            access: grant.access,
            chain,
            traceparent: toolgrid_trace::current(),
        });
        crate::metrics::stage(crate::metrics::Stage::Admit, started.elapsed());
        self.record_call(new, command, refused).await
    }

    /// Finds the tool, or explains why it cannot be called.
    fn tool(
        &self,
        snapshot: &Snapshot,
        caller: &Principal,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<ResolvedTool>, ApiError> {
        if let Some(tool) = snapshot.tool(namespace, name) {
            return Ok(tool.clone());
        }
        let id = toolgrid_catalog::ResourceId {
            kind: Kind::Tool,
            key: toolgrid_core::ids::ObjectKey::new(namespace, name),
        };
        if let Some(state) = snapshot.resources.get(&id) {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "tool {name:?} is not ready ({}): {}",
                    state.ready.reason, state.ready.message
                ),
            ));
        }
        let known: Vec<&str> = snapshot
            .tools
            .values()
            .filter(|t| t.key.namespace == namespace)
            .filter(|t| authz::may_see_tool(snapshot, caller, t))
            .map(|t| t.key.name.as_str())
            .collect();
        Err(ApiError::new(
            ErrorKind::UnknownTool,
            format!(
                "no tool {name:?} in namespace {namespace:?}{}",
                if known.is_empty() {
                    String::new()
                } else {
                    format!(" (tools: {})", known.join(", "))
                }
            ),
        ))
    }

    /// The call an agent (or an operator) made earlier with idempotency key `key`, when it
    /// asked for the same request.
    #[allow(clippy::too_many_arguments)]
    async fn earlier_call(
        &self,
        caller: &Principal,
        namespace: &str,
        tool: &ResolvedTool,
        command: &CommandInterface,
        args: &toolgrid_core::interface::ValidArgs,
        stdin: &[u8],
        dry_run: bool,
        key: &str,
    ) -> Result<Option<Admitted>, ApiError> {
        let Some(earlier) = self
            .store
            .find_call_by_key(namespace, authz::agent_scope(caller), key)
            .await
            .map_err(ApiError::from)?
        else {
            return Ok(None);
        };
        let asked = request::request_hash(
            namespace,
            &tool.key.name,
            &command.name,
            &Value::Object(args.0.clone()),
            stdin,
            dry_run,
        );
        if asked != earlier.request_hash {
            return Ok(None);
        }
        tracing::info!(call = %earlier.id, "idempotency key matched an earlier call");
        Ok(Some(Admitted {
            record: earlier,
            deduplicated: true,
            updates: None,
        }))
    }

    /// The release a call with `grant` runs, or why there is none: the binding's canary
    /// when `split` (the call's key) falls in its share, else its release.
    fn release_for(
        &self,
        snapshot: &Snapshot,
        tool: &ResolvedTool,
        namespace: &str,
        grant: &authz::Grant,
        split: &str,
    ) -> Result<Arc<toolgrid_catalog::ResolvedRelease>, ApiError> {
        let canary = grant
            .canary
            .as_ref()
            .filter(|(_, weight)| {
                toolgrid_core::rollout::side(split, *weight) == toolgrid_core::rollout::Side::Canary
            })
            .map(|(key, _)| key);
        let Some(release_key) = canary.or(grant.release.as_ref()).or(tool.release.as_ref()) else {
            let why: Vec<String> = snapshot
                .resources_of(Kind::ToolRelease)
                .filter(|r| {
                    r.id.key.namespace == namespace
                        && r.columns
                            .iter()
                            .any(|(column, value)| column == "Tool" && value == &tool.key.name)
                })
                .map(|r| format!("{}: {}: {}", r.id.key.name, r.ready.reason, r.ready.message))
                .collect();
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "tool {:?} has no Ready release{}",
                    tool.key.name,
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", why.join("; "))
                    }
                ),
            ));
        };
        snapshot.release(release_key).cloned().ok_or_else(|| {
            ApiError::new(
                ErrorKind::Unavailable,
                format!("release {release_key} is not ready"),
            )
        })
    }

    /// Records `new` (admission and assignment in one commit when a worker slot is free now;
    /// never for a call that waits for approval or is answered without running) and hands
    /// it to the scheduler. The store may answer with an earlier call (the same key) or
    /// refuse it as a repeat of one.
    async fn record_call(
        &self,
        mut new: NewCall,
        command: Arc<CommandInterface>,
        refused: Refusing,
    ) -> Result<Admitted, chain::Refused> {
        let call_id = new.id.clone();
        let awaiting = new.spec.chain.approval.is_some();
        let queued = !awaiting && new.dry_run_result.is_none();
        if queued {
            // A slot, or a place in the agent's lane: a full lane refuses the call before
            // it is recorded, so the same key may be tried again later.
            match self.scheduler.reserve(&new) {
                Ok(worker) => new.assign_to = worker,
                Err(full) => return Err(refused.with(full.into())),
            }
        }
        let reserved = new.assign_to.is_some();
        let committing = std::time::Instant::now();
        // A call with a reserved slot goes to its worker as soon as its admission is
        // committed, while the store syncs it: the run overlaps the sync, and its caller
        // hears of it only once it is durable (as every effect of the run is committed
        // first, none can leave before; see `CallLog::create_call_applied`).
        let (created, durable) = match async {
            if reserved {
                self.store.create_call_applied(new).await
            } else {
                Ok((self.store.create_call(new).await?, Durable::already()))
            }
        }
        .instrument(tracing::info_span!("store_commit"))
        .await
        {
            Ok(created) => created,
            Err(error) => {
                if queued {
                    self.scheduler.unreserve(&call_id);
                }
                return Err(refused.with(error.into()));
            }
        };
        crate::metrics::stage(crate::metrics::Stage::StoreCommit, committing.elapsed());
        if queued && !matches!(created, Created::New(_)) {
            self.scheduler.unreserve(&call_id);
        }
        // A new call's news is subscribed before its worker can end it.
        let updates = match &created {
            Created::New(record) => {
                let updates = self.calls.admitted(&record.id);
                if reserved {
                    self.scheduler
                        .admitted_assigned(record.clone(), command.clone());
                }
                Some(updates)
            }
            _ => None,
        };
        let syncing = std::time::Instant::now();
        if let Err(error) = durable.wait().await {
            // Committed, perhaps running: a retry with the same key finds it.
            return Err(refused.with(error.into()));
        }
        if reserved {
            crate::metrics::stage(crate::metrics::Stage::StoreSync, syncing.elapsed());
        }
        match created {
            Created::New(record) => {
                tracing::info!(call = %record.id, tool = %record.tool, command = %record.command, release = %record.release, agent = record.spec.access.agent.as_deref().unwrap_or(""), state = %record.state, "call accepted");
                if let Some(wait) = &record.spec.chain.approval
                    && record.state == toolgrid_core::call::CallState::AwaitingApproval
                {
                    self.approval_wake_ms
                        .fetch_min(wait.deadline_ms, std::sync::atomic::Ordering::SeqCst);
                }
                if record.state.is_terminal() {
                    // A dry run answered without running: ended already.
                    crate::scheduler::audit_to_stdout(&record);
                    self.calls.finish(record.clone());
                } else if queued && !reserved {
                    self.scheduler.submit(record.clone(), command);
                }
                Ok(Admitted {
                    record,
                    deduplicated: false,
                    updates,
                })
            }
            Created::Existing(record) => {
                tracing::info!(call = %record.id, "idempotency key matched an earlier call");
                Ok(Admitted {
                    record,
                    deduplicated: true,
                    updates: None,
                })
            }
            Created::Repeated(earlier) => {
                let message = format!(
                    "the same call (tool, command, arguments, stdin) was made {} ms ago as call {}; \
                     pass that call's idempotency key to get its result, or wait",
                    (now_ms() - earlier.created_at_ms).max(0),
                    earlier.id
                );
                let mut refusal =
                    refused.with(ApiError::new(ErrorKind::RepeatedCall, message.clone()));
                refusal.decisions.push(Decision {
                    middleware: String::new(),
                    kind: StepKind::RepeatedCall,
                    verdict: Verdict::Deny,
                    message,
                });
                Err(refusal)
            }
        }
    }
}

/// What a refusal after the chain ran carries: the chain's decisions and audit options,
/// and the call as the chain left it.
struct Refusing {
    decisions: Vec<Decision>,
    audit: Option<toolgrid_core::call::AuditOptions>,
    call: (String, Value),
}

impl Refusing {
    fn with(self, error: ApiError) -> chain::Refused {
        chain::Refused {
            error,
            decisions: self.decisions,
            audit: self.audit,
            call: Some(self.call),
        }
    }
}

//! The front doors (gRPC and HTTP) and what they share: admitting a call (find the tool,
//! pick the release, validate arguments and stdin, record it under its idempotency key),
//! waiting for its end, and reading calls, oplogs and resources.

mod approvals;
pub mod audit;
pub mod authn;
pub mod authz;
mod chain;
pub mod console;
pub mod convert;
pub mod follow;
mod grpc;
mod http;
pub mod http_error;
pub mod mcp;
mod model_schemas;
pub mod results;
mod sse;
pub mod workspaces;

pub use authn::Authenticator;
pub use grpc::{AuthenticatedTools, ToolsService};
pub use http::{router, router_with};

use toolgrid_core::auth::Principal;

use crate::scheduler::{CallUpdate, CallWatch, Scheduler};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use toolgrid_api::Kind;
use toolgrid_api::WorkerPoolStatus;
use toolgrid_catalog::pool_health::{LivePool, pool_ready};
use toolgrid_catalog::{Catalog, ResolvedTool, ResourceState, Snapshot};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_store::{
    CallFilter, CallRecord, CallSpec, Created, NewCall, OplogRecord, RunLimits, Store, now_ms,
};

/// How long an agent's identical call is refused as `repeated-call` when the Tool sets no
/// `repeatWindow`.
pub const DEFAULT_REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// Who made a call, as audit records and the call's spec name them:
/// `operator:<subject>` or `agent:<namespace>/<name>`.
pub fn caller_name(caller: &Principal) -> String {
    match caller {
        Principal::Operator { subject } => format!("operator:{subject}"),
        Principal::Agent { agent } => format!("agent:{agent}"),
    }
}

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
}

/// A recorded call, and whether it is an earlier one returned for the same key.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub record: CallRecord,
    pub deduplicated: bool,
    /// News of a new call, subscribed before it was queued so its end cannot be missed.
    pub updates: Option<watch::Receiver<CallUpdate>>,
}

/// Bytes of entries one page of an oplog carries, within any gRPC client's default 4 MiB
/// message limit.
pub const OPLOG_PAGE_BYTES: usize = 2 << 20;

pub struct Gateway {
    catalog: Arc<Catalog>,
    store: Arc<dyn Store>,
    scheduler: Arc<Scheduler>,
    calls: Arc<CallWatch>,
    auth: Authenticator,
    wasm: toolgrid_sandbox::middleware::WasmRunner,
    /// Unix milliseconds by which the approval timer must look at the store again: the
    /// earliest approval deadline it knows of (see [`Gateway::apply_approval_timeouts`]).
    approval_wake_ms: std::sync::atomic::AtomicI64,
}

impl Gateway {
    /// A gateway that authenticates callers with `auth` (the admin token of `toolgrid up`,
    /// Agents' tokens, and a [`crate::auth::TokenReviewer`] in a cluster).
    pub fn new(
        catalog: Arc<Catalog>,
        store: Arc<dyn Store>,
        scheduler: Arc<Scheduler>,
        calls: Arc<CallWatch>,
        auth: Authenticator,
    ) -> Arc<Self> {
        Arc::new(Gateway {
            catalog,
            store,
            scheduler,
            calls,
            auth,
            wasm: toolgrid_sandbox::middleware::WasmRunner::new(),
            approval_wake_ms: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// The caller behind a request's `authorization` value, acting as `act_as` (the
    /// `toolgrid-as` header) if given: [`ErrorKind::Unauthenticated`] for no token or an
    /// unknown one.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        act_as: Option<&str>,
    ) -> Result<Principal, ApiError> {
        let snapshot = self.catalog.current();
        let result = self
            .auth
            .authenticate(authorization, act_as, &snapshot)
            .await;
        if let Err(error) = &result {
            tracing::debug!(kind = %error.kind, "request refused: {}", error.message);
            crate::metrics::refused("caller", error.kind.as_str());
        }
        result
    }

    /// The namespace a request names, or by default the agent's own (`default` for an
    /// operator).
    fn namespace(caller: &Principal, ns: &str) -> String {
        match (ns, caller) {
            ("", Principal::Agent { agent }) => agent.namespace.clone(),
            ("", Principal::Operator { .. }) => toolgrid_api::DEFAULT_NAMESPACE.to_string(),
            (ns, _) => ns.to_string(),
        }
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
        let namespace = namespace.to_string();
        let snapshot = self.catalog.current();
        let tool = self.tool(&snapshot, caller, &namespace, &invocation.tool)?;

        let mut argv = invocation.argv;
        let command_name = match invocation.command.filter(|c| !c.is_empty()) {
            Some(name) => name,
            None => {
                if let Some(first) = argv.first()
                    && tool.command(first).is_some()
                {
                    argv.remove(0)
                } else if tool.commands.len() == 1 {
                    tool.commands[0].name.clone()
                } else {
                    let names: Vec<&str> = tool.commands.iter().map(|c| c.name.as_str()).collect();
                    return Err(ApiError::new(
                        ErrorKind::UnknownCommand,
                        format!(
                            "tool {:?} has several commands; name one of: {}",
                            tool.key.name,
                            names.join(", ")
                        ),
                    )
                    .into());
                }
            }
        };
        let Some(command) = tool.command(&command_name).cloned() else {
            let names: Vec<&str> = tool.commands.iter().map(|c| c.name.as_str()).collect();
            return Err(ApiError::new(
                ErrorKind::UnknownCommand,
                format!(
                    "tool {:?} has no command {command_name:?} (commands: {})",
                    tool.key.name,
                    names.join(", ")
                ),
            )
            .into());
        };

        let grant = authz::authorize_call(&snapshot, caller, &tool, &command.name)?;

        let mut args = command.parse_argv(&argv)?;
        match invocation.args {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => args.extend(map),
            Some(other) => {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("args must be a JSON object of arguments by name, not {other}"),
                )
                .into());
            }
        }
        let args = command.validate(args)?;
        command.check_stdin(invocation.stdin.as_deref())?;
        let idempotency_key = invocation.idempotency_key.filter(|k| !k.is_empty());
        if let Some(key) = &idempotency_key
            && key.len() > 255
        {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                "the idempotency key is longer than 255 bytes",
            )
            .into());
        }

        // The same key for the same request returns the earlier call before the chain runs
        // again: a retry takes no rate-limit token, is no repeated call, and finds a call
        // that waits for approval. (A rewritten call is stored under its rewritten request;
        // its retries go through the chain to the same rewrite, and the store matches them.)
        if let Some(key) = &idempotency_key
            && let Some(earlier) = self
                .store
                .find_call_by_key(&namespace, authz::agent_scope(caller), key)
                .await
                .map_err(ApiError::from)?
        {
            let stdin = invocation.stdin.as_deref().unwrap_or_default();
            let asked = request_hash(
                &namespace,
                &tool.key.name,
                &command.name,
                &Value::Object(args.0.clone()),
                stdin,
                invocation.dry_run,
            );
            if asked == earlier.request_hash {
                tracing::info!(call = %earlier.id, "idempotency key matched an earlier call");
                return Ok(Admitted {
                    record: earlier,
                    deduplicated: true,
                    updates: None,
                });
            }
        }

        let release = self.release_for(&snapshot, &tool, &namespace, &grant)?;
        let mut candidate = chain::Candidate {
            command,
            args,
            grant,
            release_version: release.version.to_string(),
        };
        let dry_run = invocation.dry_run;
        let chain = self
            .run_chain(
                &snapshot,
                caller,
                &tool,
                &namespace,
                &mut candidate,
                invocation.stdin.as_deref(),
                dry_run,
            )
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
        let decisions = chain.decisions.clone();
        let audit_of_chain = chain.audit.clone();
        let asked = (
            candidate.command.name.clone(),
            Value::Object(candidate.args.0.clone()),
        );
        let refused = |error: ApiError| chain::Refused {
            error,
            decisions: decisions.clone(),
            audit: audit_of_chain.clone(),
            call: Some(asked.clone()),
        };
        // A rewrite keeps the binding and release (checked), so the release stands.
        let command = candidate.command;
        let args = candidate.args;
        let grant = candidate.grant;
        let pool_key = toolgrid_core::ids::ObjectKey::new(namespace.clone(), release.pool.clone());
        if !snapshot.pools.contains_key(&pool_key) {
            return Err(refused(ApiError::new(
                ErrorKind::Unavailable,
                format!("worker pool {pool_key} is not ready"),
            )));
        }

        let stdin = invocation.stdin.unwrap_or_default();
        let argv = command.build_argv(&tool.key.name, &args);
        let args_value = Value::Object(args.0.clone());
        let request_hash = request_hash(
            &namespace,
            &tool.key.name,
            &command.name,
            &args_value,
            &stdin,
            dry_run,
        );
        let created = now_ms();
        let timeout_ms = tool.timeout.as_millis() as u64;
        let id = uuid::Uuid::now_v7().to_string();
        let command_spec = tool.spec.command(&command.name);
        // A dry run of a command that changes the world is answered without running it.
        let dry_run_result = (dry_run && tool.effect != toolgrid_api::Effect::Read).then(|| {
            command_spec
                .and_then(|c| c.dry_run_result.clone())
                .unwrap_or_else(|| Value::String(toolgrid_core::call::DRY_RUN_ACKNOWLEDGED.into()))
        });
        // Only an agent's calls are checked for repeats, and never a dry run's.
        let repeat_window_ms = match caller {
            Principal::Agent { .. }
                if !dry_run && !command_spec.is_some_and(|c| c.allow_repeat) =>
            {
                let window = tool
                    .spec
                    .repeat_window
                    .map(|w| w.get())
                    .unwrap_or(DEFAULT_REPEAT_WINDOW);
                (!window.is_zero()).then_some(window.as_millis() as i64)
            }
            _ => None,
        };
        let started = toolgrid_core::call::CallStarted {
            namespace: namespace.clone(),
            tool: tool.key.name.clone(),
            command: command.name.clone(),
            release: release.key.name.clone(),
            version: release.version.to_string(),
            digest: release.digest.clone(),
            args: args_value.clone(),
            argv: argv.clone(),
            stdin_bytes: stdin.len() as u64,
            idempotency_key: idempotency_key.clone(),
            dry_run,
            middleware: chain.decisions.clone(),
        };
        let awaiting = chain.approval.is_some();
        let new = NewCall {
            id,
            namespace: namespace.clone(),
            tool: tool.key.name.clone(),
            command: command.name.clone(),
            release: release.key.name.clone(),
            release_digest: release.digest.clone(),
            args: args_value,
            spec: CallSpec {
                pool: pool_key.to_string(),
                argv,
                env: Default::default(),
                limits: RunLimits {
                    memory_bytes: release.limits.memory_bytes,
                    cpu_time_ms: release.limits.cpu_time.as_millis() as u64,
                    output_bytes: release.limits.output_bytes,
                    timeout_ms,
                    max_timeout_ms: tool
                        .spec
                        .max_timeout
                        .map(|max| max.get().as_millis() as u64)
                        .unwrap_or(timeout_ms)
                        .max(timeout_ms),
                    instances: release.limits.instances,
                    request_bytes: release.limits.request_bytes,
                    response_bytes: release.limits.response_bytes,
                },
                effect: tool.effect,
                command: command_spec.cloned(),
                deadline_ms: created + timeout_ms as i64,
                egress: release.network.egress.clone(),
                access: grant.access,
                caller: caller_name(caller),
                dry_run,
                chain,
                retry: Some(toolgrid_core::call::retry::RetrySpec::of(
                    tool.effect,
                    tool.spec.retry.as_ref(),
                )),
                result_policy: tool.spec.result_policy.clone(),
            },
            stdin,
            idempotency_key,
            request_hash,
            started,
            assign_to: None,
            repeat_window_ms,
            dry_run_result,
        };
        // Admission and assignment in one commit when a slot is free now (never for a call
        // that waits for approval or is answered without running).
        let mut new = new;
        let call_id = new.id.clone();
        let queued = !awaiting && new.dry_run_result.is_none();
        if queued {
            new.assign_to = self.scheduler.reserve(&new);
        }
        let reserved = new.assign_to.is_some();
        let created = match self.store.create_call(new).await {
            Ok(created) => created,
            Err(error) => {
                if reserved {
                    self.scheduler.unreserve(&call_id);
                }
                return Err(refused(error.into()));
            }
        };
        match created {
            Created::New(record) => {
                tracing::info!(call = %record.id, tool = %record.tool, command = %record.command, release = %record.release, agent = record.spec.access.agent.as_deref().unwrap_or(""), state = %record.state, "call accepted");
                let updates = self.calls.subscribe(&record.id);
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
                } else if reserved {
                    self.scheduler.admitted_assigned(record.clone(), command);
                } else if queued {
                    self.scheduler.submit(record.clone(), command);
                }
                Ok(Admitted {
                    record,
                    deduplicated: false,
                    updates: Some(updates),
                })
            }
            Created::Existing(record) => {
                if reserved {
                    self.scheduler.unreserve(&call_id);
                }
                tracing::info!(call = %record.id, "idempotency key matched an earlier call");
                Ok(Admitted {
                    record,
                    deduplicated: true,
                    updates: None,
                })
            }
            Created::Repeated(earlier) => {
                if reserved {
                    self.scheduler.unreserve(&call_id);
                }
                let mut decisions = decisions.clone();
                let message = format!(
                    "the same call (tool, command, arguments, stdin) was made {} ms ago as call {}; \
                     pass that call's idempotency key to get its result, or wait",
                    (now_ms() - earlier.created_at_ms).max(0),
                    earlier.id
                );
                decisions.push(toolgrid_core::call::Decision {
                    middleware: String::new(),
                    kind: toolgrid_core::call::StepKind::RepeatedCall,
                    verdict: toolgrid_core::call::Verdict::Deny,
                    message: message.clone(),
                });
                Err(chain::Refused {
                    error: ApiError::new(ErrorKind::RepeatedCall, message),
                    decisions,
                    audit: audit_of_chain.clone(),
                    call: Some(asked.clone()),
                })
            }
        }
    }

    /// The release a call with `grant` runs, or why there is none.
    fn release_for(
        &self,
        snapshot: &Snapshot,
        tool: &ResolvedTool,
        namespace: &str,
        grant: &authz::Grant,
    ) -> Result<Arc<toolgrid_catalog::ResolvedRelease>, ApiError> {
        let Some(release_key) = grant.release.as_ref().or(tool.release.as_ref()) else {
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

    /// Subscribes to a call's news (progress and end).
    pub fn watch(&self, call_id: &str) -> watch::Receiver<CallUpdate> {
        self.calls.subscribe(call_id)
    }

    /// Waits until the call ends, or `limit` passes; returns the call as it then is.
    /// (The caller was checked when it read the call.)
    pub async fn wait(&self, call_id: &str, limit: Duration) -> Result<CallRecord, ApiError> {
        let updates = self.calls.subscribe(call_id);
        let record = self.record(call_id).await?;
        if record.state.is_terminal() {
            return Ok(record);
        }
        self.wait_for(updates, call_id, limit).await
    }

    /// Waits on a subscription taken before the call could end.
    async fn wait_for(
        &self,
        mut updates: watch::Receiver<CallUpdate>,
        call_id: &str,
        limit: Duration,
    ) -> Result<CallRecord, ApiError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(done) = updates.borrow_and_update().finished.clone() {
                return Ok(done);
            }
            match tokio::time::timeout_at(deadline, updates.changed()).await {
                Ok(Ok(())) => continue,
                // The sender went away (finished and pruned) or time ran out: read the store.
                _ => return self.record(call_id).await,
            }
        }
    }

    /// The longest a caller waits for a call: its deadline plus the scheduler's grace.
    ///
    /// A call waiting for approval may wait until its approval deadline and then run for
    /// its whole timeout.
    pub fn wait_limit(&self, record: &CallRecord) -> Duration {
        // Progress may extend a call up to its maxTimeout.
        let limits = &record.spec.limits;
        let longest = limits.timeout_ms.max(limits.max_timeout_ms) as i64;
        let deadline_ms = match &record.spec.chain.approval {
            Some(wait) if record.state == toolgrid_core::call::CallState::AwaitingApproval => {
                wait.deadline_ms.saturating_add(longest)
            }
            _ => toolgrid_core::call::IdleDeadline::of(limits, record.spec.deadline_ms)
                .map(|rule| rule.hard_ms())
                .unwrap_or(record.spec.deadline_ms),
        };
        let remaining = (deadline_ms - now_ms()).max(0) as u64;
        Duration::from_millis(remaining)
            + self.scheduler.config().deadline_grace
            + Duration::from_secs(2)
    }

    /// Admits a call and waits for its end; a call that waits for approval is returned at
    /// once, in `awaiting-approval` (the caller comes back for it by id or key).
    pub async fn invoke(
        &self,
        caller: &Principal,
        invocation: Invocation,
    ) -> Result<Admitted, ApiError> {
        let admitted = self.admit(caller, invocation).await?;
        let limit = self.wait_limit(&admitted.record);
        let record = match admitted.updates {
            _ if admitted.record.state.is_terminal()
                || admitted.record.state == toolgrid_core::call::CallState::AwaitingApproval =>
            {
                admitted.record
            }
            Some(updates) => self.wait_for(updates, &admitted.record.id, limit).await?,
            None => self.wait(&admitted.record.id, limit).await?,
        };
        Ok(Admitted {
            record,
            deduplicated: admitted.deduplicated,
            updates: None,
        })
    }

    /// A call as stored, whoever asks (for the gateway's own follow-ups).
    pub(crate) async fn record(&self, id: &str) -> Result<CallRecord, ApiError> {
        self.store
            .get_call(id)
            .await?
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no call {id:?}")))
    }

    /// A call `caller` may read. Another agent's call is [`ErrorKind::NotFound`] with the
    /// same message as a call that does not exist: its existence is not revealed.
    pub async fn get_call(&self, caller: &Principal, id: &str) -> Result<CallRecord, ApiError> {
        let record = self.record(id).await?;
        if authz::may_read_call(caller, &record) {
            Ok(record)
        } else {
            Err(ApiError::new(
                ErrorKind::NotFound,
                format!("no call {id:?}"),
            ))
        }
    }

    /// The call made with idempotency key `key` by `caller` (each agent's keys are its
    /// own; an operator's own calls share one scope).
    pub async fn find_call(
        &self,
        caller: &Principal,
        namespace: &str,
        key: &str,
    ) -> Result<CallRecord, ApiError> {
        let namespace = Self::namespace(caller, namespace);
        self.store
            .find_call_by_key(&namespace, authz::agent_scope(caller), key)
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::NotFound,
                    format!("no call with idempotency key {key:?} in {namespace:?}"),
                )
            })
    }

    /// Recent calls: every call for an operator, an agent's own for an agent.
    pub async fn list_calls(
        &self,
        caller: &Principal,
        namespace: &str,
        tool: &str,
        limit: u32,
    ) -> Result<Vec<CallRecord>, ApiError> {
        self.list_calls_in(caller, namespace, tool, None, limit)
            .await
    }

    /// [`Gateway::list_calls`], only those in `state` when given.
    pub async fn list_calls_in(
        &self,
        caller: &Principal,
        namespace: &str,
        tool: &str,
        state: Option<toolgrid_core::call::CallState>,
        limit: u32,
    ) -> Result<Vec<CallRecord>, ApiError> {
        let mut filter = CallFilter {
            namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
            tool: (!tool.is_empty()).then(|| tool.to_string()),
            agent: None,
            state,
            limit,
        };
        if let Principal::Agent { agent } = caller {
            if filter
                .namespace
                .as_ref()
                .is_some_and(|ns| ns != &agent.namespace)
            {
                return Ok(Vec::new());
            }
            filter.namespace = Some(agent.namespace.clone());
            filter.agent = Some(agent.name.clone());
        }
        Ok(self.store.list_calls(&filter).await?)
    }

    /// A call's oplog, when `caller` may read the call.
    pub async fn oplog(
        &self,
        caller: &Principal,
        call_id: &str,
    ) -> Result<Vec<OplogRecord>, ApiError> {
        self.get_call(caller, call_id).await?;
        Ok(self.store.oplog(call_id).await?)
    }

    /// One page of a call's oplog from `from_seq`: entries while the page stays within
    /// [`OPLOG_PAGE_BYTES`] (a larger single entry travels alone), and the seq the next page
    /// starts at, if any.
    pub async fn oplog_page(
        &self,
        caller: &Principal,
        call_id: &str,
        from_seq: u64,
    ) -> Result<(Vec<OplogRecord>, Option<u64>), ApiError> {
        let mut page = Vec::new();
        let mut bytes = 0;
        for record in self.oplog(caller, call_id).await? {
            if record.seq < from_seq {
                continue;
            }
            let size = record.payload.len() + record.kind.len() + 64;
            if !page.is_empty() && bytes + size > OPLOG_PAGE_BYTES {
                return Ok((page, Some(record.seq)));
            }
            bytes += size;
            page.push(record);
        }
        Ok((page, None))
    }

    /// The tools of a namespace with their commands' schemas: every tool for an operator,
    /// an agent's callable tools (with the release and commands its binding gives) for an
    /// agent.
    pub fn list_tools(&self, caller: &Principal, namespace: &str) -> Vec<proto::ToolInfo> {
        let namespace = Self::namespace(caller, namespace);
        let snapshot = self.catalog.current();
        snapshot
            .tools
            .values()
            .filter(|t| t.key.namespace == namespace)
            .filter_map(|t| match caller {
                Principal::Operator { .. } => Some((t, t.release.clone(), None)),
                Principal::Agent { agent } => authz::decide(&snapshot, agent, t, None)
                    .ok()
                    .map(|allowed| (t, Some(allowed.release), Some(allowed.commands))),
            })
            .map(|(t, release, allowed)| {
                let release = release.as_ref().and_then(|k| snapshot.release(k));
                proto::ToolInfo {
                    namespace: t.key.namespace.clone(),
                    name: t.key.name.clone(),
                    description: t.spec.description.clone(),
                    effect: t.effect.as_str().into(),
                    release: release.map(|r| r.key.name.clone()).unwrap_or_default(),
                    version: release.map(|r| r.version.to_string()).unwrap_or_default(),
                    commands: t
                        .commands
                        .iter()
                        .filter(|c| allowed.as_ref().is_none_or(|a| a.contains(&c.name)))
                        .map(|c| proto::CommandInfo {
                            name: c.name.clone(),
                            description: c.description.clone(),
                            args_schema_json: c.args_schema().to_string(),
                            stdin_schema_json: c
                                .stdin_schema()
                                .map(Value::to_string)
                                .unwrap_or_default(),
                            result_schema_json: c
                                .result_schema()
                                .map(Value::to_string)
                                .unwrap_or_default(),
                            definition_json: t
                                .spec
                                .command(&c.name)
                                .and_then(|d| serde_json::to_string(d).ok())
                                .unwrap_or_default(),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// The commands `caller` may call in `namespace`, as models and MCP see them: an
    /// operator sees every command of every tool, an agent its bound ones.
    pub fn model_tools(
        &self,
        caller: &Principal,
        namespace: &str,
    ) -> Vec<toolgrid_catalog::model_tools::ModelTool> {
        let namespace = Self::namespace(caller, namespace);
        let snapshot = self.catalog.current();
        let mut tools: Vec<_> = snapshot
            .tools
            .values()
            .filter(|t| t.key.namespace == namespace)
            .flat_map(|t| match caller {
                Principal::Operator { .. } => {
                    toolgrid_catalog::model_tools::model_tools_of(t, None)
                }
                Principal::Agent { agent } => match authz::decide(&snapshot, agent, t, None) {
                    Ok(allowed) => toolgrid_catalog::model_tools::model_tools_of(
                        t,
                        Some(allowed.commands.as_slice()),
                    ),
                    Err(_) => Vec::new(),
                },
            })
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// Cancels a call `caller` may read (its own, or any for an operator).
    ///
    /// CONTRACT(issue 11, helper progress): stub; the progress helper implements it
    /// (a queued or waiting call ends `cancelled` at once; a running one is stopped and
    /// ends `cancelled`, or `outcome-unknown` when a write of it may have been applied).
    ///
    /// The store ends the call in one transaction (which is also its fence: no later
    /// append or result of its worker is accepted, and so, commit before effect, no request
    /// of it leaves afterwards); only then does this answer. The scheduler then frees the
    /// call's slot and tells its worker to stop the sandbox at once. An ended call is
    /// refused with `not-cancellable`; another agent's call is `not-found`.
    pub async fn cancel(&self, caller: &Principal, id: &str) -> Result<CallRecord, ApiError> {
        let record = self.get_call(caller, id).await?;
        if record.state.is_terminal() {
            return Err(not_cancellable(&record));
        }
        let reason = format!("cancelled by {}", caller_name(caller));
        let done = match self.store.cancel_call(id, &reason).await {
            Ok(done) => done,
            Err(toolgrid_store::StoreError::Ended { .. }) => {
                return Err(not_cancellable(&self.record(id).await?));
            }
            Err(error) => return Err(error.into()),
        };
        tracing::info!(call = %done.id, tool = %done.tool, by = %caller_name(caller), kind = done.error.as_ref().map(|e| e.kind.as_str()).unwrap_or(""), "call cancelled");
        crate::metrics::call_ended(
            &done.tool,
            done.error
                .as_ref()
                .map(|e| e.kind.as_str())
                .unwrap_or("cancelled"),
        );
        crate::scheduler::audit_to_stdout(&done);
        self.scheduler.stopped(&done.id, &reason);
        self.calls.finish(done.clone());
        Ok(done)
    }

    /// What a model-facing front door returns for an ended call `caller` may read, per
    /// the `resultPolicy` the call was admitted with (see [`results`]). A `file` overflow
    /// writes the whole result to the agent's workspace as `tool-results/<call>.json`
    /// first; an operator's call (no agent, so no workspace), a workspace that another
    /// call is writing or that the file would take past its limits, or a store that
    /// cannot take it, falls back to `page`. The call record keeps the full result.
    pub async fn model_result(
        &self,
        caller: &Principal,
        record: &CallRecord,
    ) -> Result<results::ModelResult, ApiError> {
        if !authz::may_read_call(caller, record) {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("no call {:?}", record.id),
            ));
        }
        let policy = self.result_policy(record);
        let result = record.result.clone().unwrap_or(Value::Null);
        let text = result.to_string();
        if policy.overflow == toolgrid_api::Overflow::File
            && text.len() > results::max_inline_bytes(&policy)
        {
            match self.write_result_file(record, text.as_bytes()).await {
                Ok(()) => return Ok(results::shape(&policy, &record.id, &result)),
                Err(why) => {
                    tracing::info!(call = %record.id, "the result is paged instead of written to the workspace: {why}");
                    let paged = toolgrid_api::ResultPolicy {
                        overflow: toolgrid_api::Overflow::Page,
                        ..policy
                    };
                    return Ok(results::shape(&paged, &record.id, &result));
                }
            }
        }
        Ok(results::shape(&policy, &record.id, &result))
    }

    /// The result policy of a call: the one it was admitted with, or (a call admitted
    /// before policies were kept with calls) its Tool's now, or the default.
    fn result_policy(&self, record: &CallRecord) -> toolgrid_api::ResultPolicy {
        record
            .spec
            .result_policy
            .clone()
            .or_else(|| {
                self.catalog
                    .current()
                    .tools
                    .values()
                    .find(|t| t.key.namespace == record.namespace && t.key.name == record.tool)
                    .and_then(|t| t.spec.result_policy.clone())
            })
            .unwrap_or(toolgrid_api::ResultPolicy {
                max_inline_bytes: None,
                overflow: Default::default(),
            })
    }

    /// Writes `text` (a call's result) to its agent's workspace as
    /// [`results::file_path`], as a new version on the head, holding the workspace's write
    /// lock meanwhile (so no read-write call of the agent commits on a base it moves). A
    /// head that has the file already (the result asked for again) is left alone.
    async fn write_result_file(&self, record: &CallRecord, text: &[u8]) -> Result<(), String> {
        use toolgrid_core::workspace::{WorkspaceKey, WorkspacePath};
        let agent = record
            .spec
            .access
            .agent
            .as_ref()
            .ok_or("the call is an operator's: no agent, so no workspace")?;
        let key = WorkspaceKey::new(record.namespace.clone(), agent.clone());
        let path = WorkspacePath::parse(&results::file_path(&record.id))
            .map_err(|e| format!("the file's path: {e}"))?;
        let holder = format!("result-file:{}", record.id);
        if !self.scheduler.hold_workspace(&key, &holder) {
            return Err(format!("a call is writing workspace {key}"));
        }
        let written = self.commit_result_file(&key, path, text, &record.id).await;
        self.scheduler.release_workspace(&holder);
        written
    }

    /// Commits `text` at `path` on the head of workspace `key` (see
    /// [`Gateway::write_result_file`], which holds its write lock).
    async fn commit_result_file(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
        path: toolgrid_core::workspace::WorkspacePath,
        text: &[u8],
        call_id: &str,
    ) -> Result<(), String> {
        use toolgrid_core::workspace::{self, FileEntry};
        let digest = workspace::blob_digest(text);
        let head = self
            .store
            .workspace_head(key)
            .await
            .map_err(|e| e.to_string())?;
        if head
            .tree
            .files
            .get(&path)
            .is_some_and(|f| f.digest == digest)
        {
            return Ok(());
        }
        let mut tree = head.tree.clone();
        tree.files.insert(
            path,
            FileEntry {
                digest: digest.clone(),
                size: text.len() as u64,
            },
        );
        workspace::Limits::default()
            .check(&tree)
            .map_err(|e| e.to_string())?;
        let commit = workspace::Commit {
            tree,
            blobs: vec![(digest, text.to_vec())],
        };
        match self
            .store
            .commit_workspace(key, head.version, commit, call_id)
            .await
        {
            Ok(Some(version)) => {
                tracing::info!(call = %call_id, workspace = %key, version, "the call's result was written to its agent's workspace");
                Ok(())
            }
            Ok(None) => Err(format!(
                "workspace {key} moved past version {}",
                head.version
            )),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Page `page` (from 0) of the result of a call `caller` may read, in pages of its
    /// `maxInlineBytes` (`GET /v1/calls/{id}/result?page=N`, the MCP result resource):
    /// `not-found` for a call it may not read, a call without a result (not ended, or
    /// failed), or a page past the last.
    pub async fn result_page(
        &self,
        caller: &Principal,
        id: &str,
        page: u32,
    ) -> Result<results::ResultPage, ApiError> {
        let record = self.get_call(caller, id).await?;
        let Some(result) = record.result.as_ref() else {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("call {id:?} has no result ({})", record.state),
            ));
        };
        let policy = self.result_policy(&record);
        results::page_of(&policy, &record.id, result, page).ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!("the result of call {id:?} has no page {page}"),
            )
        })
    }

    /// Resources of a kind with their status; pools carry their live workers.
    ///
    /// Agents see only the Tools they may call, and no other kind.
    pub fn list_resources(
        &self,
        caller: &Principal,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<proto::ResourceRow>, ApiError> {
        let kind = Kind::parse(kind).or(match kind {
            "releases" | "release" => Some(Kind::ToolRelease),
            "bindings" | "binding" => Some(Kind::ToolBinding),
            "pools" | "pool" => Some(Kind::WorkerPool),
            _ => None,
        });
        let Some(kind) = kind else {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                "unknown kind: use tools, releases, bindings, middleware, agents or pools",
            ));
        };
        if matches!(caller, Principal::Agent { .. }) && kind != Kind::Tool {
            return Err(ApiError::new(
                ErrorKind::PermissionDenied,
                format!("agents may list tools, their calls and oplogs, not {kind} resources"),
            ));
        }
        let snapshot = self.catalog.current();
        let workers = self.scheduler.workers();
        let queued = self.scheduler.queued();
        let reattaching = self.scheduler.reattaching();
        Ok(snapshot
            .resources_of(kind)
            .filter(|r| namespace.is_empty() || r.id.key.namespace == namespace)
            .filter(|r| match caller {
                Principal::Operator { .. } => true,
                Principal::Agent { .. } => snapshot
                    .tools
                    .get(&r.id.key)
                    .is_some_and(|t| authz::may_see_tool(&snapshot, caller, t)),
            })
            .map(|r| {
                if kind == Kind::WorkerPool {
                    let pool = r.id.key.to_string();
                    let live = LivePool::observe(&pool, &workers, &queued, reattaching);
                    live_pool_row(r, &snapshot, live)
                } else {
                    row_of(
                        r,
                        r.ready.status,
                        r.ready.reason.as_str(),
                        &r.ready.message,
                        r.columns.clone(),
                        r.status.clone(),
                    )
                }
            })
            .collect())
    }
}

impl Gateway {
    /// Which tools `agent` may call and why not the others (`toolgrid why`). Operators ask
    /// about any agent (`NAME` or `NAMESPACE/NAME`); an agent only about itself (`agent`
    /// empty or its own name).
    pub fn why(
        &self,
        caller: &Principal,
        agent: &str,
        tool: &str,
    ) -> Result<(toolgrid_core::ids::ObjectKey, Vec<authz::ToolAccess>), ApiError> {
        let key = match (caller, agent) {
            (Principal::Agent { agent }, "") => agent.clone(),
            (Principal::Agent { agent: me }, asked) => {
                if asked != me.name && asked != me.to_string() {
                    return Err(ApiError::new(
                        ErrorKind::PermissionDenied,
                        "an agent may ask only about itself",
                    ));
                }
                me.clone()
            }
            (Principal::Operator { .. }, "") => {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    "name the agent to explain",
                ));
            }
            (Principal::Operator { .. }, asked) => match asked.split_once('/') {
                Some((ns, name)) => toolgrid_core::ids::ObjectKey::new(ns, name),
                None => toolgrid_core::ids::ObjectKey::new(toolgrid_api::DEFAULT_NAMESPACE, asked),
            },
        };
        let snapshot = self.catalog.current();
        let tool = (!tool.is_empty()).then_some(tool);
        let access = authz::explain(&snapshot, &key, tool);
        if let Some(name) = tool
            && access.is_empty()
        {
            return Err(ApiError::new(
                ErrorKind::UnknownTool,
                format!("no tool {name:?} in namespace {:?}", key.namespace),
            ));
        }
        Ok((key, access))
    }
}

fn row_of(
    state: &ResourceState,
    ready: bool,
    reason: &str,
    message: &str,
    columns: Vec<(String, String)>,
    status: Value,
) -> proto::ResourceRow {
    proto::ResourceRow {
        kind: state.id.kind.as_str().into(),
        namespace: state.id.key.namespace.clone(),
        name: state.id.key.name.clone(),
        ready: if ready { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        generation: state.generation,
        observed_generation: state
            .status
            .get("observedGeneration")
            .and_then(Value::as_i64)
            .unwrap_or_default(),
        source: state.source.clone(),
        columns: columns
            .into_iter()
            .map(|(name, value)| proto::Column { name, value })
            .collect(),
        status_json: status.to_string(),
    }
}

/// A pool's row: valid in the catalog, and Ready as [`pool_ready`] decides (the same as
/// the WorkerPool status the controller writes).
fn live_pool_row(state: &ResourceState, snapshot: &Snapshot, live: LivePool) -> proto::ResourceRow {
    let live = LivePool {
        desired: snapshot
            .pools
            .get(&state.id.key)
            .map(|p| p.desired_workers)
            .unwrap_or_default(),
        ..live
    };
    let mut columns = state.columns.clone();
    columns.push(("Attached".into(), live.attached.to_string()));
    columns.push(("Busy".into(), live.busy.to_string()));
    columns.push(("Queued".into(), live.queued.to_string()));
    let mut status: WorkerPoolStatus =
        serde_json::from_value(state.status.clone()).unwrap_or_default();
    status.attached_workers = live.attached;
    status.busy_slots = live.busy;
    status.queued_calls = live.queued;
    let status = serde_json::to_value(&status).unwrap_or_default();
    let ready = if state.ready.status {
        pool_ready(&live)
    } else {
        state.ready.clone()
    };
    row_of(
        state,
        ready.status,
        ready.reason.as_str(),
        &ready.message,
        columns,
        status,
    )
}

/// The refusal of a cancel of a call that has ended.
fn not_cancellable(record: &CallRecord) -> ApiError {
    ApiError::new(
        ErrorKind::NotCancellable,
        format!(
            "call {} has ended already ({}); cancellation is not rollback",
            record.id, record.state
        ),
    )
}

/// Fingerprint of a request: the same key with a different request is a conflict, and an
/// agent's request with the same fingerprint within the repeat window is a repeat. A dry
/// run is a different request from the real call (so a dry run never makes the real call
/// a repeat, and its idempotency key never answers the real call with the dry run's
/// result); other fingerprints are as before dry runs existed.
fn request_hash(
    namespace: &str,
    tool: &str,
    command: &str,
    args: &Value,
    stdin: &[u8],
    dry_run: bool,
) -> String {
    let mut map = Map::new();
    if dry_run {
        map.insert("dryRun".into(), json!(true));
    }
    map.insert("namespace".into(), json!(namespace));
    map.insert("tool".into(), json!(tool));
    map.insert("command".into(), json!(command));
    map.insert("args".into(), args.clone());
    map.insert("stdin".into(), json!(hex::encode(Sha256::digest(stdin))));
    hex::encode(Sha256::digest(Value::Object(map).to_string().as_bytes()))
}

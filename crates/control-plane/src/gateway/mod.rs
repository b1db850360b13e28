//! The front doors (gRPC and HTTP) and what they share: admitting a call (find the tool,
//! pick the release, validate arguments and stdin, record it under its idempotency key),
//! waiting for its end, and reading calls, oplogs and resources.

mod admission;
mod approvals;
pub mod audit;
pub mod authn;
pub mod authz;
mod chain;
pub mod console;
pub mod convert;
mod drain;
pub mod follow;
mod grpc;
mod http;
pub mod http_error;
pub mod mcp;
mod model_schemas;
pub mod nested;
pub mod refresh;
pub mod results;
mod rollout;
mod sse;
pub mod workspaces;

pub use admission::{Admitted, DEFAULT_REPEAT_WINDOW, Invocation, MAX_IDEMPOTENCY_KEY_BYTES};
pub use authn::Authenticator;
pub use grpc::{AuthenticatedTools, ToolsService};
pub use http::{router, router_with};
pub use refresh::{RefreshReport, SourceRefresher};

use toolgrid_core::auth::Principal;

use crate::scheduler::{CallUpdate, CallWatch, Scheduler};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use toolgrid_api::Kind;
use toolgrid_api::WorkerPoolStatus;
use toolgrid_catalog::pool_health::{LivePool, pool_ready};
use toolgrid_catalog::{Catalog, ResourceState, Snapshot};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::middleware::redact::Redactor;
use toolgrid_proto as proto;
use toolgrid_store::{CallFilter, CallRecord, OplogRecord, Store, now_ms};

/// Who made a call, as audit records and the call's spec name them:
/// `operator:<subject>` or `agent:<namespace>/<name>`.
pub fn caller_name(caller: &Principal) -> String {
    match caller {
        Principal::Operator { subject } => format!("operator:{subject}"),
        Principal::Agent { agent } => format!("agent:{agent}"),
    }
}

/// Bytes of entries one page of an oplog carries, within any gRPC client's default 4 MiB
/// message limit.
pub const OPLOG_PAGE_BYTES: usize = 2 << 20;

/// Entries one page of an oplog carries at most (within the store's
/// [`toolgrid_store::MAX_OPLOG_PAGE_ENTRIES`], which the gateway asks one more of to know
/// whether there is a next page).
pub const OPLOG_PAGE_ENTRIES: u32 = 500;

/// `fetched` (consecutive entries, one more than a page when there are more) cut to one
/// page: at most [`OPLOG_PAGE_ENTRIES`] entries and [`OPLOG_PAGE_BYTES`] (a larger single
/// entry travels alone), and the seq the next page starts at, if any.
fn page_of(fetched: Vec<OplogRecord>) -> (Vec<OplogRecord>, Option<u64>) {
    let mut page = Vec::new();
    let mut bytes = 0;
    for record in fetched {
        let size = record.payload.len() + record.kind.len() + 64;
        if page.len() >= OPLOG_PAGE_ENTRIES as usize
            || (!page.is_empty() && bytes + size > OPLOG_PAGE_BYTES)
        {
            return (page, Some(record.seq));
        }
        bytes += size;
        page.push(record);
    }
    (page, None)
}

/// Oplog entries as an agent reads them: through the call's redaction, if it has one;
/// withheld ([`ErrorKind::MiddlewareFailed`]) when its rules do not compile.
fn agent_view(
    redactor: Result<Option<Arc<Redactor>>, toolgrid_core::call::CallError>,
    entries: &mut [OplogRecord],
) -> Result<(), ApiError> {
    match redactor {
        Ok(Some(redactor)) => {
            entries.iter_mut().for_each(|e| redactor.redact_record(e));
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(error) => Err(ApiError::new(
            ErrorKind::MiddlewareFailed,
            format!(
                "the call's redaction does not compile, so its oplog is withheld: {}",
                error.message
            ),
        )),
    }
}

/// Oplog entries as an agent reads them, scrubbed of the call's secret values; withheld
/// ([`ErrorKind::SecretUnavailable`]) when those values cannot be read, since what they
/// would scrub cannot be known.
fn scrubbed_view(
    scrubber: Result<toolgrid_core::secret::scrub::Scrubber, crate::scheduler::SecretError>,
    entries: &mut [OplogRecord],
) -> Result<(), ApiError> {
    match scrubber {
        Ok(scrubber) => {
            entries.iter_mut().for_each(|e| scrubber.scrub_record(e));
            Ok(())
        }
        Err(error) => Err(ApiError::new(
            ErrorKind::SecretUnavailable,
            format!("the call's secrets cannot be read, so its oplog is withheld: {error}"),
        )),
    }
}

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
    /// How long console sessions opened here live.
    console_limits: std::sync::RwLock<toolgrid_core::auth::SessionLimits>,
    /// The keys identity tokens for upstreams are signed with, published at
    /// [`crate::identity::JWKS_PATH`]; unset, that path answers 404.
    identity: crate::identity::IssuerCell,
    /// Who reads a ToolSource again on `toolgrid refresh`.
    refresher: std::sync::OnceLock<Arc<dyn SourceRefresher>>,
    /// Where each binding's canary rollout is.
    rollouts: Arc<crate::rollout::RolloutBook>,
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
            console_limits: Default::default(),
            identity: Default::default(),
            refresher: std::sync::OnceLock::new(),
            rollouts: Default::default(),
        })
    }

    /// Sets the keys identity tokens are signed with and the platform's URL they name as
    /// issuer (once; later calls are ignored).
    pub fn set_identity(&self, keys: crate::identity::IdentityKeys, url: String) {
        let _ = self.identity.set(crate::identity::Issuer { keys, url });
    }

    /// The keys identity tokens are signed with, if set.
    pub fn identity(&self) -> Option<&crate::identity::IdentityKeys> {
        self.identity.get().map(|issuer| &issuer.keys)
    }

    /// The shared cell of the issuer (set by [`Self::set_identity`]).
    pub fn issuer(&self) -> crate::identity::IssuerCell {
        self.identity.clone()
    }

    /// Where each binding's canary rollout is (the catalog's sources resolve with it).
    pub fn rollouts(&self) -> Arc<crate::rollout::RolloutBook> {
        self.rollouts.clone()
    }

    /// Sets how long console sessions opened from now on live (idle, and in all).
    pub fn set_console_limits(&self, limits: toolgrid_core::auth::SessionLimits) {
        *self
            .console_limits
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = limits;
    }

    /// How long console sessions opened now live.
    pub fn console_limits(&self) -> toolgrid_core::auth::SessionLimits {
        *self
            .console_limits
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The caller behind a request's `authorization` value, acting as `act_as` (the
    /// `toolgrid-as` header) if given: [`ErrorKind::Unauthenticated`] for no token or an
    /// unknown one, [`ErrorKind::RateLimited`] for too many unknown tokens from `peer`, the
    /// client's address.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        act_as: Option<&str>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Principal, ApiError> {
        let snapshot = self.catalog.current();
        let result = self
            .auth
            .authenticate(authorization, act_as, peer, &snapshot)
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
            let finished = {
                let update = updates.borrow_and_update();
                update
                    .finished
                    .clone()
                    .map(|done| (done, update.finished_at))
            };
            if let Some((done, at)) = finished {
                if let Some(at) = at {
                    crate::metrics::stage(crate::metrics::Stage::Reply, at.elapsed());
                }
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
        let not_found = || {
            ApiError::new(
                ErrorKind::NotFound,
                format!("no call with idempotency key {key:?} in {namespace:?}"),
            )
        };
        // The key's scope is the agent's name; the namespace came from the request, so the
        // record found is checked like a lookup by id: another namespace's agent of the
        // same name is another agent, and its call is not found.
        let record = self
            .store
            .find_call_by_key(&namespace, authz::agent_scope(caller), key)
            .await?
            .ok_or_else(not_found)?;
        if authz::may_read_call(caller, &record) {
            Ok(record)
        } else {
            Err(not_found())
        }
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

    /// One page of a call's oplog from `from_seq`, as `caller` may read it: the entries
    /// while the page stays within [`OPLOG_PAGE_BYTES`] and [`OPLOG_PAGE_ENTRIES`] (a larger
    /// single entry travels alone), and the seq the next page starts at, if any. The store
    /// reads only this page ([`toolgrid_store::CallLog::oplog_page`]), and the page passes
    /// [`Gateway::readable_oplog`]: every front door (gRPC, HTTP, the console, the CLI
    /// through gRPC) reads an oplog here and nowhere else.
    pub async fn oplog_page(
        &self,
        caller: &Principal,
        call_id: &str,
        from_seq: u64,
    ) -> Result<(Vec<OplogRecord>, Option<u64>), ApiError> {
        let record = self.get_call(caller, call_id).await?;
        let mut fetched = self
            .store
            .oplog_page(call_id, from_seq, OPLOG_PAGE_ENTRIES + 1)
            .await?;
        self.readable_oplog(caller, &record, &mut fetched)?;
        Ok(page_of(fetched))
    }

    /// Oplog entries of `record` as `caller` may read them. An operator reads the oplog
    /// as recorded (raw: what a replay uses). An agent reads it through the call's
    /// redaction (its redact steps, fixed at admission), the same the call's result and
    /// progress passed ([`Redactor::redact_record`]), and scrubbed of the values of the
    /// secrets the call was granted, as the worker scrubbed its result (an upstream that
    /// echoes a credential records it in a response); a call whose redaction does not
    /// compile has its oplog withheld ([`ErrorKind::MiddlewareFailed`]), and so does one
    /// whose secrets cannot be read now ([`ErrorKind::SecretUnavailable`]).
    fn readable_oplog(
        &self,
        caller: &Principal,
        record: &CallRecord,
        entries: &mut [OplogRecord],
    ) -> Result<(), ApiError> {
        match caller {
            Principal::Operator { .. } => Ok(()),
            Principal::Agent { .. } => {
                agent_view(self.scheduler.redactor(record), entries)?;
                scrubbed_view(self.scheduler.scrubber(record), entries)
            }
        }
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
    /// operator sees every command of every tool, an agent its bound ones whose exposure is
    /// `direct` or `both`. The description of a tool that runs programs (`codeMode`, the
    /// `code` built-in) lists, as typed stubs, the tools its programs may call (exposure
    /// `codemode` or `both`).
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
                    Ok(allowed) => {
                        if allowed.exposure.direct() {
                            toolgrid_catalog::model_tools::model_tools_of(
                                t,
                                Some(allowed.commands.as_slice()),
                            )
                        } else {
                            Vec::new()
                        }
                    }
                    Err(_) => Vec::new(),
                },
            })
            .collect();
        let runs_programs = |name: &str| {
            snapshot
                .tools
                .values()
                .any(|t| t.key.namespace == namespace && t.key.name == name && t.spec.code_mode)
        };
        if tools.iter().any(|t| runs_programs(&t.tool)) {
            let stubs = nested::stubs_of(&self.programmable_tools(caller, &namespace));
            for tool in tools.iter_mut().filter(|t| runs_programs(&t.tool)) {
                tool.description = nested::describe_code(&tool.description, &stubs);
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// The tools `caller`'s programs may call in `namespace` (exposure `codemode` or
    /// `both`; an operator: all), with the commands allowed (`None`: all).
    pub fn programmable_tools(
        &self,
        caller: &Principal,
        namespace: &str,
    ) -> Vec<(Arc<toolgrid_catalog::ResolvedTool>, Option<Vec<String>>)> {
        let namespace = Self::namespace(caller, namespace);
        let snapshot = self.catalog.current();
        snapshot
            .tools
            .values()
            .filter(|t| t.key.namespace == namespace && !t.spec.code_mode)
            .filter_map(|t| match caller {
                Principal::Operator { .. } => Some((t.clone(), None)),
                Principal::Agent { agent } => authz::decide(&snapshot, agent, t, None)
                    .ok()
                    .filter(|allowed| allowed.exposure.codemode())
                    .map(|allowed| (t.clone(), Some(allowed.commands))),
            })
            .collect()
    }

    /// `tools.search(query)` of a program of `caller`'s: the best matches among the tools
    /// it may call, each with its typed signature.
    pub fn search_programmable(
        &self,
        caller: &Principal,
        namespace: &str,
        query: &str,
        limit: usize,
    ) -> Vec<Value> {
        nested::rank(&self.programmable_tools(caller, namespace), query, limit)
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
            "sources" | "source" => Some(Kind::ToolSource),
            _ => None,
        });
        let Some(kind) = kind else {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                "unknown kind: use tools, releases, bindings, middleware, agents, pools or sources",
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

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::call::{CallError, HttpResponse, OplogEntry, ProgressReport, RedactRules};

    fn record(seq: u64, entry: &OplogEntry) -> OplogRecord {
        let (kind, payload) = entry.to_parts();
        OplogRecord {
            seq,
            epoch: 1,
            kind: kind.as_str().to_string(),
            payload: payload.to_string(),
            recorded_at_ms: 0,
        }
    }

    fn progress(seq: u64, message: &str) -> OplogRecord {
        record(
            seq,
            &OplogEntry::Progress(ProgressReport {
                message: message.into(),
            }),
        )
    }

    #[test]
    fn a_page_stops_at_its_entry_count_or_its_bytes_and_names_the_next_seq() {
        // One more than a page: the page, and the next one starts at the extra entry.
        let fetched: Vec<_> = (0..=u64::from(OPLOG_PAGE_ENTRIES))
            .map(|seq| progress(seq + 7, "x"))
            .collect();
        let (page, next) = page_of(fetched.clone());
        assert_eq!(page, fetched[..OPLOG_PAGE_ENTRIES as usize]);
        assert_eq!(next, Some(7 + u64::from(OPLOG_PAGE_ENTRIES)));
        // Fewer: all of them, and no next page.
        let (page, next) = page_of(fetched[..3].to_vec());
        assert_eq!((page.len(), next), (3, None));
        // Bytes: two entries of more than half a page do not share one; one larger than a
        // page travels alone.
        let big = "b".repeat(OPLOG_PAGE_BYTES / 2 + 1);
        let (page, next) = page_of(vec![progress(1, &big), progress(2, &big)]);
        assert_eq!((page.len(), next), (1, Some(2)));
        let huge = "h".repeat(OPLOG_PAGE_BYTES + 1);
        let (page, next) = page_of(vec![progress(5, &huge)]);
        assert_eq!((page.len(), next), (1, None));
    }

    #[test]
    fn an_agent_reads_the_oplog_through_the_calls_redaction_or_not_at_all() {
        let rules = RedactRules {
            paths: vec![],
            patterns: vec![r"sk-[a-z0-9]+".into()],
            replacement: "[REDACTED]".into(),
        };
        let raw = vec![
            progress(1, "found sk-abc1"),
            record(
                2,
                &OplogEntry::HttpResponse(HttpResponse {
                    seq: 1,
                    status: 200,
                    headers: vec![],
                    body: b"token sk-def2".to_vec(),
                }),
            ),
        ];
        let mut entries = raw.clone();
        agent_view(
            Ok(Some(Arc::new(Redactor::new(&rules).unwrap()))),
            &mut entries,
        )
        .unwrap();
        assert_eq!(entries[0], progress(1, "found [REDACTED]"));
        let OplogEntry::HttpResponse(response) = entries[1].entry().unwrap() else {
            panic!("{:?}", entries[1])
        };
        assert_eq!(response.body, b"token [REDACTED]");

        // No redaction: as recorded.
        let mut entries = raw.clone();
        agent_view(Ok(None), &mut entries).unwrap();
        assert_eq!(entries, raw);

        // Rules that do not compile: withheld, with the kind the call itself fails with.
        let mut entries = raw.clone();
        let refused = agent_view(
            Err(CallError::new(
                toolgrid_core::call::ErrorKind::MiddlewareFailed,
                "bad pattern",
            )),
            &mut entries,
        )
        .unwrap_err();
        assert_eq!(refused.kind, ErrorKind::MiddlewareFailed);
        assert!(refused.message.contains("withheld"), "{}", refused.message);
    }

    #[test]
    fn an_agent_reads_the_oplog_scrubbed_of_its_secrets_or_not_at_all() {
        use toolgrid_core::secret::{SecretValue, scrub::Scrubber};
        let raw = vec![
            progress(1, "echoed tok-7f3a9c2e1d"),
            record(
                2,
                &OplogEntry::HttpResponse(HttpResponse {
                    seq: 1,
                    status: 200,
                    headers: vec![("authorization".into(), "Bearer tok-7f3a9c2e1d".into())],
                    body: b"{\"auth\":\"Bearer tok-7f3a9c2e1d\"}".to_vec(),
                }),
            ),
        ];
        let mut entries = raw.clone();
        let scrubber = Scrubber::new(&[SecretValue::new("tok-7f3a9c2e1d")]);
        scrubbed_view(Ok(scrubber), &mut entries).unwrap();
        assert_eq!(entries[0], progress(1, "echoed [secret]"));
        let OplogEntry::HttpResponse(response) = entries[1].entry().unwrap() else {
            panic!("{:?}", entries[1])
        };
        assert_eq!(response.headers[0].1, "Bearer [secret]");
        assert_eq!(response.body, br#"{"auth":"Bearer [secret]"}"#);

        // Secrets that cannot be read now: withheld, never shown unscrubbed.
        let mut entries = raw.clone();
        let refused =
            scrubbed_view(Err(crate::scheduler::SecretError::NoSource), &mut entries).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::SecretUnavailable);
    }
}

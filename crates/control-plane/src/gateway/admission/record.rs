//! Admission's last pure step: the call as the store records it, from everything the steps
//! before decided (the command, its checked arguments, the grant, the release, what the
//! middleware chain decided). Time and the call's id are given, so the same decisions
//! always make the same record.

use super::DEFAULT_REPEAT_WINDOW;
use super::request::request_hash;
use crate::gateway::caller_name;
use serde_json::Value;
use toolgrid_catalog::{ResolvedRelease, ResolvedTool};
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{
    CallAccess, CallSpec, CallStarted, ChainRecord, DRY_RUN_ACKNOWLEDGED, NewCall, RunLimits,
    retry::RetrySpec,
};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::{CommandInterface, ValidArgs};
use toolgrid_core::spec::Effect;

/// What admission decided about one call.
pub(super) struct Admission<'a> {
    pub id: String,
    pub now_ms: i64,
    pub caller: &'a Principal,
    pub namespace: &'a str,
    pub tool: &'a ResolvedTool,
    pub command: &'a CommandInterface,
    pub args: &'a ValidArgs,
    pub stdin: Vec<u8>,
    pub idempotency_key: Option<String>,
    pub dry_run: bool,
    pub release: &'a ResolvedRelease,
    pub pool: &'a ObjectKey,
    pub access: CallAccess,
    pub chain: ChainRecord,
    /// The trace context of the call's admission span, kept with the call.
    pub traceparent: Option<String>,
}

/// The call to record.
pub(super) fn new_call(admission: Admission<'_>) -> NewCall {
    let Admission {
        id,
        now_ms,
        caller,
        namespace,
        tool,
        command,
        args,
        stdin,
        idempotency_key,
        dry_run,
        release,
        pool,
        access,
        chain,
        traceparent,
    } = admission;
    let argv = command.build_argv(&tool.key.name, args);
    // The command's own artifact, files and limits when the release gives it some.
    let runs = release.run_of(&command.name);
    let args_value = Value::Object(args.0.clone());
    let request_hash = request_hash(
        namespace,
        &tool.key.name,
        &command.name,
        &args_value,
        &stdin,
        dry_run,
    );
    let timeout_ms = tool.timeout.as_millis() as u64;
    let command_spec = tool.spec.command(&command.name);
    // A dry run of a command that changes the world is answered without running it.
    let dry_run_result = (dry_run && tool.effect != Effect::Read).then(|| {
        command_spec
            .and_then(|c| c.dry_run_result.clone())
            .unwrap_or_else(|| Value::String(DRY_RUN_ACKNOWLEDGED.into()))
    });
    // Only an agent's calls are checked for repeats, and never a dry run's.
    let repeat_window_ms = match caller {
        Principal::Agent { .. } if !dry_run && !command_spec.is_some_and(|c| c.allow_repeat) => {
            let window = tool
                .spec
                .repeat_window
                .map(|w| w.get())
                .unwrap_or(DEFAULT_REPEAT_WINDOW);
            (!window.is_zero()).then_some(window.as_millis() as i64)
        }
        _ => None,
    };
    let started = CallStarted {
        namespace: namespace.to_string(),
        tool: tool.key.name.clone(),
        command: command.name.clone(),
        release: release.key.name.clone(),
        version: release.version.to_string(),
        digest: runs.digest.to_string(),
        args: args_value.clone(),
        argv: argv.clone(),
        stdin_bytes: stdin.len() as u64,
        idempotency_key: idempotency_key.clone(),
        dry_run,
        middleware: chain.decisions.clone(),
    };
    NewCall {
        id,
        namespace: namespace.to_string(),
        tool: tool.key.name.clone(),
        command: command.name.clone(),
        release: release.key.name.clone(),
        release_digest: runs.digest.to_string(),
        args: args_value,
        spec: CallSpec {
            pool: pool.to_string(),
            argv,
            env: Default::default(),
            limits: RunLimits {
                memory_bytes: runs.limits.memory_bytes,
                cpu_time_ms: runs.limits.cpu_time.as_millis() as u64,
                output_bytes: runs.limits.output_bytes,
                timeout_ms,
                max_timeout_ms: tool
                    .spec
                    .max_timeout
                    .map(|max| max.get().as_millis() as u64)
                    .unwrap_or(timeout_ms)
                    .max(timeout_ms),
                instances: runs.limits.instances,
                request_bytes: runs.limits.request_bytes,
                response_bytes: runs.limits.response_bytes,
            },
            effect: tool.effect,
            command: Some(command.definition().clone()),
            deadline_ms: now_ms + timeout_ms as i64,
            egress: release.network.egress.clone(),
            access,
            caller: caller_name(caller),
            dry_run,
            chain,
            retry: Some(RetrySpec::of(tool.effect, tool.spec.retry.as_ref())),
            result_policy: tool.spec.result_policy.clone(),
            code_mode: tool.spec.code_mode,
            upstream: release.upstream.as_deref().cloned(),
            files: runs.files.to_vec(),
            traceparent,
        },
        stdin,
        idempotency_key,
        request_hash,
        started,
        assign_to: None,
        repeat_window_ms,
        dry_run_result,
    }
}

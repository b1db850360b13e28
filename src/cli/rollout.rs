//! `toolgrid rollout status|promote|abort TOOL`: a tool's canary rollouts, and an
//! operator's hand on them.

use super::client::{Endpoint, connect, fail};
use std::process::ExitCode;
use toolgrid_core::error::ApiError;
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Where each canary of the tool is: the split, the step, and what each release did
    /// since the step began.
    Status(Target),
    /// The next step now; with `--full`, every new call to the canary now.
    Promote {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        full: bool,
    },
    /// Roll back: every new call to the stable release (condition `Degraded`).
    Abort(Target),
}

#[derive(clap::Args, Debug)]
struct Target {
    /// The tool (`NAME` or `NAMESPACE/NAME`).
    tool: String,
    /// Only the rollout of this binding (default: every binding of the tool with a canary).
    #[arg(long)]
    binding: Option<String>,
    /// Namespace (default `default`).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// `table` or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn run(args: RolloutArgs) -> ExitCode {
    let (target, action) = match args.action {
        Action::Status(target) => (target, proto::RolloutAction::Status),
        Action::Promote {
            target,
            full: false,
        } => (target, proto::RolloutAction::Promote),
        Action::Promote { target, full: true } => (target, proto::RolloutAction::PromoteFull),
        Action::Abort(target) => (target, proto::RolloutAction::Abort),
    };
    let (namespace, tool) = super::client::namespaced(&target.tool, target.namespace.as_deref());
    let result = async {
        let mut client = connect(&target.endpoint).await?;
        let response = client
            .rollout(proto::RolloutRequest {
                namespace,
                tool,
                binding: target.binding.clone().unwrap_or_default(),
                action: action as i32,
            })
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        Ok::<_, ApiError>(response)
    }
    .await;
    let response = match result {
        Ok(response) => response,
        Err(error) => return fail(error),
    };
    if target.output == "json" {
        let rows: Vec<serde_json::Value> = response
            .rollouts
            .iter()
            .map(|r| {
                serde_json::json!({
                    "namespace": r.namespace,
                    "binding": r.binding,
                    "stable": r.stable,
                    "canary": r.canary,
                    "weight": r.weight,
                    "phase": r.phase,
                    "step": r.step,
                    "steps": r.steps,
                    "message": r.message,
                    "stableCalls": r.stable_calls,
                    "stableErrors": r.stable_errors,
                    "canaryCalls": r.canary_calls,
                    "canaryErrors": r.canary_errors,
                    "stepStartedMs": r.step_started_ms,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return ExitCode::SUCCESS;
    }
    let rows: Vec<Vec<String>> = response
        .rollouts
        .iter()
        .map(|r| {
            vec![
                r.binding.clone(),
                r.stable.clone(),
                r.canary.clone(),
                format!("{}%", r.weight),
                r.phase.clone(),
                format!("{}/{} {:?}", r.step, r.steps.len(), r.steps),
                format!("{}/{}", r.stable_errors, r.stable_calls),
                format!("{}/{}", r.canary_errors, r.canary_calls),
                r.message.clone(),
            ]
        })
        .collect();
    super::table::print(
        &[
            "BINDING",
            "STABLE",
            "CANARY",
            "WEIGHT",
            "PHASE",
            "STEP",
            "STABLE ERR/CALLS",
            "CANARY ERR/CALLS",
            "MESSAGE",
        ],
        &rows,
    );
    ExitCode::SUCCESS
}

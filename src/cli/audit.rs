//! `toolgrid audit`: the audit log, newest first (operators only).

use super::client::{Endpoint, connect, fail};
use std::process::ExitCode;
use toolgrid_core::call::{AuditRecord, Verdict};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Only this agent's calls.
    #[arg(long)]
    agent: Option<String>,
    /// Only calls of this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only records since then: a duration back from now (`10m`, `2h`), an RFC 3339 time,
    /// or Unix milliseconds.
    #[arg(long)]
    since: Option<String>,
    /// Only this namespace (every namespace when not given).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// `table` or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[arg(long, default_value_t = 100)]
    limit: u32,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn run(args: AuditArgs) -> ExitCode {
    match list(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

async fn list(args: AuditArgs) -> Result<(), ApiError> {
    let since_ms = toolgrid_core::middleware::audit::parse_since(
        args.since.as_deref().unwrap_or(""),
        toolgrid_core::call::now_ms(),
    )
    .map_err(|message| ApiError::new(ErrorKind::InvalidArgument, message))?
    .unwrap_or(0);
    let mut client = connect(&args.endpoint).await?;
    let response = client
        .list_audit(proto::ListAuditRequest {
            namespace: args.namespace.unwrap_or_default(),
            agent: args.agent.unwrap_or_default(),
            tool: args.tool.unwrap_or_default(),
            since_ms,
            limit: args.limit,
        })
        .await
        .map_err(|s| error_of(&s))?
        .into_inner();
    let records: Vec<AuditRecord> = response
        .records_json
        .iter()
        .map(|text| {
            serde_json::from_str(text).map_err(|e| {
                ApiError::new(
                    ErrorKind::Internal,
                    format!("an audit record does not parse: {e}"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    if args.output == "json" {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        println!("{text}");
    } else {
        let rows: Vec<Vec<String>> = records.iter().map(row).collect();
        super::table::print(
            &[
                "TIME",
                "CALL",
                "AGENT",
                "TOOL",
                "COMMAND",
                "OUTCOME",
                "KIND",
                "DURATION",
                "MIDDLEWARE",
            ],
            &rows,
        );
    }
    Ok(())
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// One table row: the middleware column names each step that did more than allow.
fn row(r: &AuditRecord) -> Vec<String> {
    let time = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.at_ms.max(0) as u64),
    )
    .to_string();
    let middleware: Vec<String> = r
        .decisions
        .iter()
        .filter(|d| d.verdict != Verdict::Allow)
        .map(|d| {
            let verdict = serde_json::to_value(d.verdict)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            if d.middleware.is_empty() {
                format!("{}:{verdict}", d.kind)
            } else {
                format!("{}:{verdict}", d.middleware)
            }
        })
        .collect();
    vec![
        time,
        r.call_id.clone(),
        dash(&r.agent),
        r.tool.clone(),
        dash(&r.command),
        r.outcome.as_str().to_string(),
        r.error_kind
            .map(|k| k.as_str().to_string())
            .unwrap_or_else(|| "-".into()),
        format!("{}ms", r.duration_ms),
        dash(&middleware.join(",")),
    ]
}

//! `toolgrid workspace ls|cat|history|diff AGENT ...`: an agent's workspace, read through the
//! `Workspaces` gRPC service.

use super::client::{Endpoint, fail};
use super::table;
use std::io::Write;
use std::process::ExitCode;
use tonic::transport::Channel;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto::status::error_of;
use toolgrid_proto::{self as proto, workspaces_client::WorkspacesClient};

#[derive(clap::Args, Debug)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    command: WorkspaceCommand,
    /// The agent's namespace.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

#[derive(clap::Subcommand, Debug)]
enum WorkspaceCommand {
    /// The files of a version (the newest by default), under PATH if given.
    Ls {
        agent: String,
        path: Option<String>,
        /// The version to read (`-v V` or `--at V`); the newest by default.
        #[arg(id = "at", long = "at", short = 'v', value_name = "V")]
        version: Option<u64>,
        /// `table` or `json`.
        #[arg(long, short = 'o', default_value = "table")]
        output: String,
    },
    /// Print one file of a version (the newest by default).
    Cat {
        agent: String,
        path: String,
        /// The version to read (`-v V` or `--at V`); the newest by default.
        #[arg(id = "at", long = "at", short = 'v', value_name = "V")]
        version: Option<u64>,
    },
    /// Every version, oldest first: its number, tree digest, size, and the call that made it.
    History {
        agent: String,
        /// `table` or `json`.
        #[arg(long, short = 'o', default_value = "table")]
        output: String,
    },
    /// What changed from version V1 to version V2 (A added, D removed, M modified).
    Diff { agent: String, v1: u64, v2: u64 },
}

type Client = WorkspacesClient<
    tonic::service::interceptor::InterceptedService<Channel, super::client::Credentials>,
>;

async fn connect(endpoint: &Endpoint) -> Result<Client, ApiError> {
    let (channel, credentials) = super::client::dial(endpoint).await?;
    Ok(
        WorkspacesClient::with_interceptor(channel, credentials)
            .max_decoding_message_size(64 << 20),
    )
}

fn when(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64),
    )
    .to_string()
}

pub async fn run(args: WorkspaceArgs) -> ExitCode {
    match command(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

async fn command(args: WorkspaceArgs) -> Result<(), ApiError> {
    let mut client = connect(&args.endpoint).await?;
    let namespace = args.namespace;
    match args.command {
        WorkspaceCommand::Ls {
            agent,
            path,
            version,
            output,
        } => {
            let found = client
                .get_workspace_version(proto::GetWorkspaceVersionRequest {
                    namespace,
                    agent,
                    version,
                })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner();
            let prefix = path
                .map(|p| format!("{}/", p.trim_end_matches('/')))
                .unwrap_or_default();
            let files: Vec<&proto::WorkspaceFile> = found
                .files
                .iter()
                .filter(|f| f.path.starts_with(&prefix))
                .collect();
            if output == "json" {
                let rows: Vec<serde_json::Value> = files
                    .iter()
                    .map(
                        |f| serde_json::json!({"path": f.path, "size": f.size, "digest": f.digest}),
                    )
                    .collect();
                let doc = serde_json::json!({"version": found.version, "files": rows});
                println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            } else {
                let rows: Vec<Vec<String>> = files
                    .iter()
                    .map(|f| vec![f.path.clone(), f.size.to_string(), f.digest.clone()])
                    .collect();
                table::print(&["PATH", "SIZE", "DIGEST"], &rows);
            }
        }
        WorkspaceCommand::Cat {
            agent,
            path,
            version,
        } => {
            let mut stream = client
                .read_workspace_file(proto::ReadWorkspaceFileRequest {
                    namespace,
                    agent,
                    path,
                    version,
                })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner();
            let mut stdout = std::io::stdout().lock();
            while let Some(chunk) = stream.message().await.map_err(|s| error_of(&s))? {
                stdout.write_all(&chunk.data).map_err(|e| {
                    ApiError::new(ErrorKind::Internal, format!("cannot write stdout: {e}"))
                })?;
            }
        }
        WorkspaceCommand::History { agent, output } => {
            let versions = client
                .list_workspace_versions(proto::ListWorkspaceVersionsRequest { namespace, agent })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner()
                .versions;
            if output == "json" {
                let rows: Vec<serde_json::Value> = versions
                    .iter()
                    .map(|v| {
                        serde_json::json!({
                            "version": v.version, "treeDigest": v.tree_digest,
                            "files": v.file_count, "bytes": v.total_bytes,
                            "createdAtMs": v.created_at_ms, "callId": v.call_id,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                let rows: Vec<Vec<String>> = versions
                    .iter()
                    .map(|v| {
                        vec![
                            v.version.to_string(),
                            v.file_count.to_string(),
                            v.total_bytes.to_string(),
                            when(v.created_at_ms),
                            v.call_id.clone(),
                            v.tree_digest.clone(),
                        ]
                    })
                    .collect();
                table::print(
                    &["VERSION", "FILES", "BYTES", "CREATED", "CALL", "TREE"],
                    &rows,
                );
            }
        }
        WorkspaceCommand::Diff { agent, v1, v2 } => {
            let changes = client
                .diff_workspace_versions(proto::DiffWorkspaceVersionsRequest {
                    namespace,
                    agent,
                    from: v1,
                    to: v2,
                })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner()
                .changes;
            for change in changes {
                let letter = match change.kind.as_str() {
                    "added" => 'A',
                    "removed" => 'D',
                    _ => 'M',
                };
                println!("{letter} {}", change.path);
            }
        }
    }
    Ok(())
}

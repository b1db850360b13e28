//! The client commands: `call`, `get`, `calls`, `oplog`, `why`, `approve`, `deny`.

use super::{exit, table};
use serde_json::{Value, json};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto::status::error_of;
use toolgrid_proto::{self as proto, tools_client::ToolsClient};

/// The default control plane address.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:7070";

#[derive(clap::Args, Debug, Clone)]
pub struct Endpoint {
    /// The control plane's gRPC address.
    /// `https://HOST:PORT` for a control plane serving TLS.
    #[arg(long, env = "TOOLGRID_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub(super) endpoint: String,
    /// CA certificate (PEM) to trust for an `https://` endpoint, instead of the system's
    /// roots.
    #[arg(long, env = "TOOLGRID_TLS_CA", global = true)]
    tls_ca: Option<std::path::PathBuf>,
    /// Bearer token; default: the admin token `toolgrid up` wrote to
    /// `$TOOLGRID_DATA/admin-token` (`.toolgrid/admin-token`).
    #[arg(long, env = "TOOLGRID_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Act as this agent (`NAME` or `NAMESPACE/NAME`; operators only).
    #[arg(long = "as", value_name = "AGENT", global = true)]
    act_as: Option<String>,
}

/// The token the CLI sends when none is given: the admin token of the `toolgrid up` whose
/// data directory is `$TOOLGRID_DATA` (default `.toolgrid`), if it can be read.
pub fn default_token() -> Option<String> {
    let data = std::env::var_os("TOOLGRID_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".toolgrid"));
    let text = std::fs::read_to_string(data.join(super::up::ADMIN_TOKEN_FILE)).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Adds `authorization: Bearer TOKEN` (and `toolgrid-as`) to every request.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
    act_as: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    pub fn new(token: Option<&str>, act_as: Option<&str>) -> Result<Self, ApiError> {
        let value = |text: String, what: &str| {
            text.parse::<MetadataValue<Ascii>>().map_err(|_| {
                ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("the {what} is not printable ASCII"),
                )
            })
        };
        Ok(Credentials {
            authorization: token
                .map(|t| value(format!("Bearer {t}"), "token"))
                .transpose()?,
            act_as: act_as
                .map(|a| value(a.to_string(), "--as agent"))
                .transpose()?,
        })
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        if let Some(value) = &self.act_as {
            request.metadata_mut().insert("toolgrid-as", value.clone());
        }
        Ok(request)
    }
}

/// A Tools client that sends its credentials with every request.
pub type Client = ToolsClient<InterceptedService<Channel, Credentials>>;

/// A client over `channel` with `credentials`.
pub fn client_of(channel: Channel, credentials: Credentials) -> Client {
    ToolsClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

pub(super) async fn connect(target: &Endpoint) -> Result<Client, ApiError> {
    let (channel, credentials) = dial(target).await?;
    Ok(client_of(channel, credentials))
}

/// A channel to the control plane `target` names (TLS when it says `https://`), and the
/// credentials to send on it.
pub(super) async fn dial(target: &Endpoint) -> Result<(Channel, Credentials), ApiError> {
    let token = target.token.clone().or_else(default_token);
    let credentials = Credentials::new(token.as_deref(), target.act_as.as_deref())?;
    let endpoint = &target.endpoint;
    let url = toolgrid_proto::tls::endpoint_url(endpoint);
    let channel = toolgrid_proto::tls::Trust::of(target.tls_ca.as_deref(), None)
        .and_then(|trust| toolgrid_proto::tls::client_endpoint(&url, &trust))
        .map_err(|e| {
            ApiError::new(
                ErrorKind::InvalidArgument,
                format!("bad endpoint {endpoint:?}: {e}"),
            )
        })?
        .connect_timeout(std::time::Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "cannot reach the control plane at {endpoint} ({e}); is `toolgrid up` running?"
                ),
            )
        })?;
    Ok((channel, credentials))
}

fn exit_code_of(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::InvalidArgument
        | ErrorKind::IdempotencyConflict
        | ErrorKind::NotAwaitingApproval
        | ErrorKind::NotCancellable
        | ErrorKind::RolloutEnded => exit::USAGE,
        ErrorKind::Unauthenticated
        | ErrorKind::PermissionDenied
        | ErrorKind::Denied
        | ErrorKind::ApprovalTimeout
        | ErrorKind::RepeatedCall => exit::DENIED,
        ErrorKind::Unavailable
        | ErrorKind::RateLimited
        | ErrorKind::QueueFull
        | ErrorKind::MiddlewareFailed => exit::UNAVAILABLE,
        ErrorKind::UnknownTool | ErrorKind::UnknownCommand | ErrorKind::NotFound => exit::NOT_FOUND,
        ErrorKind::Internal => exit::INTERNAL,
        _ => exit::CALL_FAILED,
    }
}

/// Prints a one-line error and returns the exit code for its kind.
pub(super) fn fail(error: ApiError) -> ExitCode {
    eprintln!(
        "toolgrid: {}: {}",
        error.kind,
        error.message.replace('\n', " ")
    );
    ExitCode::from(exit_code_of(error.kind))
}

#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// Read stdin for the tool from FILE, or `-` for this process's stdin.
    #[arg(long, value_name = "FILE|-")]
    stdin: Option<String>,
    /// Return the earlier call with this key instead of running the tool again.
    #[arg(long, value_name = "K")]
    idempotency_key: Option<String>,
    /// Arguments as a JSON object, merged over the command-line ones.
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// Print `result` (the tool's JSON) or the whole `call` record.
    #[arg(long, short = 'o', default_value = "result")]
    output: String,
    /// Show progress on stderr while the call runs.
    #[arg(long)]
    stream: bool,
    /// Print the tool's own progress reports on stderr while the call runs (one line
    /// each: `toolgrid: progress: MESSAGE`).
    #[arg(long)]
    progress: bool,
    /// A dry run: a `read` command runs for real; a `write`, `idempotent` or `external`
    /// one is answered from its `dryRunResult` without running.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    endpoint: Endpoint,
    /// `--help` after TOOL (or TOOL COMMAND) prints the usage generated from the Tool.
    #[arg(skip)]
    help: bool,
    /// TOOL [COMMAND] [ARGS...]. The options above may also follow the tool's arguments;
    /// arguments after `--` all go to the tool. `TOOL [COMMAND] --help` prints the usage
    /// generated from the Tool's definition.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TOOL [COMMAND] [ARGS]"
    )]
    words: Vec<String>,
}

/// Takes toolgrid's own options out of the words after TOOL (until `--`).
fn split_call_options(args: &mut CallArgs) -> Result<Vec<String>, ApiError> {
    let words = std::mem::take(&mut args.words);
    let mut tool_words = Vec::new();
    let mut iter = words.into_iter();
    while let Some(word) = iter.next() {
        if word == "--" {
            tool_words.extend(iter.by_ref());
            break;
        }
        let (name, inline) = match word.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (word.clone(), None),
        };
        let takes_value = matches!(
            name.as_str(),
            "--stdin"
                | "--idempotency-key"
                | "--endpoint"
                | "--tls-ca"
                | "--namespace"
                | "--args"
                | "--output"
                | "--token"
                | "--as"
        );
        if name == "--stream" && inline.is_none() {
            args.stream = true;
            continue;
        }
        if name == "--help" && inline.is_none() {
            args.help = true;
            tool_words.push(word);
            continue;
        }
        if name == "--progress" && inline.is_none() {
            args.progress = true;
            continue;
        }
        if !takes_value {
            tool_words.push(word);
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => iter.next().ok_or_else(|| {
                ApiError::new(ErrorKind::InvalidArgument, format!("{name} needs a value"))
            })?,
        };
        match name.as_str() {
            "--stdin" => args.stdin = Some(value),
            "--idempotency-key" => args.idempotency_key = Some(value),
            "--endpoint" => args.endpoint.endpoint = value,
            "--tls-ca" => args.endpoint.tls_ca = Some(value.into()),
            "--token" => args.endpoint.token = Some(value),
            "--as" => args.endpoint.act_as = Some(value),
            "--namespace" => args.namespace = value,
            "--args" => args.args = Some(value),
            _ => args.output = value,
        }
    }
    Ok(tool_words)
}

pub async fn call(mut args: CallArgs) -> ExitCode {
    match try_call(&mut args).await {
        Ok(code) => code,
        Err(error) => fail(error),
    }
}

async fn try_call(args: &mut CallArgs) -> Result<ExitCode, ApiError> {
    let mut words = split_call_options(args)?;
    if words.is_empty() {
        return Err(ApiError::new(
            ErrorKind::InvalidArgument,
            "name a tool: toolgrid call TOOL [COMMAND] [ARGS...]",
        ));
    }
    let tool = words.remove(0);
    if args.help {
        let defs = tool_defs(&args.endpoint, &args.namespace, std::slice::from_ref(&tool)).await?;
        let def = defs
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::new(ErrorKind::UnknownTool, format!("no tool {tool:?}")))?;
        if let Some(text) = help_text(&def, &words)? {
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        // The command declares its own `--help`: the word goes to the tool.
    }
    let stdin = match args.stdin.as_deref() {
        None => None,
        Some("-") => {
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes).map_err(|e| {
                ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("cannot read stdin: {e}"),
                )
            })?;
            Some(bytes)
        }
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            ApiError::new(
                ErrorKind::InvalidArgument,
                format!("cannot read {path}: {e}"),
            )
        })?),
    };
    let request = proto::InvokeRequest {
        namespace: args.namespace.clone(),
        tool,
        command: String::new(),
        argv: words,
        args_json: args.args.clone().unwrap_or_default(),
        stdin,
        idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
        dry_run: args.dry_run,
    };
    let mut client = connect(&args.endpoint).await?;
    let call = if args.stream || args.progress {
        let mut stream = client
            .invoke_stream(request)
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        let mut last = None;
        while let Some(event) = stream.message().await.map_err(|s| error_of(&s))? {
            match event.event {
                Some(proto::invoke_event::Event::Progress(p))
                    if !args.stream && p.stage == toolgrid_core::call::TOOL_PROGRESS =>
                {
                    eprintln!("toolgrid: progress: {}", p.message.replace('\n', " "));
                }
                Some(proto::invoke_event::Event::Progress(_)) if !args.stream => {}
                Some(proto::invoke_event::Event::Progress(p)) => {
                    let at = if p.worker.is_empty() {
                        String::new()
                    } else {
                        format!(" on {} (epoch {})", p.worker, p.epoch)
                    };
                    eprintln!(
                        "toolgrid: call {} {}{at}{}",
                        p.call_id,
                        p.stage,
                        if p.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", p.message)
                        }
                    );
                }
                Some(proto::invoke_event::Event::Call(call)) => last = Some(call),
                None => {}
            }
        }
        last.ok_or_else(|| {
            ApiError::new(
                ErrorKind::Internal,
                "the stream ended without the call's outcome",
            )
        })?
    } else {
        client
            .invoke(request)
            .await
            .map_err(|s| error_of(&s))?
            .into_inner()
    };
    Ok(print_call(&call, &args.output))
}

/// The usage `toolgrid call TOOL [COMMAND] --help` prints: the command's when the word
/// after TOOL names one (or the tool has only one), else the tool's; `None` when that
/// command declares an option or flag named `help` of its own.
fn help_text(
    tool: &toolgrid_codegen::ToolDef,
    words: &[String],
) -> Result<Option<String>, ApiError> {
    let first = words.iter().find(|w| *w != "--help");
    let command = match first {
        Some(word) if !word.starts_with('-') => {
            match tool.commands.iter().find(|c| &c.name == word) {
                Some(command) => Some(command),
                None if tool.commands.len() == 1 => tool.commands.first(),
                None => {
                    return Err(ApiError::new(
                        ErrorKind::UnknownCommand,
                        format!(
                            "tool {:?} has no command {word:?}; its commands: {}",
                            tool.name,
                            tool.commands
                                .iter()
                                .map(|c| c.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        _ if tool.commands.len() == 1 => tool.commands.first(),
        _ => None,
    };
    match command {
        Some(c)
            if c.options.iter().any(|o| o.name == "help")
                || c.flags.iter().any(|f| f.name == "help") =>
        {
            Ok(None)
        }
        Some(c) => Ok(Some(super::help::command_help(tool, c))),
        None => Ok(Some(super::help::tool_help(tool))),
    }
}

fn call_json(call: &proto::Call) -> Value {
    let state = proto::CallState::try_from(call.state).unwrap_or(proto::CallState::Unspecified);
    let mut value = json!({
        "id": call.id,
        "namespace": call.namespace,
        "tool": call.tool,
        "command": call.command,
        "release": call.release,
        "releaseDigest": call.release_digest,
        "state": state_name(state),
        "args": serde_json::from_str::<Value>(&call.args_json).unwrap_or(Value::Null),
        "epoch": call.epoch,
        "worker": call.worker,
        "createdAtMs": call.created_at_ms,
        "deduplicated": call.deduplicated,
    });
    if !call.result_json.is_empty() {
        value["result"] = serde_json::from_str(&call.result_json).unwrap_or(Value::Null);
    }
    if let Some(error) = &call.error {
        value["error"] = json!({"kind": error.kind, "message": error.message, "name": error.name, "exitCode": error.exit_code, "stderrTail": error.stderr_tail});
    }
    if !call.idempotency_key.is_empty() {
        value["idempotencyKey"] = json!(call.idempotency_key);
    }
    if call.dry_run {
        value["dryRun"] = json!(true);
    }
    if call.finished_at_ms > 0 {
        value["finishedAtMs"] = json!(call.finished_at_ms);
        value["durationMs"] = json!(call.finished_at_ms - call.created_at_ms);
    }
    if !call.agent.is_empty() {
        value["agent"] = json!(call.agent);
    }
    if !call.approval_json.is_empty() {
        value["approval"] = serde_json::from_str(&call.approval_json).unwrap_or(Value::Null);
    }
    value
}

/// What a dry run did: answered without running (never assigned to a worker), or ran for
/// real (a `read` command).
fn dry_run_note(call: &proto::Call) -> String {
    if call.worker.is_empty() && call.epoch == 0 {
        format!(
            "dry run: call {} did not run; the result is its command's dryRunResult",
            call.id
        )
    } else {
        format!(
            "dry run: call {} ran for real (a read command runs in a dry run)",
            call.id
        )
    }
}

fn state_name(state: proto::CallState) -> &'static str {
    match state {
        proto::CallState::AwaitingApproval => "awaiting-approval",
        proto::CallState::Pending => "pending",
        proto::CallState::Running => "running",
        proto::CallState::Succeeded => "succeeded",
        proto::CallState::Failed => "failed",
        proto::CallState::Unspecified => "unknown",
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

fn print_call(call: &proto::Call, output: &str) -> ExitCode {
    let state = proto::CallState::try_from(call.state).unwrap_or(proto::CallState::Unspecified);
    if output == "call" {
        println!("{}", pretty(&call_json(call)));
    } else if call.dry_run {
        eprintln!("toolgrid: {}", dry_run_note(call));
    }
    match state {
        proto::CallState::Succeeded => {
            if output != "call" {
                let result: Value = serde_json::from_str(&call.result_json).unwrap_or(Value::Null);
                println!("{}", pretty(&result));
            }
            ExitCode::SUCCESS
        }
        proto::CallState::Failed => {
            let error = call.error.clone().unwrap_or_default();
            let name = if error.name.is_empty() {
                String::new()
            } else {
                format!(" {}", error.name)
            };
            eprintln!(
                "toolgrid: {}{name}: {} (call {})",
                error.kind,
                error.message.replace('\n', " "),
                call.id
            );
            let kind = ErrorKind::parse(&error.kind).unwrap_or(ErrorKind::Internal);
            ExitCode::from(exit_code_of(kind).max(exit::CALL_FAILED))
        }
        proto::CallState::AwaitingApproval => {
            if output != "call" {
                println!("{}", pretty(&call_json(call)));
            }
            let asked_by = serde_json::from_str::<Value>(&call.approval_json)
                .ok()
                .and_then(|a| a["wait"]["middleware"].as_str().map(String::from))
                .map(|m| format!(" (middleware {m})"))
                .unwrap_or_default();
            eprintln!(
                "toolgrid: call {id} waits for approval{asked_by}; an operator or an approver \
                 decides it with `toolgrid approve {id} --reason ...` or `toolgrid deny {id}`; \
                 then `toolgrid get calls {id} --wait` returns its outcome",
                id = call.id
            );
            ExitCode::from(exit::AWAITING_APPROVAL)
        }
        _ => {
            eprintln!(
                "toolgrid: call {} is still {}; see `toolgrid get calls` or `toolgrid oplog {}`",
                call.id,
                state_name(state),
                call.id
            );
            ExitCode::from(exit::UNAVAILABLE)
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// tools, releases, pools, calls, bindings, agents, middleware or sources.
    kind: String,
    /// Only this resource (or call id).
    name: Option<String>,
    /// Namespace; every namespace when not given.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// `table`, `wide` (with sources) or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    /// With `get calls`: how many, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// With `get calls`: only the calls waiting for approval that you may read or decide.
    #[arg(long)]
    awaiting_approval: bool,
    /// With `get calls ID`: wait until the call ends.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn get(args: GetArgs) -> ExitCode {
    match try_get(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

async fn try_get(args: GetArgs) -> Result<(), ApiError> {
    let mut client = connect(&args.endpoint).await?;
    if matches!(args.kind.as_str(), "calls" | "call") {
        return print_calls(
            &mut client,
            CallsQuery {
                namespace: args.namespace.unwrap_or_default(),
                id: args.name,
                limit: args.limit,
                awaiting_approval: args.awaiting_approval,
                wait: args.wait,
            },
            &args.output,
        )
        .await;
    }
    let response = client
        .list_resources(proto::ListResourcesRequest {
            kind: args.kind.clone(),
            namespace: args.namespace.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| error_of(&s))?
        .into_inner();
    let rows: Vec<&proto::ResourceRow> = response
        .rows
        .iter()
        .filter(|r| args.name.as_ref().is_none_or(|n| &r.name == n))
        .collect();
    if let Some(name) = &args.name
        && rows.is_empty()
    {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no {} named {name:?}", args.kind),
        ));
    }
    if args.output == "json" {
        let items: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "kind": r.kind,
                    "namespace": r.namespace,
                    "name": r.name,
                    "generation": r.generation,
                    "source": r.source,
                    "status": serde_json::from_str::<Value>(&r.status_json).unwrap_or(Value::Null),
                })
            })
            .collect();
        println!("{}", pretty(&json!({"items": items})));
        return Ok(());
    }
    if rows.is_empty() {
        eprintln!("No {} found.", args.kind);
        return Ok(());
    }
    let mut extra: Vec<String> = Vec::new();
    for column in rows.iter().flat_map(|r| &r.columns) {
        let name = column.name.to_uppercase();
        if !extra.contains(&name) {
            extra.push(name);
        }
    }
    let mut headers: Vec<&str> = vec!["NAMESPACE", "NAME", "READY", "REASON"];
    headers.extend(extra.iter().map(String::as_str));
    headers.push("GEN");
    if args.output == "wide" {
        headers.push("SOURCE");
    }
    headers.push("MESSAGE");
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.namespace.clone(),
                r.name.clone(),
                r.ready.clone(),
                r.reason.clone(),
            ];
            for name in &extra {
                let cell = r
                    .columns
                    .iter()
                    .find(|c| &c.name.to_uppercase() == name)
                    .map(|c| c.value.clone())
                    .unwrap_or_default();
                row.push(cell);
            }
            row.push(format!("{}/{}", r.observed_generation, r.generation));
            if args.output == "wide" {
                row.push(r.source.clone());
            }
            row.push(r.message.clone());
            row
        })
        .collect();
    table::print(&headers, &table);
    if args.output == "wide"
        && args.endpoint.act_as.is_some()
        && matches!(args.kind.as_str(), "tools" | "tool" | "tl")
    {
        // Acting as an agent: the tools it lacks, and why.
        let why = client
            .why(proto::WhyRequest::default())
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        let missing: Vec<&proto::ToolAccess> = why.tools.iter().filter(|t| !t.allowed).collect();
        if !missing.is_empty() {
            println!();
            println!("Tools agent {}/{} cannot call:", why.namespace, why.agent);
            print_why(&missing);
        }
    }
    Ok(())
}

fn print_why(tools: &[&proto::ToolAccess]) {
    let rows: Vec<Vec<String>> = tools
        .iter()
        .map(|t| {
            let dash = |s: &str| {
                if s.is_empty() {
                    "-".to_string()
                } else {
                    s.to_string()
                }
            };
            if t.allowed {
                vec![
                    t.tool.clone(),
                    "yes".into(),
                    dash(&t.binding),
                    dash(&t.release),
                    t.commands.join(","),
                    String::new(),
                ]
            } else {
                vec![
                    t.tool.clone(),
                    format!("no ({})", t.cause),
                    dash(&t.binding),
                    "-".into(),
                    "-".into(),
                    t.message.clone(),
                ]
            }
        })
        .collect();
    table::print(
        &["TOOL", "ALLOWED", "BINDING", "RELEASE", "COMMANDS", "WHY"],
        &rows,
    );
}

#[derive(clap::Args, Debug)]
pub struct WhyArgs {
    /// The agent (`NAME` or `NAMESPACE/NAME`).
    agent: String,
    /// One tool; every tool of the agent's namespace when not given.
    tool: Option<String>,
    /// `table` or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// `toolgrid why AGENT [TOOL]`: which tools the agent may call, and why not the others.
pub async fn why(args: WhyArgs) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let response = client
            .why(proto::WhyRequest {
                agent: args.agent.clone(),
                tool: args.tool.clone().unwrap_or_default(),
            })
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        if args.output == "json" {
            let tools: Vec<Value> = response
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "tool": t.tool, "allowed": t.allowed, "binding": t.binding,
                        "release": t.release, "commands": t.commands, "cause": t.cause,
                        "reason": t.reason, "message": t.message,
                    })
                })
                .collect();
            println!(
                "{}",
                pretty(&json!({"namespace": response.namespace, "agent": response.agent, "tools": tools}))
            );
        } else {
            print_why(&response.tools.iter().collect::<Vec<_>>());
        }
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

fn duration_of(call: &proto::Call) -> String {
    if call.finished_at_ms == 0 {
        return "-".into();
    }
    let ms = call.finished_at_ms - call.created_at_ms;
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.2}s", ms as f64 / 1000.0)
    }
}

/// Which calls `get calls` / `calls` prints.
struct CallsQuery {
    namespace: String,
    id: Option<String>,
    limit: u32,
    awaiting_approval: bool,
    /// With `id`: wait until the call ends.
    wait: bool,
}

async fn print_calls(client: &mut Client, query: CallsQuery, output: &str) -> Result<(), ApiError> {
    let calls = match query.id {
        Some(id) => vec![
            client
                .get_call(proto::GetCallRequest {
                    id,
                    wait: query.wait,
                    ..Default::default()
                })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner(),
        ],
        None => {
            client
                .list_calls(proto::ListCallsRequest {
                    namespace: query.namespace,
                    tool: String::new(),
                    limit: query.limit,
                    awaiting_approval: query.awaiting_approval,
                })
                .await
                .map_err(|s| error_of(&s))?
                .into_inner()
                .calls
        }
    };
    if output == "json" {
        println!(
            "{}",
            pretty(&json!({"calls": calls.iter().map(call_json).collect::<Vec<_>>()}))
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = calls
        .iter()
        .map(|c| {
            let state =
                proto::CallState::try_from(c.state).unwrap_or(proto::CallState::Unspecified);
            vec![
                c.id.clone(),
                c.tool.clone(),
                c.command.clone(),
                state_name(state).into(),
                duration_of(c),
                c.worker.clone(),
                c.error.as_ref().map(|e| e.kind.clone()).unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &[
            "ID", "TOOL", "COMMAND", "STATE", "DURATION", "WORKER", "ERROR",
        ],
        &rows,
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct CallsArgs {
    /// One call (by id) instead of the recent ones.
    id: Option<String>,
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Only the calls waiting for approval that you may read or decide, oldest first.
    #[arg(long)]
    awaiting_approval: bool,
    /// With an id: wait until the call ends.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn calls(args: CallsArgs) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        print_calls(
            &mut client,
            CallsQuery {
                namespace: args.namespace.unwrap_or_default(),
                id: args.id,
                limit: args.limit,
                awaiting_approval: args.awaiting_approval,
                wait: args.wait,
            },
            &args.output,
        )
        .await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

#[derive(clap::Args, Debug)]
pub struct OplogArgs {
    call_id: String,
    /// `table` or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn oplog(args: OplogArgs) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let response = oplog_of(&mut client, &args.call_id)
            .await
            .map_err(|s| error_of(&s))?;
        if args.output == "json" {
            let entries: Vec<Value> = response
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "seq": e.seq,
                        "epoch": e.epoch,
                        "kind": e.kind,
                        "payload": serde_json::from_str::<Value>(&e.payload_json).unwrap_or(Value::Null),
                        "recordedAtMs": e.recorded_at_ms,
                    })
                })
                .collect();
            println!("{}", pretty(&json!({"callId": response.call_id, "entries": entries})));
        } else {
            let rows: Vec<Vec<String>> = response
                .entries
                .iter()
                .map(|e| vec![e.seq.to_string(), e.epoch.to_string(), e.kind.clone(), e.payload_json.clone()])
                .collect();
            table::print(&["SEQ", "EPOCH", "KIND", "PAYLOAD"], &rows);
        }
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    call_id: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// `toolgrid cancel CALL_ID`: cancels a call and prints it as it ended (`cancelled`, or
/// `outcome-unknown` when a write may have been applied). Exit 0 once the cancel is
/// durable; an ended call is refused (`not-cancellable`, exit 2).
pub async fn cancel(args: CancelArgs) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let request = proto::CancelRequest {
            call_id: args.call_id.clone(),
        };
        let call = client
            .cancel(request)
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        println!("{}", pretty(&call_json(&call)));
        let kind = call.error.as_ref().map(|e| e.kind.as_str()).unwrap_or("");
        eprintln!("toolgrid: cancelled call {} ({kind})", call.id);
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

#[derive(clap::Args, Debug)]
pub struct DecisionArgs {
    call_id: String,
    #[arg(long, default_value = "")]
    reason: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

pub async fn decide(args: DecisionArgs, approve: bool) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let request = proto::DecisionRequest {
            call_id: args.call_id.clone(),
            reason: args.reason.clone(),
        };
        let call = if approve {
            client.approve(request).await
        } else {
            client.deny(request).await
        }
        .map_err(|s| error_of(&s))?
        .into_inner();
        println!("{}", pretty(&call_json(&call)));
        let state =
            proto::CallState::try_from(call.state).unwrap_or(proto::CallState::Unspecified);
        if approve {
            eprintln!(
                "toolgrid: approved call {id}; it is {}; `toolgrid get calls {id} --wait` returns its outcome",
                state_name(state),
                id = call.id
            );
        } else {
            eprintln!("toolgrid: denied call {}", call.id);
        }
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

/// A call's whole oplog, following `GetOplog`'s pages.
pub async fn oplog_of(
    client: &mut Client,
    call_id: &str,
) -> Result<proto::GetOplogResponse, tonic::Status> {
    let mut all = proto::GetOplogResponse {
        call_id: call_id.to_string(),
        ..Default::default()
    };
    let mut from_seq = 0;
    loop {
        let page = client
            .get_oplog(proto::GetOplogRequest {
                call_id: call_id.to_string(),
                from_seq,
            })
            .await?
            .into_inner();
        all.entries.extend(page.entries);
        if !page.more || page.next_seq <= from_seq {
            return Ok(all);
        }
        from_seq = page.next_seq;
    }
}

/// The definitions of `tools` (all when empty) in `namespace`, as the caller sees them.
pub(super) async fn tool_defs(
    endpoint: &Endpoint,
    namespace: &str,
    tools: &[String],
) -> Result<Vec<toolgrid_codegen::ToolDef>, ApiError> {
    let mut client = connect(endpoint).await?;
    let response = client
        .list_tools(proto::ListToolsRequest {
            namespace: namespace.to_string(),
            format: String::new(),
            tools: tools.to_vec(),
        })
        .await
        .map_err(|s| error_of(&s))?
        .into_inner();
    response
        .tools
        .iter()
        .map(toolgrid_codegen::ToolDef::from_info)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn toolgrid_options_are_taken_from_anywhere_before_the_separator() {
        let cli = crate::cli::Cli::try_parse_from([
            "toolgrid",
            "call",
            "fetch",
            "get",
            "https://x.org",
            "--max-bytes",
            "5",
            "--stdin",
            "-",
            "--idempotency-key=k1",
            "--endpoint",
            "127.0.0.1:9",
            "--",
            "--endpoint",
            "tool's",
        ])
        .unwrap();
        let crate::cli::Commands::Call(mut args) = cli.command else {
            panic!("not a call")
        };
        let words = split_call_options(&mut args).unwrap();
        assert_eq!(
            words,
            [
                "fetch",
                "get",
                "https://x.org",
                "--max-bytes",
                "5",
                "--endpoint",
                "tool's"
            ]
        );
        assert_eq!(args.stdin.as_deref(), Some("-"));
        assert_eq!(args.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(args.endpoint.endpoint, "127.0.0.1:9");
    }
}

#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    /// The worker's id (`toolgrid get pools` shows how many are attached; a worker logs its
    /// id when it attaches).
    worker: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// `toolgrid drain WORKER`: the worker takes no new call, finishes those it holds within
/// its grace period, gives up the rest to other workers and exits.
pub async fn drain(args: DrainArgs) -> ExitCode {
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let response = client
            .drain_worker(proto::DrainWorkerRequest {
                worker: args.worker.clone(),
            })
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        println!(
            "worker {} is draining: {} call(s) held finish on it within its grace period; it takes no new call",
            args.worker, response.busy
        );
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

#[derive(clap::Args, Debug)]
pub struct RefreshArgs {
    /// The ToolSource (`NAME` or `NAMESPACE/NAME`).
    source: String,
    /// Namespace (default `default`).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// `table` or `json`.
    #[arg(long, short = 'o', default_value = "table")]
    output: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// A resource named `NAME` (in `namespace`, else `default`) or `NAMESPACE/NAME`: its
/// namespace and name.
pub(super) fn namespaced(given: &str, namespace: Option<&str>) -> (String, String) {
    match given.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (
            namespace
                .unwrap_or(toolgrid_api::DEFAULT_NAMESPACE)
                .to_string(),
            given.to_string(),
        ),
    }
}

/// `toolgrid refresh SOURCE`: read a ToolSource's upstream again and say what changed.
pub async fn refresh(args: RefreshArgs) -> ExitCode {
    let (namespace, name) = namespaced(&args.source, args.namespace.as_deref());
    let result = async {
        let mut client = connect(&args.endpoint).await?;
        let response = client
            .refresh_source(proto::RefreshSourceRequest {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .await
            .map_err(|s| error_of(&s))?
            .into_inner();
        if args.output == "json" {
            println!(
                "{}",
                pretty(&json!({
                    "namespace": namespace, "name": name, "ready": response.ready,
                    "reason": response.reason, "message": response.message,
                    "tools": response.tools, "added": response.added,
                    "removed": response.removed, "changed": response.changed,
                    "refreshError": response.refresh_error,
                }))
            );
        } else {
            println!(
                "toolsource {namespace}/{name}: Ready={} {}: {}",
                response.ready, response.reason, response.message
            );
            if !response.refresh_error.is_empty() {
                println!(
                    "  the refresh failed ({}); the earlier tools are still served",
                    response.refresh_error
                );
            }
            for (sign, names) in [
                ("+", &response.added),
                ("-", &response.removed),
                ("~", &response.changed),
            ] {
                for name in names {
                    println!("  {sign} {name}");
                }
            }
            if response.added.is_empty()
                && response.removed.is_empty()
                && response.changed.is_empty()
            {
                println!("  no change ({} tools)", response.tools);
            }
        }
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

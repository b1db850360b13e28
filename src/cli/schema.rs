//! `toolgrid schema --format openai|anthropic|json-schema [TOOL...]` (the caller's tools
//! as a model API's tool definitions) and `toolgrid gen client --lang python|typescript
//! [TOOL...] -o DIR` (a typed client per tool), both from what the control plane serves
//! the caller (`--as AGENT`: what that agent sees).

use super::client::{Endpoint, connect, fail, tool_defs};
use std::path::PathBuf;
use std::process::ExitCode;
use toolgrid_codegen::write_clients;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

#[derive(clap::Args, Debug)]
pub struct SchemaArgs {
    /// openai (Chat Completions function tools, strict mode), anthropic, or json-schema.
    #[arg(long, short = 'f', default_value = "json-schema")]
    format: String,
    /// Print only the `tools` array (what the model API takes).
    #[arg(long)]
    tools_only: bool,
    #[arg(long, short = 'n', default_value = "")]
    namespace: String,
    #[command(flatten)]
    endpoint: Endpoint,
    /// Only these tools (default: every tool the caller may call).
    #[arg(value_name = "TOOL")]
    tools: Vec<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum GenCommand {
    /// A typed client per tool, calling the HTTP API (`POST .../{command}:call`).
    Client(GenClientArgs),
}

#[derive(clap::Args, Debug)]
pub struct GenArgs {
    #[command(subcommand)]
    what: GenCommand,
}

#[derive(clap::Args, Debug)]
pub struct GenClientArgs {
    /// python (stdlib only, TypedDicts) or typescript (fetch, no dependencies).
    #[arg(long)]
    lang: String,
    /// The directory to write one file per tool to.
    #[arg(long, short = 'o')]
    out: PathBuf,
    #[arg(long, short = 'n', default_value = "")]
    namespace: String,
    #[command(flatten)]
    endpoint: Endpoint,
    /// Only these tools (default: every tool the caller may call).
    #[arg(value_name = "TOOL")]
    tools: Vec<String>,
}

pub async fn schema(args: SchemaArgs) -> ExitCode {
    match try_schema(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

async fn try_schema(args: SchemaArgs) -> Result<(), ApiError> {
    // Refuse an unknown format before dialing, with the server's own words.
    args.format
        .parse::<toolgrid_catalog::model_formats::ModelFormat>()?;
    let mut client = connect(&args.endpoint).await?;
    let response = client
        .list_tools(proto::ListToolsRequest {
            namespace: args.namespace,
            format: args.format,
            tools: args.tools,
        })
        .await
        .map_err(|s| error_of(&s))?
        .into_inner();
    let value: serde_json::Value =
        serde_json::from_str(&response.model_tools_json).map_err(|e| {
            ApiError::new(
                ErrorKind::Internal,
                format!("the control plane's answer is not JSON: {e}"),
            )
        })?;
    let value = if args.tools_only {
        value["tools"].clone()
    } else {
        value
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string())
    );
    Ok(())
}

pub async fn generate(args: GenArgs) -> ExitCode {
    let GenCommand::Client(args) = args.what;
    match try_gen(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

async fn try_gen(args: GenClientArgs) -> Result<(), ApiError> {
    if !matches!(args.lang.as_str(), "python" | "typescript") {
        return Err(ApiError::new(
            ErrorKind::InvalidArgument,
            format!("unknown language {:?}: use python or typescript", args.lang),
        ));
    }
    let tools = tool_defs(&args.endpoint, &args.namespace, &args.tools).await?;
    if tools.is_empty() {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            "no tools to generate a client for: the caller may call none in this namespace",
        ));
    }
    for path in write_clients(&args.out, &tools, &args.lang)? {
        println!("{}", path.display());
    }
    Ok(())
}

//! The value types of a Tool's interface: its effect, commands, arguments, stdin, declared
//! errors, and its retry and result policies. The `Tool` resource (`toolgrid-api`) is
//! made of these; the call model and the typed command interfaces speak them.

use super::schema;
use super::units::GoDuration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The effect of a tool's calls on the outside world. Where none is said (a call spec
/// built without a Tool, in a benchmark or a test) it is the most careful one, `write`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// No effect outside the call: safe to retry and to re-send.
    Read,
    /// Changes the world; never re-sent without an idempotency key.
    #[default]
    Write,
    /// Changes the world, but repeating a request has the same result.
    Idempotent,
    /// Calls out to systems whose effects toolgrid cannot see.
    External,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Idempotent => "idempotent",
            Effect::External => "external",
        }
    }

    /// The effect named `name` (as [`Effect::as_str`] spells it).
    pub fn parse(name: &str) -> Option<Effect> {
        [
            Effect::Read,
            Effect::Write,
            Effect::Idempotent,
            Effect::External,
        ]
        .into_iter()
        .find(|e| e.as_str() == name)
    }

    /// Whether repeating the tool's requests is harmless.
    pub fn is_repeatable(self) -> bool {
        matches!(self, Effect::Read | Effect::Idempotent)
    }
}

impl std::fmt::Display for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub attempts: u32,
    /// Wait before the first retry; doubles each time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<GoDuration>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResultPolicy {
    /// Results up to this size are returned inline (default 32768).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inline_bytes: Option<u64>,
    /// What happens to a larger result.
    #[serde(default)]
    pub overflow: Overflow,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Return it inline anyway.
    #[default]
    Inline,
    /// Store it and return it in pages.
    Page,
    /// Write it to the agent's workspace as `tool-results/<call>.json` and return a short
    /// summary naming the file.
    File,
    /// Cut it at the limit.
    Truncate,
}

/// One command of a tool, declared like a command-line program's subcommand.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Command {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Positional arguments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub positional: Vec<Positional>,
    /// Options that take a value: `--name value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<OptionArg>,
    /// Boolean switches: `--name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<Flag>,
    /// Input stream; absent means the command reads no stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<StdinSpec>,
    /// JSON Schema of the JSON the command prints on stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_json_schema_object")]
    pub result: Option<Value>,
    /// Errors the command declares, by exit code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<DeclaredError>,
    /// What a dry run of a `write`, `idempotent` or `external` command answers instead of
    /// running it (default: the string `"Operation acknowledged."`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::any_value")]
    pub dry_run_result: Option<Value>,
    /// An agent may repeat an identical call of this command within the Tool's
    /// `repeatWindow` (a polling command); otherwise the repeat is refused as
    /// `repeated-call`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_repeat: bool,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Positional {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the value (default: a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_json_schema_object")]
    pub schema: Option<Value>,
    /// Optional positionals may only follow required ones (default: required).
    #[serde(default = "default_true")]
    pub required: bool,
    /// The last positional may take every remaining value, as a JSON array.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub variadic: bool,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptionArg {
    pub name: String,
    /// One-letter alias (`-n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the value (default: a string); an array schema makes the option
    /// repeatable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_json_schema_object")]
    pub schema: Option<Value>,
    /// Value used when the caller gives none; always passed to the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::any_value")]
    pub default: Option<Value>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Flag {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<String>,
    #[serde(default)]
    pub description: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StdinSpec {
    #[serde(default)]
    pub description: String,
    /// JSON Schema of stdin. `{type: string}` (the default) passes text through; any other
    /// schema means stdin is a JSON document and is validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_json_schema_object")]
    pub schema: Option<Value>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeclaredError {
    /// Kebab-case name returned to the caller.
    pub name: String,
    /// The exit code that signals it (1 to 255).
    pub exit_code: i32,
    #[serde(default)]
    pub description: String,
    /// A transient failure: a `read` or `idempotent` call that ends with it is run again
    /// per the Tool's `retry`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retryable: bool,
}

fn default_true() -> bool {
    true
}

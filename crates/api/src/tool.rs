//! `Tool`: the typed interface of a command-line-like tool.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgrid_core::spec::{Command, Effect, GoDuration, ResultPolicy, RetryPolicy};

/// A tool's typed interface: its commands, their arguments, stdin, result and errors.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "Tool",
    namespaced,
    status = "ToolStatus",
    shortname = "tl",
    category = "toolgrid",
    doc = "A typed tool: commands with positional arguments, options, flags, stdin, a JSON result and declared errors.",
    printcolumn(name = "Effect", type_ = "string", json_path = ".spec.effect"),
    printcolumn(name = "Release", type_ = "string", json_path = ".status.release"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSpec {
    /// What the tool does, for the agents that choose it.
    #[serde(default)]
    pub description: String,
    /// What a call does to the world; decides retries and failover re-sends.
    pub effect: Effect,
    /// Whole-call deadline (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    /// Upper bound that progress events cannot extend a call past (default: the timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_timeout: Option<GoDuration>,
    /// Retries of failed calls; only read and idempotent tools are retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// How long an agent's identical call (same command, arguments and stdin) is refused
    /// as `repeated-call` after the first (default 10s; `0s` turns the check off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_window: Option<GoDuration>,
    /// What to do with a large result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_policy: Option<ResultPolicy>,
    /// Its programs call the agent's other tools (code mode, `docs/code-mode.md`), as the
    /// agent. Only a tool that says so may: any other call's tool call is refused
    /// `permission-denied`, so a tool an agent calls cannot act as the agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub code_mode: bool,
    /// The commands; a tool with one command may name it `default`.
    pub commands: Vec<Command>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The release a call would run now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl ToolSpec {
    pub fn command(&self, name: &str) -> Option<&Command> {
        self.commands.iter().find(|c| c.name == name)
    }
}

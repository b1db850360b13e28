//! Tools from elsewhere: what a ToolSource (an MCP server or an OpenAPI document) offers,
//! as a snapshot of imported tools. Reading a source (MCP `tools/list`, an OpenAPI
//! document) happens above this crate; each reader converts what it read into a
//! [`SourceSnapshot`] once, at its edge, and everything after (status, the catalog, the
//! worker's upstream runner) speaks these types.
//!
//! An imported tool is callable as `<source>__<name>` ([`imported_tool_name`]) with one
//! command, `default`, whose options are the input's properties (each with its JSON Schema)
//! and whose result is the declared output schema, if any. Its effect comes from the source
//! ([`Effect`]: MCP annotations, an OpenAPI method), overridable per tool.

use crate::spec::{Command, Effect};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The separator between a source's name and an imported tool's.
pub const NAME_SEPARATOR: &str = "__";

/// The name an imported tool is called by: `<source>__<name>`.
pub fn imported_tool_name(source: &str, name: &str) -> String {
    format!("{source}{NAME_SEPARATOR}{name}")
}

/// What a source offers, as read at its last reconcile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceSnapshot {
    /// The tools offered and kept, in the source's order.
    pub tools: Vec<ImportedTool>,
    /// What the source offers that is not imported, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// The era an MCP server was listed in, and is called in (absent for OpenAPI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub era: Option<McpEra>,
}

/// The era of the MCP protocol a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum McpEra {
    /// 2026-07-28: stateless requests.
    Modern,
    /// 2025-11-25 and before: a session opened by `initialize`.
    Legacy,
}

/// How a call of an imported tool reaches its upstream, fixed when the call is admitted
/// (kept in its spec, so a call replayed after a failover reaches the same upstream the
/// same way even if the source has changed since).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamCall {
    /// The ToolSource's name.
    pub source: String,
    /// The MCP endpoint, or the OpenAPI base URL.
    pub endpoint: String,
    pub target: UpstreamTarget,
    /// The MCP era (absent for OpenAPI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub era: Option<McpEra>,
    /// Each request carries a signed identity token in `Authorization`, minted by the
    /// control plane for each assignment (`auth: {type: identity}`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub identity: bool,
}

/// The secret reference an identity token travels under in an assignment: the declared
/// `Authorization` header of an identity source is `Bearer ${secret:toolgrid-identity}`.
pub const IDENTITY_SECRET: &str = "toolgrid-identity";
/// The prefix of the secret references a source's own credentials travel under
/// (`toolsource-auth`, `toolsource-header-0`, ...), apart from any key an agent's Secret
/// may grant.
pub const SOURCE_SECRET_PREFIX: &str = "toolsource-";

/// One tool a source offers, as toolgrid calls it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedTool {
    /// The upstream's name: the MCP tool's name or the OpenAPI `operationId`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub effect: Effect,
    /// The one command, `default`: an option per input property, the output schema as
    /// its result.
    pub command: Command,
    /// How a call reaches the upstream.
    pub target: UpstreamTarget,
}

/// How a call of an imported tool reaches its upstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum UpstreamTarget {
    /// MCP `tools/call` of this tool, the call's arguments as its `arguments`.
    Mcp { tool: String },
    /// One HTTP request, built from the call's arguments.
    Http(HttpOperation),
}

/// An OpenAPI operation as a request template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpOperation {
    pub method: HttpMethod,
    /// The path template under the source's base URL, with `{name}` for path parameters.
    pub path: String,
    /// Where each argument goes, by option name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<HttpParameter>,
    /// The request body, if the operation takes one: the argument `body`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// The HTTP methods an operation may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    Put,
    Delete,
    Post,
    Patch,
    Options,
    Trace,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Post => "POST",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Trace => "TRACE",
        }
    }

    /// The effect an operation has by its method: GET, HEAD, OPTIONS and TRACE read; PUT
    /// and DELETE are idempotent; POST and PATCH write.
    pub fn effect(self) -> Effect {
        match self {
            HttpMethod::Get | HttpMethod::Head | HttpMethod::Options | HttpMethod::Trace => {
                Effect::Read
            }
            HttpMethod::Put | HttpMethod::Delete => Effect::Idempotent,
            HttpMethod::Post | HttpMethod::Patch => Effect::Write,
        }
    }
}

/// One parameter of an operation: the option `option` goes to `location` as `name`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpParameter {
    /// The parameter's name in the request.
    pub name: String,
    /// The command option that carries it (the name, unless two locations share one).
    pub option: String,
    pub location: ParameterLocation,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

/// Where a parameter goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParameterLocation {
    Path,
    Query,
    Header,
    Cookie,
}

/// An operation's request body: the argument `option`, sent as `content_type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBody {
    pub option: String,
    pub content_type: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

/// Something a source offers that is not imported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftOut {
    /// The upstream's name for it (a tool name, an `operationId`, or `METHOD /path`).
    pub name: String,
    pub reason: LeftOutReason,
    /// What exactly, for a person.
    pub message: String,
}

/// Why something a source offers is not imported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeftOutReason {
    /// Not in `allowTools` / `allowOperations`, or in `denyTools`.
    NotAllowed,
    /// The name cannot be a tool name ([`valid_imported_name`]) or repeats another's.
    InvalidName,
    /// An OpenAPI operation without an `operationId`.
    NoOperationId,
    /// The input or output schema cannot be used (not an object schema, an unresolvable
    /// `$ref`, a property that cannot be an option).
    UnsupportedSchema,
    /// A request body of a media type other than JSON, or a cookie parameter.
    UnsupportedRequest,
    /// Beyond the source's limit of tools, or a description or schema beyond its size limit.
    TooLarge,
}

impl LeftOutReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LeftOutReason::NotAllowed => "NotAllowed",
            LeftOutReason::InvalidName => "InvalidName",
            LeftOutReason::NoOperationId => "NoOperationId",
            LeftOutReason::UnsupportedSchema => "UnsupportedSchema",
            LeftOutReason::UnsupportedRequest => "UnsupportedRequest",
            LeftOutReason::TooLarge => "TooLarge",
        }
    }
}

/// Limits on what one source may offer (a hostile upstream is bounded here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceLimits {
    /// At most this many tools are imported; the rest are [`LeftOutReason::TooLarge`].
    pub max_tools: usize,
    /// A tool whose description is longer is cut to this many bytes (at a character
    /// boundary).
    pub max_description_bytes: usize,
    /// A tool whose input or output schema serializes larger is left out.
    pub max_schema_bytes: usize,
    /// All imported tools together serialize to at most this many bytes (the snapshot
    /// is kept in the source's status, which the API server bounds); tools past it are
    /// [`LeftOutReason::TooLarge`].
    pub max_total_bytes: usize,
}

impl Default for SourceLimits {
    fn default() -> Self {
        SourceLimits {
            max_tools: 500,
            max_description_bytes: 8 * 1024,
            max_schema_bytes: 64 * 1024,
            max_total_bytes: 768 * 1024,
        }
    }
}

/// Which of a source's tools are imported: `allow` (empty: all) less `deny`; names are exact
/// or globs with `*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolFilter {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl ToolFilter {
    pub fn admits(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|p| glob_match(p, name)))
            && !self.deny.iter().any(|p| glob_match(p, name))
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `name` may follow `<source>__` in a tool name: ASCII letters, digits, `-` and
/// `_` (what model APIs accept in a tool name), starting with a letter or digit, and
/// `<source>__<name>` at most 64 characters.
pub fn valid_imported_name(source: &str, name: &str) -> bool {
    imported_tool_name(source, name).len() <= 64 && model_name(name)
}

/// Whether `name` can be an imported tool's argument: ASCII letters, digits, `_` and `-`,
/// starting with a letter or digit, at most 64 characters (what model APIs accept as a
/// property name and what a command line can carry as `--name`).
pub fn valid_argument_name(name: &str) -> bool {
    name.len() <= 64 && model_name(name)
}

/// ASCII letters, digits, `-` and `_`, starting with a letter or digit.
fn model_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `text` cut to at most `max` bytes at a character boundary.
pub fn cut_text(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The size of `schema` as JSON, for [`SourceLimits::max_schema_bytes`].
pub fn schema_bytes(schema: &Value) -> usize {
    serde_json::to_vec(schema)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_have_their_effects() {
        assert_eq!(HttpMethod::Get.effect(), Effect::Read);
        assert_eq!(HttpMethod::Head.effect(), Effect::Read);
        assert_eq!(HttpMethod::Put.effect(), Effect::Idempotent);
        assert_eq!(HttpMethod::Delete.effect(), Effect::Idempotent);
        assert_eq!(HttpMethod::Post.effect(), Effect::Write);
        assert_eq!(HttpMethod::Patch.effect(), Effect::Write);
    }

    #[test]
    fn filters_allow_then_deny_with_globs() {
        let all = ToolFilter::default();
        assert!(all.admits("anything"));
        let filter = ToolFilter {
            allow: vec!["get-*".into(), "search".into()],
            deny: vec!["*-admin".into()],
        };
        assert!(filter.admits("get-order"));
        assert!(filter.admits("search"));
        assert!(!filter.admits("get-admin"));
        assert!(!filter.admits("delete-order"));
        assert!(glob_match("a*b*c", "a-x-b-y-c"));
        assert!(!glob_match("a*b*c", "a-x-c"));
        assert!(!glob_match("ab*ba", "aba"));
    }

    #[test]
    fn imported_names_are_checked() {
        assert!(valid_imported_name("shop", "get_order"));
        assert!(valid_imported_name("shop", "echo-2"));
        assert!(valid_imported_name("shop", "getOrder"));
        assert!(!valid_imported_name("shop", "get order"));
        assert!(!valid_imported_name("shop", "get.order"));
        assert!(!valid_imported_name("shop", "-x"));
        assert!(!valid_imported_name("shop", ""));
        assert!(!valid_imported_name("shop", &"a".repeat(60)));
        assert_eq!(imported_tool_name("shop", "get_order"), "shop__get_order");
        assert!(valid_argument_name("petId") && valid_argument_name("X-Request-Tag"));
        assert!(!valid_argument_name("filter[name]") && !valid_argument_name("a b"));
        assert!(!valid_argument_name("") && !valid_argument_name(&"a".repeat(65)));
    }

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        assert_eq!(cut_text("héllo", 2), "h");
        assert_eq!(cut_text("héllo", 3), "hé");
        assert_eq!(cut_text("abc", 10), "abc");
    }
}

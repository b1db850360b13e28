//! ToolSources: each checked ([`check_source`], pure), then given what its upstream offered
//! when it was last read (a [`SourceRead`], the IO layer's), and each offered tool made a
//! callable `<source>__<tool>`: a [`ResolvedTool`] with one `default` command and, as its
//! "release", the upstream request a worker makes ([`UpstreamCall`]).
//!
//! A source is read by the IO layer (`toolgrid up`'s manifest source, the controller) when
//! its spec changes or `toolgrid refresh` asks, never on its own: between reads the same
//! snapshot is served, so an agent's tools do not change under it.

use super::declared::Declared;
use super::{DEFAULT_CPU_TIME, DEFAULT_MEMORY, DEFAULT_OUTPUT, DEFAULT_POOL, Resolver};
use crate::snapshot::{Limits, ResolvedRelease, ResolvedTool};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{
    Kind, KindStatus, SecretKeyRef, SourceAuthType, ToolSource, ToolSourceSpec, ToolSourceStatus,
    ToolSpec,
};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::{ArgumentNames, CommandInterface, FieldError, is_kebab};
use toolgrid_core::secret::SecretValue;
use toolgrid_core::source::{
    IDENTITY_SECRET, ImportedTool, SOURCE_SECRET_PREFIX, SourceSnapshot, ToolFilter, UpstreamCall,
    imported_tool_name,
};
use toolgrid_core::spec::{ConfigMapKeyRef, Effect, EgressRule, NetworkPolicy};

/// The secret reference a source's bearer token travels under.
pub const AUTH_SECRET: &str = "toolsource-auth";
/// The declared error of an imported tool whose upstream reported an error.
pub const UPSTREAM_ERROR: &str = "upstream-error";
/// How long listing an MCP server may take by default.
pub const DEFAULT_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the IO layer read of a source.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRead {
    /// The `toolgrid.dev/refresh` value the read answers.
    pub refreshed: Option<String>,
    /// When (RFC 3339).
    pub read_at: String,
    pub outcome: Result<SourceSnapshot, ReadFailure>,
    /// The last refresh failed: `outcome` is the earlier snapshot, still served.
    pub refresh_failure: Option<ReadFailure>,
}

/// Why a source could not be read: the condition's reason and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadFailure {
    pub reason: Reason,
    pub message: String,
}

/// What the upstream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Mcp,
    OpenApi,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Mcp => "mcp",
            SourceKind::OpenApi => "openapi",
        }
    }
}

/// Where an OpenAPI document is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DocumentRef {
    Url(url::Url),
    ConfigMap(ConfigMapKeyRef),
    /// Relative to the manifest's directory (`toolgrid up`).
    File(PathBuf),
}

/// A header's value: as written, or a Secret's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderValue {
    Literal(String),
    Secret(SecretKeyRef),
}

/// A source's spec, checked: everything the IO layer needs to read it and the resolver to
/// make its tools callable.
#[derive(Clone, Debug, PartialEq)]
pub struct SourcePlan {
    pub kind: SourceKind,
    /// The MCP endpoint, or the OpenAPI base URL: where calls go.
    pub endpoint: url::Url,
    /// The OpenAPI document.
    pub document: Option<DocumentRef>,
    /// Headers sent to the upstream (listing and calls), in order.
    pub headers: Vec<(String, HeaderValue)>,
    pub auth: Option<(SourceAuthType, Option<SecretKeyRef>)>,
    pub filter: ToolFilter,
    pub effects: BTreeMap<String, Effect>,
    pub allow_http: bool,
    pub allow_private: bool,
    pub list_timeout: Duration,
    pub call_timeout: Duration,
    pub pool: String,
}

impl SourcePlan {
    /// The Secret keys the source names, each with the reference its value travels under.
    pub fn secret_refs(&self) -> Vec<(String, &SecretKeyRef)> {
        let mut out = Vec::new();
        if let Some((SourceAuthType::Bearer, Some(secret))) = &self.auth {
            out.push((AUTH_SECRET.to_string(), secret));
        }
        for (i, (_, value)) in self.headers.iter().enumerate() {
            if let HeaderValue::Secret(secret) = value {
                out.push((format!("{SOURCE_SECRET_PREFIX}header-{i}"), secret));
            }
        }
        out
    }

    /// The headers as a call's egress rule declares them: a Secret's value by reference,
    /// substituted by the worker as the request leaves.
    pub fn declared_headers(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (i, (name, value)) in self.headers.iter().enumerate() {
            let value = match value {
                HeaderValue::Literal(text) => text.clone(),
                HeaderValue::Secret(_) => format!("${{secret:{SOURCE_SECRET_PREFIX}header-{i}}}"),
            };
            out.insert(name.to_ascii_lowercase(), value);
        }
        match &self.auth {
            Some((SourceAuthType::Bearer, _)) => {
                out.insert(
                    "authorization".into(),
                    format!("Bearer ${{secret:{AUTH_SECRET}}}"),
                );
            }
            Some((SourceAuthType::Identity, _)) => {
                out.insert(
                    "authorization".into(),
                    format!("Bearer ${{secret:{IDENTITY_SECRET}}}"),
                );
            }
            None => {}
        }
        out
    }

    /// The one destination calls of the source may reach.
    pub fn egress_rule(&self) -> EgressRule {
        EgressRule {
            host: self.endpoint.host_str().unwrap_or_default().to_string(),
            ports: self.endpoint.port_or_known_default().into_iter().collect(),
            allow_private: self.allow_private,
            headers: self.declared_headers(),
        }
    }
}

/// Checks a ToolSource's spec.
pub fn check_source(source: &ToolSource, key: &ObjectKey) -> Result<SourcePlan, FieldError> {
    if !is_kebab(&key.name) || key.name.len() > 40 {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "{:?} is not a valid source name (lowercase letters, digits and dashes, at most 40: \
                 its tools are named <source>__<tool>)",
                key.name
            ),
        ));
    }
    let spec: &ToolSourceSpec = &source.spec;
    let pool = spec.pool.clone().unwrap_or_else(|| DEFAULT_POOL.into());
    let call_timeout = spec
        .call_timeout
        .map(|t| t.get())
        .unwrap_or(super::DEFAULT_TIMEOUT);
    if call_timeout.is_zero() {
        return Err(FieldError::new(
            "spec.callTimeout",
            "must be longer than zero",
        ));
    }
    match (&spec.mcp, &spec.openapi) {
        (Some(mcp), None) => {
            let endpoint = check_url("spec.mcp.url", &mcp.url, mcp.allow_http)?;
            Ok(SourcePlan {
                kind: SourceKind::Mcp,
                endpoint,
                document: None,
                headers: check_headers("spec.mcp.headers", &mcp.headers, mcp.auth.is_some())?,
                auth: check_auth("spec.mcp.auth", mcp.auth.as_ref())?,
                filter: ToolFilter {
                    allow: mcp.allow_tools.clone(),
                    deny: mcp.deny_tools.clone(),
                },
                effects: spec.effects.clone(),
                allow_http: mcp.allow_http,
                allow_private: mcp.allow_private,
                list_timeout: mcp.timeout.map(|t| t.get()).unwrap_or(DEFAULT_LIST_TIMEOUT),
                call_timeout,
                pool,
            })
        }
        (None, Some(openapi)) => {
            let doc = &openapi.spec;
            let document = match (&doc.url, &doc.config_map, &doc.file) {
                (Some(url), None, None) => {
                    DocumentRef::Url(check_url("spec.openapi.spec.url", url, openapi.allow_http)?)
                }
                (None, Some(config_map), None) => DocumentRef::ConfigMap(config_map.clone()),
                (None, None, Some(file)) => {
                    let path = PathBuf::from(file);
                    if path.is_absolute()
                        || path
                            .components()
                            .any(|c| c == std::path::Component::ParentDir)
                    {
                        return Err(FieldError::new(
                            "spec.openapi.spec.file",
                            "must be a relative path inside the manifest's directory",
                        ));
                    }
                    DocumentRef::File(path)
                }
                _ => {
                    return Err(FieldError::new(
                        "spec.openapi.spec",
                        "set exactly one of url, configMap and file",
                    ));
                }
            };
            let endpoint = match (&openapi.base_url, &document) {
                (Some(base), _) => check_url("spec.openapi.baseUrl", base, openapi.allow_http)?,
                (None, DocumentRef::Url(url)) => {
                    let mut origin = url.clone();
                    origin.set_path("/");
                    origin.set_query(None);
                    origin.set_fragment(None);
                    origin
                }
                (None, _) => {
                    return Err(FieldError::new(
                        "spec.openapi.baseUrl",
                        "required when the document is not fetched from a URL",
                    ));
                }
            };
            Ok(SourcePlan {
                kind: SourceKind::OpenApi,
                endpoint,
                document: Some(document),
                headers: check_headers(
                    "spec.openapi.headers",
                    &openapi.headers,
                    openapi.auth.is_some(),
                )?,
                auth: check_auth("spec.openapi.auth", openapi.auth.as_ref())?,
                filter: ToolFilter {
                    allow: openapi.allow_operations.clone(),
                    deny: openapi.deny_operations.clone(),
                },
                effects: spec.effects.clone(),
                allow_http: openapi.allow_http,
                allow_private: openapi.allow_private,
                list_timeout: DEFAULT_LIST_TIMEOUT,
                call_timeout,
                pool,
            })
        }
        _ => Err(FieldError::new(
            "spec",
            "set exactly one of mcp and openapi",
        )),
    }
}

fn check_url(field: &str, text: &str, allow_http: bool) -> Result<url::Url, FieldError> {
    let url = url::Url::parse(text)
        .map_err(|e| FieldError::new(field, format!("{text:?} is not a URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => {
            return Err(FieldError::new(
                field,
                "http:// is refused unless the source sets allowHttp: true",
            ));
        }
        other => {
            return Err(FieldError::new(
                field,
                format!("scheme {other:?} is not http(s)"),
            ));
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(FieldError::new(
            field,
            "a URL may not hold credentials; use auth or headers with a secretRef",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::new(field, "the URL names no host"));
    }
    Ok(url)
}

fn check_headers(
    field: &str,
    headers: &[toolgrid_api::SourceHeader],
    has_auth: bool,
) -> Result<Vec<(String, HeaderValue)>, FieldError> {
    let mut out: Vec<(String, HeaderValue)> = Vec::new();
    for (i, header) in headers.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let name = header.name.to_ascii_lowercase();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        if !valid {
            return Err(FieldError::new(format!("{at}.name"), "not a header name"));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(FieldError::new(format!("{at}.name"), "named twice"));
        }
        if has_auth && name == "authorization" {
            return Err(FieldError::new(
                format!("{at}.name"),
                "authorization is set by auth",
            ));
        }
        if matches!(
            name.as_str(),
            "host" | "content-length" | "transfer-encoding" | "idempotency-key" | "mcp-session-id"
        ) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("{name} is set by toolgrid"),
            ));
        }
        let value = match (&header.value, &header.secret_ref) {
            (Some(text), None) => {
                if text.contains("${secret:") {
                    return Err(FieldError::new(
                        format!("{at}.value"),
                        "a secret goes by secretRef, not by a reference in the value",
                    ));
                }
                if text.bytes().any(|b| b == b'\r' || b == b'\n') {
                    return Err(FieldError::new(format!("{at}.value"), "holds a line break"));
                }
                HeaderValue::Literal(text.clone())
            }
            (None, Some(secret)) => HeaderValue::Secret(secret.clone()),
            _ => {
                return Err(FieldError::new(
                    at,
                    "set exactly one of value and secretRef",
                ));
            }
        };
        out.push((name, value));
    }
    Ok(out)
}

fn check_auth(
    field: &str,
    auth: Option<&toolgrid_api::SourceAuth>,
) -> Result<Option<(SourceAuthType, Option<SecretKeyRef>)>, FieldError> {
    let Some(auth) = auth else { return Ok(None) };
    match (auth.kind, &auth.secret_ref) {
        (SourceAuthType::Bearer, Some(secret)) => {
            Ok(Some((SourceAuthType::Bearer, Some(secret.clone()))))
        }
        (SourceAuthType::Bearer, None) => Err(FieldError::new(
            format!("{field}.secretRef"),
            "type bearer takes its token from a Secret",
        )),
        (SourceAuthType::Identity, None) => Ok(Some((SourceAuthType::Identity, None))),
        (SourceAuthType::Identity, Some(_)) => Err(FieldError::new(
            format!("{field}.secretRef"),
            "type identity is signed by toolgrid; it takes no Secret",
        )),
    }
}

/// The callable form of one imported tool: its Tool and its "release".
pub fn imported(
    key: &ObjectKey,
    plan: &SourcePlan,
    snapshot: &SourceSnapshot,
    tool: &ImportedTool,
) -> Result<(ResolvedTool, ResolvedRelease), FieldError> {
    let name = imported_tool_name(&key.name, &tool.name);
    let tool_key = ObjectKey::new(key.namespace.clone(), name.clone());
    // The upstream's own error (MCP `isError`, a non-2xx answer) is the command's one
    // declared error, exit code 1, with the upstream's text as its message.
    let mut command = tool.command.clone();
    if command.errors.is_empty() {
        command.errors.push(toolgrid_core::spec::DeclaredError {
            name: UPSTREAM_ERROR.into(),
            exit_code: 1,
            description: "The upstream reported an error; the message is its text.".into(),
            retryable: false,
        });
    }
    let interface = CommandInterface::compile_with(&command, "command", ArgumentNames::Imported)?;
    let spec = ToolSpec {
        description: tool.description.clone(),
        effect: tool.effect,
        timeout: Some(toolgrid_api::units::GoDuration(plan.call_timeout)),
        max_timeout: None,
        retry: None,
        repeat_window: None,
        result_policy: None,
        code_mode: false,
        commands: vec![command.clone()],
    };
    let upstream = UpstreamCall {
        source: key.name.clone(),
        endpoint: plan.endpoint.to_string(),
        target: tool.target.clone(),
        era: snapshot.era,
        identity: matches!(plan.auth, Some((SourceAuthType::Identity, _))),
    };
    let mut digest = Sha256::new();
    digest.update(serde_json::to_vec(&upstream).unwrap_or_default());
    digest.update(serde_json::to_vec(&command).unwrap_or_default());
    let release = ResolvedRelease {
        key: ObjectKey::new(key.namespace.clone(), format!("{name}@{}", key.name)),
        tool: name,
        version: semver::Version::new(0, 0, 0),
        digest: format!("sha256:{}", hex::encode(digest.finalize())),
        size: 0,
        artifact_kind: "upstream",
        pool: plan.pool.clone(),
        limits: Limits {
            memory_bytes: DEFAULT_MEMORY,
            cpu_time: DEFAULT_CPU_TIME,
            output_bytes: DEFAULT_OUTPUT,
            instances: 0,
            request_bytes: 0,
            response_bytes: 0,
        },
        network: NetworkPolicy {
            egress: vec![plan.egress_rule()],
        },
        upstream: Some(Arc::new(upstream)),
        files: Vec::new(),
        commands: Default::default(),
    };
    let resolved = ResolvedTool {
        key: tool_key,
        spec,
        effect: tool.effect,
        timeout: plan.call_timeout,
        commands: vec![Arc::new(interface)],
        release: Some(release.key.clone()),
    };
    Ok((resolved, release))
}

impl<'a> Resolver<'a> {
    pub(super) fn tool_sources(&mut self) {
        for d in self.declared(Kind::ToolSource, &self.input.set.tool_sources) {
            let plan = match check_source(d.object, &d.id.key) {
                Ok(plan) => plan,
                Err(e) => {
                    self.invalid(&d, e);
                    continue;
                }
            };
            self.tool_source(&d, &plan);
        }
    }

    fn tool_source(&mut self, d: &Declared<'a, ToolSource>, plan: &SourcePlan) {
        let ns = &d.id.key.namespace;
        let mut status = ToolSourceStatus {
            kind: Some(plan.kind.as_str().into()),
            ..ToolSourceStatus::default()
        };
        let mut columns = vec![("Kind".into(), plan.kind.as_str().to_string())];
        // What it refers to exists.
        let missing = self.missing_source_secret(ns, plan).or_else(|| {
            (!self
                .snapshot
                .pools
                .contains_key(&ObjectKey::new(ns.clone(), plan.pool.clone())))
            .then(|| {
                (
                    Reason::UnknownPool,
                    format!(
                        "spec.pool: there is no valid WorkerPool {:?} in namespace {ns:?}",
                        plan.pool
                    ),
                )
            })
        });
        if let Some((reason, message)) = missing {
            self.record_declared(
                d,
                Desired::not_ready(reason, message),
                KindStatus::ToolSource(status),
                columns,
            );
            return;
        }
        let Some(read) = self.input.source_reads.get(&d.id.key) else {
            self.record_declared(
                d,
                Desired::not_ready(Reason::SourcePending, "the upstream has not been read yet"),
                KindStatus::ToolSource(status),
                columns,
            );
            return;
        };
        status.read_generation = Some(d.generation);
        status.refreshed = read.refreshed.clone();
        status.read_at = Some(read.read_at.clone());
        status.refresh_error = read
            .refresh_failure
            .as_ref()
            .map(|f| format!("{}: {}", f.reason.as_str(), f.message));
        let snapshot = match &read.outcome {
            Ok(snapshot) => snapshot,
            Err(failure) => {
                self.record_declared(
                    d,
                    Desired::not_ready(failure.reason, failure.message.clone()),
                    KindStatus::ToolSource(status),
                    columns,
                );
                return;
            }
        };
        let mut left_out = snapshot.left_out.clone();
        let mut tools = 0;
        for tool in &snapshot.tools {
            match imported(&d.id.key, plan, snapshot, tool) {
                Ok((resolved, release)) => {
                    tools += 1;
                    self.snapshot
                        .releases
                        .insert(release.key.clone(), Arc::new(release));
                    self.snapshot
                        .tools
                        .insert(resolved.key.clone(), Arc::new(resolved));
                }
                Err(error) => left_out.push(toolgrid_core::source::LeftOut {
                    name: tool.name.clone(),
                    reason: toolgrid_core::source::LeftOutReason::UnsupportedSchema,
                    message: error.to_string(),
                }),
            }
        }
        let secrets: BTreeMap<String, SecretValue> = plan
            .secret_refs()
            .into_iter()
            .filter_map(|(reference, secret)| {
                let value = self.source_secret(ns, secret)?;
                Some((reference, value))
            })
            .collect();
        if !secrets.is_empty() {
            self.snapshot
                .source_secrets
                .insert(d.id.key.clone(), secrets);
        }
        status.tool_count = Some(tools);
        status.left_out_count = Some(left_out.len() as i64);
        columns.push(("Tools".into(), tools.to_string()));
        columns.push(("LeftOut".into(), left_out.len().to_string()));
        let message = format!(
            "{tools} tools imported as {}__<tool>, {} left out",
            d.id.key.name,
            left_out.len()
        );
        status.snapshot = Some(SourceSnapshot {
            tools: snapshot.tools.clone(),
            left_out,
            era: snapshot.era,
        });
        self.record_declared(
            d,
            Desired::ready(Reason::SourceRead, message),
            KindStatus::ToolSource(status),
            columns,
        );
    }

    /// The value of a Secret's key in `ns`, when the identities are known.
    fn source_secret(&self, ns: &str, secret: &SecretKeyRef) -> Option<SecretValue> {
        self.input
            .identities?
            .secrets
            .get(&ObjectKey::new(ns, secret.name.clone()))?
            .get(&secret.key)
            .cloned()
    }

    /// A Secret or key the source names that does not exist.
    fn missing_source_secret(&self, ns: &str, plan: &SourcePlan) -> Option<(Reason, String)> {
        let identities = self.input.identities?;
        plan.secret_refs().into_iter().find_map(|(_, secret)| {
            match identities
                .secrets
                .get(&ObjectKey::new(ns, secret.name.clone()))
            {
                None => Some((
                    Reason::MissingSecret,
                    format!("there is no Secret {:?} in namespace {ns:?}", secret.name),
                )),
                Some(keys) if !keys.contains_key(&secret.key) => Some((
                    Reason::MissingSecretKey,
                    format!("Secret {:?} has no key {:?}", secret.name, secret.key),
                )),
                Some(_) => None,
            }
        })
    }
}

/// What changed between two snapshots of a source, by upstream name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Offered before and after, with a different description, effect, schema or target.
    pub changed: Vec<String>,
}

/// What `toolgrid refresh` reports.
pub fn diff_snapshots(
    before: Option<&SourceSnapshot>,
    after: Option<&SourceSnapshot>,
) -> SnapshotDiff {
    let by_name = |s: Option<&SourceSnapshot>| -> BTreeMap<String, ImportedTool> {
        s.map(|s| {
            s.tools
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect()
        })
        .unwrap_or_default()
    };
    let (before, after) = (by_name(before), by_name(after));
    let mut diff = SnapshotDiff::default();
    for (name, tool) in &after {
        match before.get(name) {
            None => diff.added.push(name.clone()),
            Some(old) if old != tool => diff.changed.push(name.clone()),
            Some(_) => {}
        }
    }
    diff.removed = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .cloned()
        .collect();
    diff
}

/// Whether a source's status already answers its current spec and refresh request: then
/// the IO layer serves the snapshot in it instead of reading the upstream again.
pub fn status_is_current(
    status: &ToolSourceStatus,
    generation: i64,
    refresh: Option<&str>,
) -> Option<SourceRead> {
    let snapshot = status.snapshot.clone()?;
    (status.read_generation == Some(generation) && status.refreshed.as_deref() == refresh).then(
        || SourceRead {
            refreshed: status.refreshed.clone(),
            read_at: status.read_at.clone().unwrap_or_default(),
            outcome: Ok(snapshot),
            refresh_failure: None,
        },
    )
}

//! ToolReleases: each checked against its tool, its pool and its artifact; a Ready one
//! keeps its artifact.

use super::tool::ValidTools;
use super::{DEFAULT_CPU_TIME, DEFAULT_MEMORY, DEFAULT_OUTPUT, DEFAULT_POOL, MAX_MEMORY, Resolver};
use crate::artifacts::{ArtifactOutcome, MAX_COMMAND_ARTIFACTS, about_command, source_kind};
use crate::snapshot::{CommandRelease, Limits, ResolvedRelease, ResourceId};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::conditions::{self, Desired, Reason};
use toolgrid_api::{Kind, KindStatus, ToolReleaseStatus};
use toolgrid_core::artifact::is_valid_digest;
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::FieldError;
use toolgrid_core::spec::ReleaseLimits;

impl<'a> Resolver<'a> {
    pub(super) fn releases(&mut self, tools: &ValidTools<'a>) {
        let mut versions: BTreeMap<(String, String, semver::Version), ObjectKey> = BTreeMap::new();
        for d in self.declared(Kind::ToolRelease, &self.input.set.releases) {
            let spec = &d.object.spec;
            let ns = d.id.key.namespace.clone();
            let previous: ToolReleaseStatus = self
                .input
                .previous
                .get(&d.id)
                .and_then(|p| ToolReleaseStatus::deserialize(&p.status).ok())
                .unwrap_or_default();
            let previous_digest = previous.digest;
            let was_ready = conditions::is_ready(&previous.conditions);
            let mut status = ToolReleaseStatus::default();
            let mut columns = vec![
                ("Tool".into(), spec.tool.clone()),
                ("Version".into(), spec.version.clone()),
            ];
            let mut notes: Vec<String> = Vec::new();
            let outcome = (|| -> Result<ResolvedRelease, (Desired, Option<FieldError>)> {
                let spec_error =
                    |e: FieldError| (Desired::not_ready(Reason::InvalidSpec, ""), Some(e));
                if !is_dns_subdomain(&d.id.key.name) {
                    return Err(spec_error(FieldError::new(
                        "metadata.name",
                        "must be a DNS subdomain (lowercase letters, digits, - and .)",
                    )));
                }
                let version = semver::Version::parse(&spec.version).map_err(|e| {
                    spec_error(FieldError::new(
                        "spec.version",
                        format!("{:?} is not a semantic version: {e}", spec.version),
                    ))
                })?;
                source_kind(&spec.artifact)
                    .map_err(|m| spec_error(FieldError::new("spec.artifact", m)))?;
                if let Some(digest) = &spec.artifact.digest
                    && !is_valid_digest(digest)
                {
                    return Err(spec_error(FieldError::new(
                        "spec.artifact.digest",
                        format!("{digest:?} is not of the form sha256:<64 lowercase hex digits>"),
                    )));
                }
                let base_limits = spec.limits.clone().unwrap_or_default();
                let (limits, clamped) =
                    release_limits("spec.limits", &base_limits).map_err(spec_error)?;
                notes = clamped;
                let mut command_limits = BTreeMap::new();
                if spec.commands.len() > MAX_COMMAND_ARTIFACTS {
                    return Err(spec_error(FieldError::new(
                        "spec.commands",
                        format!(
                            "{} commands; a release may give at most {MAX_COMMAND_ARTIFACTS} their own artifact",
                            spec.commands.len()
                        ),
                    )));
                }
                for (i, command) in spec.commands.iter().enumerate() {
                    if command_limits.contains_key(&command.name) {
                        return Err(spec_error(FieldError::new(
                            format!("spec.commands[{i}].name"),
                            format!("command {:?} is named twice", command.name),
                        )));
                    }
                    let field = format!("spec.commands[{i}].artifact");
                    source_kind(&command.artifact)
                        .map_err(|m| spec_error(FieldError::new(&field, about_command(i, &m))))?;
                    match &command.artifact.digest {
                        Some(digest) if is_valid_digest(digest) => {}
                        Some(digest) => {
                            return Err(spec_error(FieldError::new(
                                format!("{field}.digest"),
                                format!(
                                    "{digest:?} is not of the form sha256:<64 lowercase hex digits>"
                                ),
                            )));
                        }
                        None => {
                            return Err(spec_error(FieldError::new(
                                format!("{field}.digest"),
                                "is required: a command's artifact is pinned by digest",
                            )));
                        }
                    }
                    let overlaid = match &command.limits {
                        Some(own) => base_limits.overlaid(own),
                        None => base_limits.clone(),
                    };
                    let (own, clamped) =
                        release_limits(&format!("spec.commands[{i}].limits"), &overlaid)
                            .map_err(spec_error)?;
                    notes.extend(
                        clamped
                            .into_iter()
                            .map(|note| format!("command {}: {note}", command.name)),
                    );
                    command_limits.insert(command.name.clone(), own);
                }
                for (i, rule) in spec.network.iter().flat_map(|n| &n.egress).enumerate() {
                    if rule.host.trim().is_empty() {
                        return Err(spec_error(FieldError::new(
                            format!("spec.network.egress[{i}].host"),
                            "must not be empty",
                        )));
                    }
                    for (name, template) in &rule.headers {
                        check_declared_header(name, template).map_err(|m| {
                            spec_error(FieldError::new(
                                format!("spec.network.egress[{i}].headers.{name}"),
                                m,
                            ))
                        })?;
                    }
                }
                let tool_key = ObjectKey::new(ns.clone(), spec.tool.clone());
                if !tools.contains_key(&tool_key) {
                    let reason = if self.snapshot.resources.contains_key(&ResourceId {
                        kind: Kind::Tool,
                        key: tool_key.clone(),
                    }) {
                        (
                            Reason::ToolNotValid,
                            format!("spec.tool: Tool {tool_key} is not valid (see its status)"),
                        )
                    } else {
                        (
                            Reason::UnknownTool,
                            format!(
                                "spec.tool: there is no Tool {:?} in namespace {ns:?}",
                                spec.tool
                            ),
                        )
                    };
                    return Err((Desired::not_ready(reason.0, reason.1), None));
                }
                if let Some((_, tool)) = tools.get(&tool_key)
                    && let Some((i, command)) = spec
                        .commands
                        .iter()
                        .enumerate()
                        .find(|(_, c)| tool.spec.command(&c.name).is_none())
                {
                    return Err(spec_error(FieldError::new(
                        format!("spec.commands[{i}].name"),
                        format!("Tool {tool_key} has no command {:?}", command.name),
                    )));
                }
                let (digest, size, kind, files, loaded_commands) =
                    match self.input.artifacts.get(&d.id.key) {
                        Some(ArtifactOutcome::Ready {
                            digest,
                            size,
                            kind,
                            files,
                            commands,
                        }) => (
                            digest.clone(),
                            *size,
                            *kind,
                            files.clone(),
                            commands.clone(),
                        ),
                        Some(ArtifactOutcome::Failed { reason, message }) => {
                            return Err((Desired::not_ready(*reason, message.clone()), None));
                        }
                        None => {
                            return Err((
                                Desired::not_ready(
                                    Reason::ArtifactPending,
                                    "the artifact has not been loaded yet",
                                ),
                                None,
                            ));
                        }
                    };
                let pool = spec
                    .pool
                    .clone()
                    .unwrap_or_else(|| DEFAULT_POOL.to_string());
                if !self
                    .snapshot
                    .pools
                    .contains_key(&ObjectKey::new(ns.clone(), pool.clone()))
                {
                    return Err((
                        Desired::not_ready(
                            Reason::UnknownPool,
                            format!(
                                "spec.pool: there is no valid WorkerPool {pool:?} in namespace {ns:?}"
                            ),
                        ),
                        None,
                    ));
                }
                if let Some(previous) = &previous_digest
                    && was_ready
                    && previous != &digest
                {
                    return Err((
                        Desired::not_ready(
                            Reason::ImmutableRelease,
                            format!(
                                "release {} was Ready with artifact {previous} and is immutable; its artifact is now {digest}: publish a new version instead",
                                d.id.key
                            ),
                        ),
                        None,
                    ));
                }
                let version_key = (ns.clone(), spec.tool.clone(), version.clone());
                if let Some(other) = versions.get(&version_key) {
                    return Err((
                        Desired::not_ready(
                            Reason::DuplicateVersion,
                            format!(
                                "version {version} of tool {:?} is also released by {}",
                                spec.tool, other.name
                            ),
                        ),
                        None,
                    ));
                }
                versions.insert(version_key, d.id.key.clone());
                let commands = loaded_commands
                    .into_iter()
                    .filter_map(|c| {
                        let limits = *command_limits.get(&c.name)?;
                        Some((
                            c.name,
                            CommandRelease {
                                digest: c.digest,
                                size: c.size,
                                artifact_kind: c.kind,
                                files: c.files,
                                limits,
                            },
                        ))
                    })
                    .collect();
                Ok(ResolvedRelease {
                    key: d.id.key.clone(),
                    tool: spec.tool.clone(),
                    version,
                    digest,
                    size,
                    artifact_kind: kind,
                    pool,
                    limits,
                    network: spec.network.clone().unwrap_or_default(),
                    upstream: None,
                    files,
                    commands,
                })
            })();
            match outcome {
                Ok(release) => {
                    status.digest = Some(release.digest.clone());
                    status.size = Some(release.size);
                    status.artifact_kind = Some(release.artifact_kind.to_string());
                    columns.push(("Digest".into(), short_digest(&release.digest)));
                    let mut message = format!(
                        "{} {} of {} bytes",
                        release.artifact_kind, release.digest, release.size
                    );
                    if !release.files.is_empty() {
                        let bytes: u64 = release.files.iter().map(|f| f.size).sum();
                        message.push_str(&format!(
                            ", with {} file(s) of {bytes} bytes",
                            release.files.len()
                        ));
                    }
                    for (name, command) in &release.commands {
                        message.push_str(&format!(
                            "; command {name} runs {} {} of {} bytes",
                            command.artifact_kind, command.digest, command.size
                        ));
                    }
                    for note in &notes {
                        message.push_str("; ");
                        message.push_str(note);
                    }
                    self.record_declared(
                        &d,
                        Desired::ready(Reason::ArtifactReady, message),
                        KindStatus::ToolRelease(status),
                        columns,
                    );
                    self.snapshot
                        .releases
                        .insert(d.id.key.clone(), Arc::new(release));
                }
                Err((_, Some(error))) => self.invalid(&d, error),
                Err((mut desired, None)) => {
                    if let Some(previous) = previous_digest {
                        status.digest = Some(previous);
                    }
                    if !d.source.is_cluster() {
                        desired.message = format!("{} ({})", desired.message, d.source);
                    }
                    tracing::warn!(resource = %d.id.key, reason = %desired.reason, "ToolRelease not ready: {}", desired.message);
                    self.record_declared(&d, desired, KindStatus::ToolRelease(status), columns);
                }
            }
        }
    }
}

/// A DNS-1123 subdomain, as Kubernetes names are.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// The limits of a release with defaults applied, and a note for each value clamped to its
/// maximum (said in the Ready condition).
/// A release's (or one command's) limits with defaults applied, checked; `field` names
/// them in errors (`spec.limits`).
fn release_limits(
    field: &str,
    limits: &ReleaseLimits,
) -> Result<(Limits, Vec<String>), FieldError> {
    use toolgrid_api::units::ByteSize;
    use toolgrid_core::call::{
        DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES,
        MAX_RESPONSE_BYTES,
    };
    let memory = limits.memory.map(|m| m.bytes()).unwrap_or(DEFAULT_MEMORY);
    if !(64 * 1024..=MAX_MEMORY).contains(&memory) {
        return Err(FieldError::new(
            format!("{field}.memory"),
            format!("must be between 64Ki and 4Gi (one wasm page at least), not {memory} bytes"),
        ));
    }
    let cpu_time = limits.cpu_time.map(|c| c.get()).unwrap_or(DEFAULT_CPU_TIME);
    if cpu_time.is_zero() {
        return Err(FieldError::new(
            format!("{field}.cpuTime"),
            "must be longer than zero",
        ));
    }
    let mut notes = Vec::new();
    let mut bytes =
        |name: &str, value: Option<ByteSize>, default: u64, max: u64| -> Result<u64, FieldError> {
            let value = value.map(|v| v.bytes()).unwrap_or(default);
            if value == 0 {
                return Err(FieldError::new(
                    format!("{field}.{name}"),
                    "must be at least 1 byte",
                ));
            }
            if value > max {
                notes.push(format!(
                    "limits.{name} {} is above the maximum of {}: calls are limited to {}",
                    ByteSize(value),
                    ByteSize(max),
                    ByteSize(max)
                ));
                return Ok(max);
            }
            Ok(value)
        };
    let output_bytes = bytes(
        "outputBytes",
        limits.output_bytes,
        DEFAULT_OUTPUT,
        MAX_OUTPUT_BYTES,
    )?;
    let request_bytes = bytes(
        "requestBytes",
        limits.request_bytes,
        DEFAULT_REQUEST_BYTES,
        MAX_REQUEST_BYTES,
    )?;
    let response_bytes = bytes(
        "responseBytes",
        limits.response_bytes,
        DEFAULT_RESPONSE_BYTES,
        MAX_RESPONSE_BYTES,
    )?;
    Ok((
        Limits {
            memory_bytes: memory,
            cpu_time,
            output_bytes,
            instances: limits.instances.unwrap_or(0),
            request_bytes,
            response_bytes,
        },
        notes,
    ))
}

/// Headers the host sets itself or that the request framing owns: a release cannot declare
/// them.
const UNDECLARABLE_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "idempotency-key",
    "toolgrid-attempt",
];

/// Whether a header a release declares on an egress rule is one the host can set: a token
/// name the host does not own, a value without control characters whose secret references
/// are well-formed (which keys they name is the binding's to grant).
pub fn check_declared_header(name: &str, template: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(format!("{name:?} is not a header name"));
    }
    if UNDECLARABLE_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
    {
        return Err(format!(
            "{name:?} is set by the host or the request framing and cannot be declared"
        ));
    }
    if template.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err("a header value cannot hold control characters".into());
    }
    toolgrid_core::secret::reference::template_keys(template)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The secret keys a release's declared egress headers refer to, each once.
pub fn declared_secret_keys(network: &toolgrid_core::spec::NetworkPolicy) -> Vec<String> {
    let mut keys: Vec<String> = network
        .egress
        .iter()
        .flat_map(|rule| rule.headers.values())
        .filter_map(|template| toolgrid_core::secret::reference::template_keys(template).ok())
        .flatten()
        .map(str::to_string)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

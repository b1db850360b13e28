//! Authorization: may this caller make this call, which release does it run, and what does
//! it get. Pure functions over a catalog snapshot (the agent-level decisions live in
//! [`toolgrid_catalog::access`]), so every decision is tested without IO.
//!
//! A call by an agent is allowed only when both agree:
//! - a **Ready ToolBinding** names the agent and the tool (its release range resolved to a
//!   Ready release, its keys exist), and the binding's `commands` (default: all) allow the
//!   command; the call runs the binding's resolved release;
//! - the agent's **permissions** allow the tool and the command.
//!
//! The binding can only narrow: the call's config, secret keys and filesystem are the
//! intersection of what the binding lists and what the agent has. Operators (without
//! acting as an agent) may call any tool, and their calls run the tool's newest release
//! with no config, secrets or filesystem.

use toolgrid_catalog::{ResolvedTool, Snapshot};
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{CallAccess, CallRecord};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::ids::ObjectKey;

pub use toolgrid_catalog::access::{Allowed, Refusal, ToolAccess, call_access, decide, explain};

/// What admission needs: the release to run (`None`: the tool's newest, for operators)
/// and the call's access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub release: Option<ObjectKey>,
    /// The binding's canary and its share of new calls now (a rollout).
    pub canary: Option<(ObjectKey, toolgrid_core::rollout::Weight)>,
    /// The binding the call goes through (`None` for an operator's own call).
    pub binding: Option<ObjectKey>,
    pub access: CallAccess,
    /// How the caller's model reaches the tool (an operator: both).
    pub exposure: toolgrid_api::Exposure,
}

/// Refuses anyone but an operator ([`ErrorKind::PermissionDenied`], "only operators may
/// `what`").
pub fn operators_only(caller: &Principal, what: &str) -> Result<(), ApiError> {
    match caller {
        Principal::Operator { .. } => Ok(()),
        Principal::Agent { .. } => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("only operators may {what}"),
        )),
    }
}

/// Refuses a direct call of a tool its binding exposes only to code-mode programs, and a
/// program's call of one it exposes only directly ([`ErrorKind::PermissionDenied`]).
pub fn check_exposure(
    grant: &Grant,
    tool: &toolgrid_catalog::ResolvedTool,
    from_program: bool,
) -> Result<(), ApiError> {
    let exposure = grant.exposure;
    let code_mode = tool.spec.code_mode;
    let tool = tool.key.name.as_str();
    if from_program && code_mode {
        return Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("tool {tool} runs programs, and a program may not start another"),
        ));
    }
    if from_program && !exposure.codemode() {
        return Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "tool {tool} is exposed to the agent only as a tool of its own (exposure: {}), \
                 not to programs of the code tool",
                exposure.as_str()
            ),
        ));
    }
    if !from_program && !exposure.direct() {
        return Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "tool {tool} is exposed to the agent only through the code tool (exposure: {}): \
                 call it from a program, `await tools.<tool>.<command>(args)`",
                exposure.as_str()
            ),
        ));
    }
    Ok(())
}

/// Authorizes a call of `tool`'s `command` by `caller`; refusals are
/// [`ErrorKind::PermissionDenied`] naming the cause.
pub fn authorize_call(
    snapshot: &Snapshot,
    caller: &Principal,
    tool: &ResolvedTool,
    command: &str,
) -> Result<Grant, ApiError> {
    let agent = match caller {
        Principal::Operator { .. } => {
            return Ok(Grant {
                release: None,
                canary: None,
                binding: None,
                access: CallAccess::default(),
                exposure: toolgrid_api::Exposure::Both,
            });
        }
        Principal::Agent { agent } => agent,
    };
    if agent.namespace != tool.key.namespace {
        return Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "agent {agent} may not call tool {}: agents call tools of their own namespace",
                tool.key
            ),
        ));
    }
    let allowed = decide(snapshot, agent, tool, Some(command)).map_err(|refusal| {
        ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "agent {agent} may not call {} {command}: {refusal}",
                tool.key.name
            ),
        )
    })?;
    let (Some(resolved), Some(binding)) = (
        snapshot.agent(agent),
        snapshot.bindings.get(&allowed.binding),
    ) else {
        return Err(ApiError::new(
            ErrorKind::Internal,
            "the catalog changed while the call was authorized",
        ));
    };
    Ok(Grant {
        release: Some(allowed.release),
        canary: binding
            .rollout
            .as_ref()
            .map(|r| (r.canary.clone(), r.weight())),
        binding: Some(allowed.binding.clone()),
        access: call_access(resolved, binding),
        exposure: allowed.exposure,
    })
}

/// Whether `caller` may see tool `tool` in listings: operators see every tool, agents the
/// ones they may call.
pub fn may_see_tool(snapshot: &Snapshot, caller: &Principal, tool: &ResolvedTool) -> bool {
    match caller {
        Principal::Operator { .. } => true,
        Principal::Agent { agent } => decide(snapshot, agent, tool, None).is_ok(),
    }
}

/// Whether `caller` may read a call (its record and oplog): operators read every call,
/// agents their own.
pub fn may_read_call(caller: &Principal, record: &CallRecord) -> bool {
    match caller {
        Principal::Operator { .. } => true,
        Principal::Agent { agent } => {
            record.namespace == agent.namespace
                && record.spec.access.agent.as_deref() == Some(agent.name.as_str())
        }
    }
}

/// The agent scope of idempotency keys and call listings: the agent's name, or `""` for an
/// operator's own calls.
pub fn agent_scope(caller: &Principal) -> &str {
    match caller {
        Principal::Operator { .. } => "",
        Principal::Agent { agent } => &agent.name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;
    use toolgrid_api::conditions::Reason;
    use toolgrid_catalog::artifacts::ArtifactOutcome;
    use toolgrid_catalog::manifest::{ResourceSet, load_text};
    use toolgrid_catalog::resolve::{Identities, ResolveInput, resolve};
    use toolgrid_catalog::{ResourceId, ResourceState};
    use toolgrid_core::call::Filesystem;

    const MANIFESTS: &str = r#"
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default}
spec: {replicas: 1}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: semver}
spec: {effect: read, commands: [{name: compare}, {name: bump}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: uuid}
spec: {effect: read, commands: [{name: generate}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: fetch}
spec: {effect: read, commands: [{name: get}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: textstats}
spec: {effect: read, commands: [{name: count}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: wc}
spec: {effect: read, commands: [{name: count}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: other}
spec: {effect: read, commands: [{name: run}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: narrow}
spec: {effect: read, commands: [{name: a}, {name: b}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: narrow-b}
spec: {agents: [reporter], tool: narrow, commands: [b]}
---
apiVersion: v1
kind: Secret
metadata: {name: reporter-token}
stringData: {token: tok-reporter}
---
apiVersion: v1
kind: Secret
metadata: {name: reporter-secrets}
data: {api-token: czNjcjN0}
stringData: {other-token: plain}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: reporter-config}
data: {region: eu-west-1}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: reporter}
spec:
  tokenSecretRef: {name: reporter-token, key: token}
  permissions:
    - {tools: [semver], commands: [compare]}
    - {tools: [uuid, fetch, textstats, narrow]}
  configMapRef: {name: reporter-config}
  secretRef: {name: reporter-secrets}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: wrong-key}
spec:
  tokenSecretRef: {name: reporter-token, key: nope}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: no-secret}
spec:
  tokenSecretRef: {name: reporter-token, key: token}
  secretRef: {name: missing}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: robot}
spec: {serviceAccount: robot-sa, permissions: [{tools: ["*"]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: semver-v1}
spec:
  agents: [reporter]
  tool: semver
  release: {version: "^1"}
  filesystemAccess: readOnly
  configKeysReadable: [region]
  secretKeysReadable: [api-token]
  secretKeysRevealable: [other-token]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: uuid-too-new}
spec: {agents: [reporter], tool: uuid, release: {version: "^2"}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: fetch-missing-key}
spec: {agents: [reporter], tool: fetch, secretKeysReadable: [nope]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: textstats-plain}
spec: {agents: [reporter], tool: textstats, configKeysReadable: [region]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: textstats-wants-more}
spec: {agents: [reporter], tool: textstats, configKeysReadable: [region, zone]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: other}
spec: {agents: [reporter], tool: other}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ghost}
spec: {agents: [ghost], tool: semver}
"#;

    fn release(name: &str, tool: &str, version: &str) -> String {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\nspec: {{tool: {tool}, version: \"{version}\", artifact: {{file: x.wasm}}}}\n"
        )
    }

    fn snapshot() -> Snapshot {
        let mut text = MANIFESTS.to_string();
        for (name, tool, version) in [
            ("semver-1.0.0", "semver", "1.0.0"),
            ("semver-2.0.0", "semver", "2.0.0"),
            ("uuid-1.0.0", "uuid", "1.0.0"),
            ("fetch-1.0.0", "fetch", "1.0.0"),
            ("textstats-1.0.0", "textstats", "1.0.0"),
            ("wc-1.0.0", "wc", "1.0.0"),
            ("other-1.0.0", "other", "1.0.0"),
            ("narrow-1.0.0", "narrow", "1.0.0"),
        ] {
            text.push_str(&release(name, tool, version));
        }
        let mut set = ResourceSet::default();
        load_text(Path::new("m.yaml"), &text, &mut set);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        let artifacts = set
            .releases
            .iter()
            .map(|r| {
                (
                    ObjectKey::new("default", r.object.metadata.name.clone().unwrap()),
                    ArtifactOutcome::Ready {
                        digest: "sha256:a".into(),
                        size: 10,
                        kind: "module",
                        files: Vec::new(),
                        commands: Vec::new(),
                    },
                )
            })
            .collect();
        let identities = Identities::of_manifests(&set);
        resolve(&ResolveInput {
            set: &set,
            artifacts: &artifacts,
            wasm: &HashMap::new(),
            previous: &HashMap::new(),
            now: "2026-01-01T00:00:00Z".parse().unwrap(),
            identities: Some(&identities),
            source_reads: &Default::default(),
            rollouts: &Default::default(),
            reuse: None,
        })
    }

    fn reporter() -> ObjectKey {
        ObjectKey::new("default", "reporter")
    }

    fn agent_caller() -> Principal {
        Principal::Agent { agent: reporter() }
    }

    fn state<'s>(
        snapshot: &'s Snapshot,
        kind: toolgrid_api::Kind,
        name: &str,
    ) -> &'s ResourceState {
        &snapshot.resources[&ResourceId {
            kind,
            key: ObjectKey::new("default", name),
        }]
    }

    fn tool<'s>(snapshot: &'s Snapshot, name: &str) -> &'s ResolvedTool {
        snapshot.tool("default", name).unwrap()
    }

    #[test]
    fn a_bound_permitted_call_runs_the_bindings_release_with_narrowed_access() {
        let snapshot = snapshot();
        let grant = authorize_call(
            &snapshot,
            &agent_caller(),
            tool(&snapshot, "semver"),
            "compare",
        )
        .unwrap();
        assert_eq!(
            grant.release,
            Some(ObjectKey::new("default", "semver-1.0.0"))
        );
        assert_eq!(
            tool(&snapshot, "semver").release,
            Some(ObjectKey::new("default", "semver-2.0.0")),
            "the tool's newest release is outside the binding's range"
        );
        let access = grant.access;
        assert_eq!(access.agent.as_deref(), Some("reporter"));
        assert_eq!(access.filesystem, Filesystem::ReadOnly);
        assert_eq!(
            access.config,
            [("region".to_string(), "eu-west-1".to_string())].into()
        );
        assert_eq!(access.secrets_readable, ["api-token"]);
        assert_eq!(access.secrets_revealable, ["other-token"]);
    }

    #[test]
    fn each_refusal_names_its_cause() {
        let snapshot = snapshot();
        let refusal = |name: &str, command: Option<&str>| {
            decide(&snapshot, &reporter(), tool(&snapshot, name), command).unwrap_err()
        };
        let bump = refusal("semver", Some("bump"));
        assert_eq!(bump.cause(), "permission");
        assert!(bump.to_string().contains("\"bump\""), "{bump}");
        assert_eq!(refusal("wc", None), Refusal::NoBinding);
        let narrow = refusal("narrow", Some("a"));
        assert_eq!(narrow.cause(), "binding-commands");
        assert_eq!(narrow.binding(), Some("narrow-b"));
        assert_eq!(refusal("other", None).cause(), "permission");
        let range = refusal("uuid", None);
        assert_eq!(range.cause(), "release-range");
        assert_eq!(range.binding(), Some("uuid-too-new"));
        assert!(range.to_string().contains("^2"), "{range}");
        match refusal("fetch", None) {
            Refusal::BindingNotReady {
                binding, reason, ..
            } => {
                assert_eq!(binding, "fetch-missing-key");
                assert_eq!(reason, Reason::MissingSecretKey);
            }
            other => panic!("{other:?}"),
        }
        let stranger = decide(
            &snapshot,
            &ObjectKey::new("default", "ghost"),
            tool(&snapshot, "semver"),
            None,
        )
        .unwrap_err();
        assert_eq!(stranger.cause(), "unknown-agent");
        // Over the API: PERMISSION_DENIED naming the cause.
        let error = authorize_call(
            &snapshot,
            &agent_caller(),
            tool(&snapshot, "uuid"),
            "generate",
        )
        .unwrap_err();
        assert_eq!(error.kind, ErrorKind::PermissionDenied);
        assert!(error.message.contains("release range"), "{}", error.message);
    }

    #[test]
    fn a_binding_asking_for_a_key_the_agent_lacks_is_not_ready_and_the_key_is_not_given() {
        let snapshot = snapshot();
        let wants_more = state(
            &snapshot,
            toolgrid_api::Kind::ToolBinding,
            "textstats-wants-more",
        );
        assert!(!wants_more.ready.status);
        assert_eq!(wants_more.ready.reason, Reason::MissingConfigKey);
        assert!(
            wants_more.ready.message.contains("\"zone\""),
            "{}",
            wants_more.ready.message
        );
        let missing = state(
            &snapshot,
            toolgrid_api::Kind::ToolBinding,
            "fetch-missing-key",
        );
        assert_eq!(missing.ready.reason, Reason::MissingSecretKey);
        // The Ready binding of the same tool serves the call, without the missing key.
        let grant = authorize_call(
            &snapshot,
            &agent_caller(),
            tool(&snapshot, "textstats"),
            "count",
        )
        .unwrap();
        assert_eq!(grant.access.config.keys().collect::<Vec<_>>(), ["region"]);
        assert!(grant.access.secrets_readable.is_empty());
        // And a binding's lists are intersected with what the agent has, whatever they say.
        let agent = snapshot.agent(&reporter()).unwrap();
        let mut binding =
            (*snapshot.bindings[&ObjectKey::new("default", "fetch-missing-key")]).clone();
        binding.spec.secret_keys_readable.push("api-token".into());
        binding.spec.config_keys_readable = vec!["zone".into()];
        let access = call_access(agent, &binding);
        assert_eq!(access.secrets_readable, ["api-token"]);
        assert!(access.config.is_empty());
    }

    #[test]
    fn agents_with_missing_references_are_not_ready() {
        let snapshot = snapshot();
        let wrong_key = state(&snapshot, toolgrid_api::Kind::Agent, "wrong-key");
        assert_eq!(wrong_key.ready.reason, Reason::MissingSecretKey);
        let no_secret = state(&snapshot, toolgrid_api::Kind::Agent, "no-secret");
        assert_eq!(no_secret.ready.reason, Reason::MissingSecret);
        assert_eq!(
            state(&snapshot, toolgrid_api::Kind::ToolBinding, "ghost")
                .ready
                .reason,
            Reason::UnknownAgent
        );
        // ServiceAccounts are not known in a manifest directory: not checked there.
        assert!(
            state(&snapshot, toolgrid_api::Kind::Agent, "robot")
                .ready
                .status
        );
        let reporter = snapshot.agent(&reporter()).unwrap();
        assert_eq!(
            reporter.token_digest,
            Some(toolgrid_core::secret::sha256(b"tok-reporter"))
        );
        let values = snapshot.secret_values(
            "default",
            "reporter",
            &["api-token".to_string(), "absent".to_string()],
        );
        assert_eq!(values.len(), 1);
        assert_eq!(values["api-token"].expose_str(), Some("s3cr3t"));
        let printed = format!("{snapshot:?}");
        assert!(!printed.contains("s3cr3t") && !printed.contains("tok-reporter"));
    }

    #[test]
    fn operators_call_anything_and_read_everything() {
        let snapshot = snapshot();
        let operator = Principal::Operator {
            subject: "admin".into(),
        };
        let grant = authorize_call(&snapshot, &operator, tool(&snapshot, "wc"), "count").unwrap();
        assert_eq!(grant.release, None, "the tool's newest release");
        assert_eq!(grant.access, CallAccess::default());
        assert!(may_see_tool(&snapshot, &operator, tool(&snapshot, "wc")));
        assert!(!may_see_tool(
            &snapshot,
            &agent_caller(),
            tool(&snapshot, "wc")
        ));
        assert!(may_see_tool(
            &snapshot,
            &agent_caller(),
            tool(&snapshot, "semver")
        ));
        let elsewhere = Principal::Agent {
            agent: ObjectKey::new("team", "reporter"),
        };
        assert_eq!(
            authorize_call(&snapshot, &elsewhere, tool(&snapshot, "semver"), "compare")
                .unwrap_err()
                .kind,
            ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn explain_covers_every_tool_of_the_namespace() {
        let snapshot = snapshot();
        let all = explain(&snapshot, &reporter(), None);
        let allowed: Vec<&str> = all
            .iter()
            .filter(|a| a.verdict.is_ok())
            .map(|a| a.tool.as_str())
            .collect();
        assert_eq!(allowed, ["narrow", "semver", "textstats"]);
        let narrow = all.iter().find(|a| a.tool == "narrow").unwrap();
        assert_eq!(
            narrow.verdict.as_ref().unwrap().commands,
            ["b"],
            "the binding narrows the permissions"
        );
        let semver = all.iter().find(|a| a.tool == "semver").unwrap();
        assert_eq!(semver.verdict.as_ref().unwrap().commands, ["compare"]);
        assert_eq!(all.len(), 7);
        assert_eq!(explain(&snapshot, &reporter(), Some("wc")).len(), 1);
        // The Agent's status says the same.
        let agent = state(&snapshot, toolgrid_api::Kind::Agent, "reporter");
        assert_eq!(
            agent.status["tools"],
            serde_json::json!(["narrow", "semver", "textstats"])
        );
    }

    #[test]
    fn agents_read_only_their_own_calls() {
        let record = |agent: Option<&str>| CallRecord {
            id: "c".into(),
            namespace: "default".into(),
            tool: "semver".into(),
            command: "compare".into(),
            release: "semver-1.0.0".into(),
            release_digest: "sha256:a".into(),
            state: toolgrid_core::call::CallState::Succeeded,
            args: serde_json::Value::Null,
            spec: toolgrid_core::call::CallSpec {
                access: CallAccess {
                    agent: agent.map(String::from),
                    ..CallAccess::default()
                },
                ..Default::default()
            },
            stdin: vec![],
            idempotency_key: None,
            request_hash: String::new(),
            epoch: 0,
            worker: None,
            result: None,
            error: None,
            created_at_ms: 0,
            finished_at_ms: None,
        };
        assert!(may_read_call(&agent_caller(), &record(Some("reporter"))));
        assert!(!may_read_call(&agent_caller(), &record(Some("other"))));
        assert!(!may_read_call(&agent_caller(), &record(None)));
        let operator = Principal::Operator {
            subject: "admin".into(),
        };
        assert!(may_read_call(&operator, &record(Some("other"))));
    }
}

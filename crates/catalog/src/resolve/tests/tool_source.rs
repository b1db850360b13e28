//! ToolSources: a spec checked (each refusal named by its field), a read turned into
//! callable tools with the source's egress and credentials, a failed read named, a snapshot
//! kept in status and served again only for the same generation and refresh.

use super::{BASE, T0, set_of, state};
use crate::Identities;
use crate::resolve::tool_source::{
    ReadFailure, SourceRead, check_source, diff_snapshots, status_is_current,
};
use crate::resolve::{ResolveInput, resolve};
use crate::snapshot::Snapshot;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use toolgrid_api::conditions::Reason;
use toolgrid_api::{Kind, ToolSourceStatus};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::secret::SecretValue;
use toolgrid_core::source::{IDENTITY_SECRET, SourceSnapshot, UpstreamTarget};
use toolgrid_core::spec::Effect;

fn source(spec: &str) -> String {
    format!(
        "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolSource\nmetadata: {{name: shop}}\nspec: {spec}\n"
    )
}

fn check(spec: &str) -> Result<(), (String, String)> {
    let set = set_of(&source(spec));
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    check_source(
        &set.tool_sources[0].object,
        &ObjectKey::new("default", "shop"),
    )
    .map(|_| ())
    .map_err(|e| (e.field, e.message))
}

#[test]
fn a_spec_is_refused_by_the_field_at_fault() {
    let refused = |spec: &str, field: &str| {
        let (at, message) = check(spec).expect_err(spec);
        assert_eq!(at, field, "{spec}: {message}");
    };
    refused("{}", "spec");
    refused(
        "{mcp: {url: 'https://a.example/mcp'}, openapi: {spec: {url: 'https://a.example/o.json'}}}",
        "spec",
    );
    refused("{mcp: {url: 'http://a.example/mcp'}}", "spec.mcp.url");
    refused(
        "{mcp: {url: 'https://user:pw@a.example/mcp'}}",
        "spec.mcp.url",
    );
    refused("{mcp: {url: 'ftp://a.example/mcp'}}", "spec.mcp.url");
    refused("{mcp: {url: 'not a url'}}", "spec.mcp.url");
    refused(
        "{mcp: {url: 'https://a.example/mcp', auth: {type: bearer}}}",
        "spec.mcp.auth.secretRef",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp', auth: {type: identity, secretRef: {name: s, key: k}}}}",
        "spec.mcp.auth.secretRef",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp', auth: {type: identity}, headers: [{name: Authorization, value: x}]}}",
        "spec.mcp.headers[0].name",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp', headers: [{name: x-key, value: '${secret:token}'}]}}",
        "spec.mcp.headers[0].value",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp', headers: [{name: x-key}]}}",
        "spec.mcp.headers[0]",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp', headers: [{name: Idempotency-Key, value: x}]}}",
        "spec.mcp.headers[0].name",
    );
    refused("{openapi: {spec: {}}}", "spec.openapi.spec");
    refused(
        "{openapi: {spec: {file: ../etc/passwd}, baseUrl: 'https://a.example'}}",
        "spec.openapi.spec.file",
    );
    refused(
        "{openapi: {spec: {file: api.json}}}",
        "spec.openapi.baseUrl",
    );
    refused(
        "{mcp: {url: 'https://a.example/mcp'}, callTimeout: 0s}",
        "spec.callTimeout",
    );
    // What is allowed.
    check("{mcp: {url: 'http://127.0.0.1:9/mcp', allowHttp: true, allowPrivate: true}}").unwrap();
    check("{openapi: {spec: {url: 'https://a.example/openapi.json'}}}").unwrap();
    check("{openapi: {spec: {configMap: {name: c, key: k}}, baseUrl: 'https://a.example/v1'}}")
        .unwrap();
}

const READ_AT: &str = "2026-01-01T00:00:00Z";

fn snapshot_with_add() -> SourceSnapshot {
    serde_json::from_value(json!({
        "tools": [{
            "name": "add",
            "description": "Adds.",
            "effect": "read",
            "command": {"name": "default", "options": [
                {"name": "a", "schema": {"type": "number"}, "required": true},
                {"name": "b", "schema": {"type": "number"}, "required": true}
            ]},
            "target": {"kind": "mcp", "tool": "add"}
        }],
        "leftOut": [{"name": "secret-admin", "reason": "NotAllowed", "message": "denied"}],
        "era": "modern"
    }))
    .unwrap()
}

fn run(text: &str, reads: HashMap<ObjectKey, SourceRead>, identities: &Identities) -> Snapshot {
    let set = set_of(text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    resolve(&ResolveInput {
        set: &set,
        artifacts: &HashMap::new(),
        wasm: &HashMap::new(),
        previous: &HashMap::new(),
        now: T0.parse().unwrap(),
        identities: Some(identities),
        source_reads: &reads,
        rollouts: &Default::default(),
        reuse: None,
    })
}

fn read(outcome: Result<SourceSnapshot, ReadFailure>) -> HashMap<ObjectKey, SourceRead> {
    HashMap::from([(
        ObjectKey::new("default", "shop"),
        SourceRead {
            refreshed: None,
            read_at: READ_AT.into(),
            outcome,
            refresh_failure: None,
        },
    )])
}

const BEARER: &str = "{mcp: {url: 'https://mcp.example.com/mcp', auth: {type: bearer, secretRef: {name: shop-auth, key: token}}, headers: [{name: x-tenant, value: t1}, {name: x-key, secretRef: {name: shop-auth, key: key}}]}}";

fn identities() -> Identities {
    let mut identities = Identities::default();
    identities.secrets.insert(
        ObjectKey::new("default", "shop-auth"),
        BTreeMap::from([
            ("token".to_string(), SecretValue::new("tok-1")),
            ("key".to_string(), SecretValue::new("key-1")),
        ]),
    );
    identities
}

#[test]
fn a_read_source_offers_callable_tools_reaching_its_upstream_with_its_credentials() {
    let text = format!(
        "{BASE}{}---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: b}}\nspec: {{tool: shop__add, agents: [bot]}}\n---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: bot}}\nspec: {{serviceAccount: bot, permissions: [{{tools: ['*']}}]}}\n",
        source(BEARER)
    );
    let snapshot = run(&text, read(Ok(snapshot_with_add())), &identities());
    let source = state(&snapshot, Kind::ToolSource, "shop");
    assert!(source.ready.status, "{:?}", source.ready);
    assert_eq!(source.ready.reason, Reason::SourceRead);
    let status: ToolSourceStatus = serde_json::from_value(source.status.clone()).unwrap();
    assert_eq!(status.tool_count, Some(1));
    assert_eq!(status.left_out_count, Some(1));
    assert_eq!(status.kind.as_deref(), Some("mcp"));
    assert_eq!(status.read_generation, Some(1));
    assert_eq!(status.snapshot.as_ref().unwrap().tools[0].name, "add");
    // No secret value is in the status.
    let written = source.status.to_string();
    assert!(
        !written.contains("tok-1") && !written.contains("key-1"),
        "{written}"
    );

    let tool = snapshot.tool("default", "shop__add").expect("callable");
    assert_eq!(tool.effect, Effect::Read);
    assert!(tool.command("default").is_some());
    let release = snapshot.release(tool.release.as_ref().unwrap()).unwrap();
    let upstream = release.upstream.as_ref().expect("an upstream call");
    assert_eq!(upstream.endpoint, "https://mcp.example.com/mcp");
    assert_eq!(upstream.target, UpstreamTarget::Mcp { tool: "add".into() });
    assert!(!upstream.identity);
    // The one destination, with the credentials by reference only.
    let rule = &release.network.egress[0];
    assert_eq!(rule.host, "mcp.example.com");
    assert_eq!(rule.ports, vec![443]);
    assert!(!rule.allow_private);
    assert_eq!(
        rule.headers["authorization"],
        "Bearer ${secret:toolsource-auth}"
    );
    assert_eq!(rule.headers["x-tenant"], "t1");
    assert_eq!(rule.headers["x-key"], "${secret:toolsource-header-1}");
    let secrets = &snapshot.source_secrets[&ObjectKey::new("default", "shop")];
    assert_eq!(secrets["toolsource-auth"].expose_str(), Some("tok-1"));
    assert_eq!(secrets["toolsource-header-1"].expose_str(), Some("key-1"));
    // A binding to it is Ready like any other.
    let binding = state(&snapshot, Kind::ToolBinding, "b");
    assert!(binding.ready.status, "{:?}", binding.ready);
}

#[test]
fn an_identity_source_declares_the_token_reference_and_takes_no_secret() {
    let text = format!(
        "{BASE}{}",
        source(
            "{openapi: {spec: {url: 'https://api.example.com/openapi.json'}, auth: {type: identity}}}"
        )
    );
    let mut offered = snapshot_with_add();
    offered.tools[0].target =
        serde_json::from_value(json!({"kind": "http", "method": "GET", "path": "/add"})).unwrap();
    let snapshot = run(&text, read(Ok(offered)), &Identities::default());
    let tool = snapshot.tool("default", "shop__add").unwrap();
    let release = snapshot.release(tool.release.as_ref().unwrap()).unwrap();
    let upstream = release.upstream.as_ref().unwrap();
    assert!(upstream.identity);
    // The base URL defaults to the document's origin.
    assert_eq!(upstream.endpoint, "https://api.example.com/");
    assert_eq!(
        release.network.egress[0].headers["authorization"],
        format!("Bearer ${{secret:{IDENTITY_SECRET}}}")
    );
    assert!(snapshot.source_secrets.is_empty());
}

#[test]
fn a_source_that_was_not_or_could_not_be_read_offers_nothing_and_says_why() {
    let text = format!("{BASE}{}", source(BEARER));
    let pending = run(&text, HashMap::new(), &identities());
    let state_of = |s: &Snapshot| state(s, Kind::ToolSource, "shop").ready.clone();
    assert_eq!(state_of(&pending).reason, Reason::SourcePending);
    assert!(pending.tool("default", "shop__add").is_none());
    let failed = run(
        &text,
        read(Err(ReadFailure {
            reason: Reason::UpstreamTimeout,
            message: "no answer in 30s".into(),
        })),
        &identities(),
    );
    let ready = state_of(&failed);
    assert!(!ready.status);
    assert_eq!(ready.reason, Reason::UpstreamTimeout);
    assert!(ready.message.contains("no answer"), "{ready:?}");
    assert!(failed.tool("default", "shop__add").is_none());
    // A missing Secret or key is named before anything is read.
    let no_secret = run(&text, read(Ok(snapshot_with_add())), &Identities::default());
    assert_eq!(state_of(&no_secret).reason, Reason::MissingSecret);
    let mut partial = identities();
    partial
        .secrets
        .get_mut(&ObjectKey::new("default", "shop-auth"))
        .unwrap()
        .remove("key");
    let no_key = run(&text, read(Ok(snapshot_with_add())), &partial);
    assert_eq!(state_of(&no_key).reason, Reason::MissingSecretKey);
    // An unknown pool.
    let text = format!(
        "{BASE}{}",
        source("{mcp: {url: 'https://mcp.example.com/mcp'}, pool: gpu}")
    );
    let no_pool = run(&text, read(Ok(snapshot_with_add())), &identities());
    assert_eq!(state_of(&no_pool).reason, Reason::UnknownPool);
}

#[test]
fn a_stored_snapshot_is_served_only_for_its_generation_and_refresh() {
    let status = ToolSourceStatus {
        read_generation: Some(3),
        refreshed: Some("r1".into()),
        read_at: Some(READ_AT.into()),
        snapshot: Some(snapshot_with_add()),
        ..ToolSourceStatus::default()
    };
    let served = status_is_current(&status, 3, Some("r1")).expect("current");
    assert_eq!(served.outcome.unwrap().tools.len(), 1);
    assert!(
        status_is_current(&status, 4, Some("r1")).is_none(),
        "a new generation"
    );
    assert!(
        status_is_current(&status, 3, Some("r2")).is_none(),
        "a refresh"
    );
    assert!(status_is_current(&status, 3, None).is_none());
    let empty = ToolSourceStatus {
        snapshot: None,
        ..status
    };
    assert!(
        status_is_current(&empty, 3, Some("r1")).is_none(),
        "nothing kept"
    );
}

#[test]
fn a_refresh_reports_what_was_added_removed_and_changed() {
    let before = snapshot_with_add();
    let mut after = before.clone();
    after.tools[0].description = "Adds two numbers.".into();
    let mut sub = after.tools[0].clone();
    sub.name = "sub".into();
    after.tools.push(sub);
    let diff = diff_snapshots(Some(&before), Some(&after));
    assert_eq!(diff.added, vec!["sub"]);
    assert_eq!(diff.changed, vec!["add"]);
    assert!(diff.removed.is_empty());
    let diff = diff_snapshots(Some(&after), None);
    assert_eq!(diff.removed, vec!["add", "sub"]);
    assert_eq!(
        diff_snapshots(Some(&before), Some(&before)),
        Default::default()
    );
}

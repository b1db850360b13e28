use super::*;
use std::sync::Arc;
use std::time::Duration;

const MIDDLEWARE: &str = r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: reporter}
spec: {serviceAccount: reporter, permissions: [{tools: [echo]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: limit}
spec: {rateLimit: {requests: 5, per: 1m}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: audit-all}
spec: {enforce: true, audit: {}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: approve-pushes}
spec: {approval: {when: 'call.command == "push"'}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: broken}
spec: {policy: {rules: [{action: allow}, {when: 'call.tool ==', action: deny}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: chained}
spec: {agents: [reporter], tool: echo, middleware: [limit, audit-all, approve-pushes, limit]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: plain}
spec: {agents: [reporter], tool: echo}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: uses-broken}
spec: {agents: [reporter], tool: echo, middleware: [broken]}
"#;

fn resolve_text(text: &str) -> Snapshot {
    let set = set_of(text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    run_ready(&set, &HashMap::new(), T0)
}

fn column(snapshot: &Snapshot, kind: Kind, name: &str, column: &str) -> String {
    state(snapshot, kind, name)
        .columns
        .iter()
        .find(|(c, _)| c == column)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn a_middleware_that_does_not_compile_is_not_ready_and_not_in_the_snapshot() {
    let text = format!(
        "{BASE}{}{MIDDLEWARE}",
        release("echo-1.2.0", "echo", "1.2.0")
    );
    let snapshot = resolve_text(&text);
    let broken = state(&snapshot, Kind::Middleware, "broken");
    assert!(!broken.ready.status);
    assert_eq!(broken.ready.reason, Reason::InvalidExpression);
    assert!(
        broken
            .ready
            .message
            .starts_with("spec.policy.rules[1].when: "),
        "{}",
        broken.ready.message
    );
    assert!(!snapshot.middleware.keys().any(|k| k.name == "broken"));
    for name in ["limit", "audit-all", "approve-pushes"] {
        assert_eq!(
            state(&snapshot, Kind::Middleware, name).ready.reason,
            Reason::Resolved,
            "{name}"
        );
        assert!(snapshot.middleware.keys().any(|k| k.name == name), "{name}");
    }
    // The binding that names it is not Ready, naming it and why.
    let uses = state(&snapshot, Kind::ToolBinding, "uses-broken");
    assert_eq!(uses.ready.reason, Reason::MiddlewareNotReady);
    assert!(
        uses.ready.message.contains("broken"),
        "{}",
        uses.ready.message
    );
    assert!(
        uses.ready.message.contains("InvalidExpression"),
        "{}",
        uses.ready.message
    );
    // The others are Ready.
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "chained").ready.reason,
        Reason::Resolved
    );
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "plain").ready.reason,
        Reason::Resolved
    );
}

#[test]
fn an_approval_when_that_does_not_compile_is_not_ready() {
    let text = format!(
        "{BASE}{}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: approve}
spec: {approval: {when: 'call.command == '}}
"#
    );
    let snapshot = resolve_text(&text);
    let approve = state(&snapshot, Kind::Middleware, "approve");
    assert_eq!(approve.ready.reason, Reason::InvalidExpression);
    assert!(
        approve.ready.message.starts_with("spec.approval.when: "),
        "{}",
        approve.ready.message
    );
}

#[test]
fn an_enforced_middleware_that_is_not_ready_fails_every_binding_closed() {
    let text = format!(
        "{BASE}{}{MIDDLEWARE}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: guard}
spec: {enforce: true, policy: {rules: [{when: 'nope', action: deny}]}}
"#
    );
    let snapshot = resolve_text(&text);
    assert_eq!(
        state(&snapshot, Kind::Middleware, "guard").ready.reason,
        Reason::InvalidExpression
    );
    for name in ["chained", "plain", "uses-broken"] {
        let b = state(&snapshot, Kind::ToolBinding, name);
        assert_eq!(b.ready.reason, Reason::MiddlewareNotReady, "{name}");
        assert!(b.ready.message.contains("guard"), "{}", b.ready.message);
        let binding = snapshot
            .bindings
            .values()
            .find(|b| b.key.name == name)
            .unwrap();
        assert!(!binding.is_ready(), "{name}");
    }
}

#[test]
fn an_enforced_middleware_with_an_invalid_spec_fails_closed_too() {
    let text = format!(
        "{BASE}{}{MIDDLEWARE}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: guard}
spec: {enforce: true, audit: {}, rateLimit: {requests: 1, per: 1s}}
"#
    );
    let snapshot = resolve_text(&text);
    let b = state(&snapshot, Kind::ToolBinding, "plain");
    assert_eq!(b.ready.reason, Reason::MiddlewareNotReady);
    assert!(
        b.ready.message.contains("InvalidSpec"),
        "{}",
        b.ready.message
    );
}

#[test]
fn the_middleware_column_is_the_chain_in_order() {
    let text = format!(
        "{BASE}{}{MIDDLEWARE}",
        release("echo-1.2.0", "echo", "1.2.0")
    );
    let snapshot = resolve_text(&text);
    assert_eq!(
        column(&snapshot, Kind::ToolBinding, "chained", "Middleware"),
        "audit-all,limit,approve-pushes"
    );
    assert_eq!(
        column(&snapshot, Kind::ToolBinding, "plain", "Middleware"),
        "audit-all"
    );
    // Not Ready: what the chain would be.
    assert_eq!(
        column(&snapshot, Kind::ToolBinding, "uses-broken", "Middleware"),
        "audit-all,broken"
    );
    // The same order the gateway runs.
    let chained = snapshot
        .bindings
        .values()
        .find(|b| b.key.name == "chained")
        .unwrap();
    let chain = crate::middleware::chain_for(&snapshot, chained).unwrap();
    let names: Vec<&str> = chain.links.iter().map(|l| l.name()).collect();
    assert_eq!(names, ["audit-all", "limit", "approve-pushes"]);
}

#[test]
fn a_wasm_middleware_is_ready_only_with_its_component() {
    use crate::artifacts::WasmArtifact;
    let wasm = |name: &str, extra: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Middleware\nmetadata: {{name: {name}}}\nspec: {{wasm: {{artifact: {{file: m.wasm}}{extra}}}}}\n"
        )
    };
    let text = format!(
        "{BASE}{}{}{}{}{}---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: through-bad}}\nspec: {{agents: [reporter], tool: echo, middleware: [bad]}}\n---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: reporter}}\nspec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}\n",
        release("echo-1.2.0", "echo", "1.2.0"),
        wasm("good", ", timeout: 200ms"),
        wasm("bad", ""),
        wasm("pending", ""),
        wasm("slow", ", timeout: 5m"),
    );
    let set = set_of(&text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let key = |name: &str| ObjectKey::new("default", name);
    let ready = WasmArtifact::Ready {
        digest: "sha256:c".into(),
        bytes: Arc::new(vec![0]),
    };
    let components: HashMap<ObjectKey, WasmArtifact> = [
        (key("good"), ready.clone()),
        (key("slow"), ready),
        (
            key("bad"),
            WasmArtifact::Failed {
                reason: Reason::InvalidArtifact,
                message: "spec.wasm.artifact: not a wasm middleware".into(),
            },
        ),
    ]
    .into();
    let snapshot = resolve(&ResolveInput {
        set: &set,
        artifacts: &ready_artifacts(&set, "sha256:a"),
        wasm: &components,
        previous: &HashMap::new(),
        now: T0.parse().unwrap(),
        identities: None,
        source_reads: &Default::default(),
        rollouts: &Default::default(),
        reuse: None,
    });
    let ready = |name: &str| state(&snapshot, Kind::Middleware, name).ready.clone();
    assert_eq!(ready("good").reason, Reason::Resolved);
    let Some(toolgrid_core::middleware::Step::Wasm(module)) =
        snapshot.middleware.get(&key("good")).map(|m| &m.step)
    else {
        panic!("a wasm step")
    };
    assert_eq!(module.digest, "sha256:c");
    assert_eq!(module.timeout, Duration::from_millis(200));
    assert_eq!(ready("bad").reason, Reason::InvalidArtifact);
    assert!(ready("bad").message.contains("not a wasm middleware"));
    assert_eq!(ready("pending").reason, Reason::ArtifactPending);
    assert_eq!(ready("slow").reason, Reason::InvalidSpec);
    assert!(ready("slow").message.contains("spec.wasm.timeout"));
    for name in ["bad", "pending", "slow"] {
        assert!(!snapshot.middleware.contains_key(&key(name)), "{name}");
    }
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "through-bad")
            .ready
            .reason,
        Reason::MiddlewareNotReady
    );
}

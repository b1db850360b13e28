use super::*;

#[test]
fn pools_agents_middleware_and_bindings_are_validated() {
    let text = format!(
        r#"{BASE}{}
---
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: both}}
spec: {{replicas: 1, autoscale: {{min: 1, max: 2}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reporter}}
spec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: nobody}}
spec: {{permissions: []}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: two-steps}}
spec: {{audit: {{}}, rateLimit: {{requests: 1, per: 1s}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: audit}}
spec: {{audit: {{stdout: true}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: ok}}
spec: {{agents: [reporter], tool: echo, release: {{version: "^1.1"}}, middleware: [audit]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: too-new}}
spec: {{agents: [reporter], tool: echo, release: {{version: "^2"}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: stranger}}
spec: {{agents: [nobody], tool: echo}}
"#,
        release("echo-1.2.0", "echo", "1.2.0")
    );
    let set = set_of(&text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let snapshot = run(
        &set,
        &ready_artifacts(&set, "sha256:a"),
        &HashMap::new(),
        T0,
    );
    let reason = |kind, name: &str| state(&snapshot, kind, name).ready.reason;
    assert_eq!(reason(Kind::WorkerPool, "both"), Reason::InvalidSpec);
    assert_eq!(reason(Kind::Agent, "reporter"), Reason::Resolved);
    assert_eq!(reason(Kind::Agent, "nobody"), Reason::InvalidSpec);
    assert_eq!(reason(Kind::Middleware, "two-steps"), Reason::InvalidSpec);
    assert_eq!(reason(Kind::Middleware, "audit"), Reason::Resolved);
    assert_eq!(reason(Kind::ToolBinding, "ok"), Reason::Resolved);
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "ok").status["resolvedRelease"],
        "echo-1.2.0"
    );
    assert_eq!(
        reason(Kind::ToolBinding, "too-new"),
        Reason::NoMatchingRelease
    );
    assert_eq!(reason(Kind::ToolBinding, "stranger"), Reason::UnknownAgent);
}

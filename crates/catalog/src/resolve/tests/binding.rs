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

#[test]
fn a_release_uses_by_reference_only_the_secrets_its_binding_grants() {
    let text = format!(
        r#"{BASE}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: echo-1.0.0}}
spec:
  tool: echo
  version: "1.0.0"
  artifact: {{file: x.wasm}}
  network:
    egress:
    - host: api.example.com
      headers: {{authorization: "Bearer ${{secret:api-token}}", x-plain: "1"}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reporter}}
spec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: granted}}
spec: {{agents: [reporter], tool: echo, secretKeysReadable: [api-token]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: revealed}}
spec: {{agents: [reporter], tool: echo, secretKeysRevealable: [api-token]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: ungranted}}
spec: {{agents: [reporter], tool: echo, secretKeysReadable: [other]}}
"#
    );
    let set = set_of(&text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let snapshot = run(
        &set,
        &ready_artifacts(&set, "sha256:a"),
        &HashMap::new(),
        T0,
    );
    let ready = |name: &str| state(&snapshot, Kind::ToolBinding, name).ready.clone();
    assert_eq!(ready("granted").reason, Reason::Resolved);
    assert_eq!(ready("revealed").reason, Reason::Resolved);
    let ungranted = ready("ungranted");
    assert!(!ungranted.status);
    assert_eq!(ungranted.reason, Reason::UngrantedSecretReference);
    assert!(Reason::UngrantedSecretReference.stalled());
    assert!(
        ungranted.message.contains("${secret:api-token}"),
        "{}",
        ungranted.message
    );
}

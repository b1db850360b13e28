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
    let snapshot = run_ready(&set, &HashMap::new(), T0);
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
    let snapshot = run_ready(&set, &HashMap::new(), T0);
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

#[test]
fn a_binding_with_a_rollout_splits_between_its_stable_release_and_its_canary() {
    let text = format!(
        r#"{BASE}{}{}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reporter}}
spec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: canaried}}
spec: {{agents: [reporter], tool: echo, rollout: {{canary: echo-1.3.0, steps: [10, 50, 100], interval: 1m}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: missing-canary}}
spec: {{agents: [reporter], tool: echo, rollout: {{canary: echo-9.9.9}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: descending}}
spec: {{agents: [reporter], tool: echo, rollout: {{canary: echo-1.3.0, steps: [50, 10]}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: same}}
spec: {{agents: [reporter], tool: echo, release: {{name: echo-1.3.0}}, rollout: {{canary: echo-1.3.0}}}}
"#,
        release("echo-1.2.0", "echo", "1.2.0"),
        release("echo-1.3.0", "echo", "1.3.0"),
    );
    // Equal weights may repeat, but not without end.
    let steps = vec!["50"; toolgrid_core::rollout::MAX_STEPS + 1].join(", ");
    let text = format!(
        "{text}---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: endless}}\n\
         spec: {{agents: [reporter], tool: echo, rollout: {{canary: echo-1.3.0, steps: [{steps}]}}}}\n"
    );
    let set = set_of(&text);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let artifacts = ready_artifacts(&set, "sha256:a");

    let snapshot = run(&set, &artifacts, &HashMap::new(), T0);
    let endless = &state(&snapshot, Kind::ToolBinding, "endless").ready;
    assert_eq!(endless.reason, Reason::InvalidSpec);
    assert!(
        endless.message.contains("101 steps; at most 100"),
        "{}",
        endless.message
    );
    let binding = &snapshot.bindings[&ObjectKey::new("default", "canaried")];
    // The stable release is the newest Ready one other than the canary.
    assert_eq!(binding.release.as_ref().unwrap().name, "echo-1.2.0");
    let rollout = binding.rollout.as_ref().expect("a canary");
    assert_eq!(rollout.canary.name, "echo-1.3.0");
    assert_eq!(
        rollout.weight(),
        10,
        "a new rollout starts at its first step"
    );
    let status = &state(&snapshot, Kind::ToolBinding, "canaried").status;
    assert_eq!(status["rollout"]["weight"], 10);
    assert_eq!(status["rollout"]["phase"], "Progressing");
    assert_eq!(status["rollout"]["stable"], "echo-1.2.0");
    let degraded = |snapshot: &Snapshot| {
        state(snapshot, Kind::ToolBinding, "canaried").status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Degraded")
            .cloned()
            .expect("a Degraded condition")
    };
    assert_eq!(degraded(&snapshot)["status"], "False");

    // A canary that is not a Ready release of the tool takes nothing; the binding serves.
    let missing = &snapshot.bindings[&ObjectKey::new("default", "missing-canary")];
    assert!(missing.is_ready() && missing.rollout.is_none());
    assert!(
        state(&snapshot, Kind::ToolBinding, "missing-canary")
            .ready
            .message
            .contains("canary echo-9.9.9 is not a Ready release"),
    );
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "descending")
            .ready
            .reason,
        Reason::InvalidSpec
    );
    assert_eq!(
        state(&snapshot, Kind::ToolBinding, "same").ready.reason,
        Reason::InvalidSpec
    );

    // Where the store says the rollout is: rolled back, Degraded with its figures.
    let mut progress = toolgrid_core::rollout::Progress::start(0);
    progress.phase = toolgrid_core::rollout::Phase::Aborted;
    progress.message = "rolled back at 10%: 30.0% errors".into();
    let rollouts = HashMap::from([(
        ObjectKey::new("default", "canaried"),
        toolgrid_core::rollout::Record {
            binding: ObjectKey::new("default", "canaried"),
            canary: "echo-1.3.0".into(),
            progress,
        },
    )]);
    let aborted = resolve(&ResolveInput {
        set: &set,
        artifacts: &artifacts,
        wasm: &HashMap::new(),
        previous: &previous_of(&snapshot),
        now: T1.parse().unwrap(),
        identities: None,
        source_reads: &Default::default(),
        rollouts: &rollouts,
        reuse: None,
    });
    let binding = &aborted.bindings[&ObjectKey::new("default", "canaried")];
    assert_eq!(binding.rollout.as_ref().unwrap().weight(), 0);
    let condition = degraded(&aborted);
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "CanaryRolledBack");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("30.0% errors")
    );
}

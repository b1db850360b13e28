use super::*;

#[test]
fn releases_say_why_they_are_not_ready() {
    let text = format!(
        "{BASE}{}{}{}{}{}",
        release("ghost-1.0.0", "ghost", "1.0.0"),
        release("echo-bad", "echo", "one"),
        release("echo-1.0.0", "echo", "1.0.0"),
        release("echo-again", "echo", "1.0.0"),
        "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {name: echo-2.0.0}\nspec: {tool: echo, version: 2.0.0, pool: gpu, artifact: {file: x.wasm}}\n",
    );
    let set = set_of(&text);
    let mut artifacts = ready_artifacts(&set, "sha256:a");
    artifacts.insert(
        ObjectKey::new("default", "echo-1.0.0"),
        ArtifactOutcome::Failed {
            reason: Reason::InvalidArtifact,
            message: "bad magic".into(),
        },
    );
    let snapshot = run(&set, &artifacts, &HashMap::new(), T0);
    let reason = |name: &str| state(&snapshot, Kind::ToolRelease, name).ready.reason;
    assert_eq!(reason("ghost-1.0.0"), Reason::UnknownTool);
    assert_eq!(reason("echo-bad"), Reason::InvalidSpec);
    assert!(
        state(&snapshot, Kind::ToolRelease, "echo-bad")
            .ready
            .message
            .contains("spec.version")
    );
    assert_eq!(reason("echo-1.0.0"), Reason::InvalidArtifact);
    assert_eq!(reason("echo-again"), Reason::ArtifactReady);
    assert_eq!(reason("echo-2.0.0"), Reason::UnknownPool);
    assert_eq!(
        snapshot
            .tool("default", "echo")
            .unwrap()
            .release
            .as_ref()
            .unwrap()
            .name,
        "echo-again"
    );
}

#[test]
fn two_releases_of_one_version_conflict() {
    let text = format!(
        "{BASE}{}{}",
        release("a", "echo", "1.0.0"),
        release("b", "echo", "1.0.0")
    );
    let set = set_of(&text);
    let snapshot = run_ready(&set, &HashMap::new(), T0);
    assert_eq!(
        state(&snapshot, Kind::ToolRelease, "a").ready.reason,
        Reason::ArtifactReady
    );
    assert_eq!(
        state(&snapshot, Kind::ToolRelease, "b").ready.reason,
        Reason::DuplicateVersion
    );
}

#[test]
fn a_ready_release_is_immutable() {
    let text = format!("{BASE}{}", release("echo-1.0.0", "echo", "1.0.0"));
    let set = set_of(&text);
    let first = run_ready(&set, &HashMap::new(), T0);
    let previous = previous_of(&first);
    let second = run(&set, &ready_artifacts(&set, "sha256:b"), &previous, T1);
    let release = state(&second, Kind::ToolRelease, "echo-1.0.0");
    assert_eq!(release.ready.reason, Reason::ImmutableRelease);
    assert_eq!(
        release.status["digest"], "sha256:a",
        "the status keeps the digest it was Ready with"
    );
    assert!(second.tool("default", "echo").unwrap().release.is_none());
}

#[test]
fn declared_egress_headers_are_checked() {
    let with_headers = |name: &str, headers: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\nspec: {{tool: echo, version: \"1.0.{}\", artifact: {{file: x.wasm}}, network: {{egress: [{{host: api.example.com, headers: {headers}}}]}}}}\n",
            name.len()
        )
    };
    let text = format!(
        "{BASE}{}{}{}{}",
        with_headers("fine", r#"{authorization: "Bearer ${secret:t}"}"#),
        with_headers("malformed", r#"{authorization: "Bearer ${secret:t"}"#),
        with_headers("host-owned", r#"{idempotency-key: "x"}"#),
        with_headers("bad-name-xx", r#"{"a b": "x"}"#),
    );
    let set = set_of(&text);
    let snapshot = run_ready(&set, &HashMap::new(), T0);
    let ready = |name: &str| state(&snapshot, Kind::ToolRelease, name).ready.clone();
    assert!(ready("fine").status, "{:?}", ready("fine"));
    for name in ["malformed", "host-owned", "bad-name-xx"] {
        let ready = ready(name);
        assert_eq!(ready.reason, Reason::InvalidSpec, "{name}: {ready:?}");
        assert!(
            ready.message.contains("spec.network.egress[0].headers."),
            "{name}: {}",
            ready.message
        );
    }
}

/// A release whose `python` command runs its own artifact: the command's calls run its
/// digest with its files and limits (the release's, with the command's in their place);
/// every other command runs the release's. A command the Tool lacks, one named twice and
/// one with no digest are each refused with the field that is wrong.
#[test]
fn a_command_runs_its_own_artifact_with_its_files_and_limits() {
    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    let tool = "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {name: code}\nspec: {effect: read, commands: [{name: run}, {name: python}]}\n";
    let with = |name: &str, commands: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\nspec: {{tool: code, version: \"1.0.0\", artifact: {{file: js.wasm}}, limits: {{memory: 96Mi, cpuTime: 10s}}, commands: {commands}}}\n"
        )
    };
    let good = with(
        "code-1",
        &format!(
            "[{{name: python, artifact: {{file: py.wasm, digest: \"{D}\"}}, limits: {{memory: 1Gi}}}}]"
        ),
    );
    let set = set_of(&format!("{BASE}{tool}{good}"));
    let snapshot = run_ready(&set, &HashMap::new(), T0);
    let ready = state(&snapshot, Kind::ToolRelease, "code-1");
    assert_eq!(
        ready.ready.reason,
        Reason::ArtifactReady,
        "{}",
        ready.ready.message
    );
    assert!(
        ready
            .ready
            .message
            .contains(&format!("command python runs module {D}"))
    );
    let release = &snapshot.releases[&ObjectKey::new("default", "code-1")];
    let python = release.run_of("python");
    assert_eq!(python.digest, D);
    assert_eq!(python.limits.memory_bytes, 1 << 30);
    assert_eq!(python.limits.cpu_time, std::time::Duration::from_secs(10));
    let js = release.run_of("run");
    assert_eq!(js.digest, "sha256:a");
    assert_eq!(js.limits.memory_bytes, 96 << 20);
    let digests: Vec<&str> = release.digests().collect();
    assert_eq!(digests, ["sha256:a", D]);

    let bad = [
        (
            "unknown",
            format!("[{{name: ruby, artifact: {{file: r.wasm, digest: \"{D}\"}}}}]"),
            "spec.commands[0].name",
        ),
        (
            "twice",
            format!(
                "[{{name: python, artifact: {{file: p.wasm, digest: \"{D}\"}}}}, {{name: python, artifact: {{file: q.wasm, digest: \"{D}\"}}}}]"
            ),
            "spec.commands[1].name",
        ),
        (
            "unpinned",
            "[{name: python, artifact: {file: p.wasm}}]".to_string(),
            "spec.commands[0].artifact.digest",
        ),
        (
            "limits",
            format!(
                "[{{name: python, artifact: {{file: p.wasm, digest: \"{D}\"}}, limits: {{cpuTime: 0s}}}}]"
            ),
            "spec.commands[0].limits.cpuTime",
        ),
    ];
    let text: String = bad
        .iter()
        .map(|(name, commands, _)| with(name, commands))
        .collect();
    let set = set_of(&format!("{BASE}{tool}{text}"));
    let snapshot = run_ready(&set, &HashMap::new(), T0);
    for (name, _, field) in bad {
        let ready = &state(&snapshot, Kind::ToolRelease, name).ready;
        assert_eq!(
            ready.reason,
            Reason::InvalidSpec,
            "{name}: {}",
            ready.message
        );
        assert!(ready.message.contains(field), "{name}: {}", ready.message);
    }
}

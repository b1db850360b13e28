use super::*;

#[test]
fn the_newest_ready_release_serves_the_tool() {
    let text = format!(
        "{BASE}{}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        release("echo-1.10.0", "echo", "1.10.0")
    );
    let set = set_of(&text);
    let snapshot = run_ready(&set, &HashMap::new(), T0);
    let tool = snapshot.tool("default", "echo").unwrap();
    assert_eq!(tool.release.as_ref().unwrap().name, "echo-1.10.0");
    let status = &state(&snapshot, Kind::Tool, "echo").status;
    assert_eq!(status["release"], "echo-1.10.0");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["conditions"][0]["type"], "Ready");
    assert_eq!(status["conditions"][0]["status"], "True");
    let release = state(&snapshot, Kind::ToolRelease, "echo-1.2.0");
    assert_eq!(release.status["digest"], "sha256:a");
    assert_eq!(snapshot.pools.values().next().unwrap().desired_workers, 2);
}

#[test]
fn each_tool_is_served_by_its_own_newest_release() {
    let other = "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {name: other}\nspec: {effect: read, commands: [{name: default}]}\n";
    let text = format!(
        "{BASE}{other}{}{}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        release("other-9.0.0", "other", "9.0.0"),
        release("other-1.0.0", "other", "1.0.0"),
    );
    let snapshot = run_ready(&set_of(&text), &HashMap::new(), T0);
    let release_of = |name: &str| {
        let tool = snapshot.tool("default", name).unwrap();
        tool.release.as_ref().unwrap().name.clone()
    };
    assert_eq!(release_of("echo"), "echo-1.2.0");
    assert_eq!(release_of("other"), "other-9.0.0");
}

#[test]
fn an_unchanged_tool_keeps_its_compiled_commands_and_a_changed_one_is_compiled_again() {
    let text = format!("{BASE}{}", release("echo-1.0.0", "echo", "1.0.0"));
    let set = set_of(&text);
    let first = run_ready(&set, &HashMap::new(), T0);
    let command =
        |snapshot: &Snapshot| snapshot.tool("default", "echo").unwrap().commands[0].clone();
    let reusing = |set: &ResourceSet| {
        let artifacts = ready_artifacts(set, "sha256:a");
        run_reusing(set, &artifacts, &previous_of(&first), T1, Some(&first))
    };

    // Unchanged: the same compiled command, and the same round as without reuse.
    let reused = reusing(&set);
    assert!(std::sync::Arc::ptr_eq(&command(&reused), &command(&first)));
    let fresh = run_ready(&set, &previous_of(&first), T1);
    assert_eq!(reused.resources, fresh.resources);
    let tool = reused.tool("default", "echo").unwrap();
    assert_eq!(tool.release.as_ref().unwrap().name, "echo-1.0.0");

    // Changed: compiled again from the new spec.
    let changed = set_of(&text.replace(
        "commands: [{name: default}]",
        "timeout: 7s, commands: [{name: default, positional: [{name: x, schema: {type: string}}]}]",
    ));
    let next = reusing(&changed);
    assert!(!std::sync::Arc::ptr_eq(&command(&next), &command(&first)));
    let tool = next.tool("default", "echo").unwrap();
    assert_eq!(tool.timeout, std::time::Duration::from_secs(7));
    assert!(
        tool.commands[0].args_schema()["properties"]
            .get("x")
            .is_some()
    );
    assert_eq!(state(&next, Kind::Tool, "echo").generation, 2);
}

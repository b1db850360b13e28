use super::*;

#[test]
fn the_newest_ready_release_serves_the_tool() {
    let text = format!(
        "{BASE}{}{}",
        release("echo-1.2.0", "echo", "1.2.0"),
        release("echo-1.10.0", "echo", "1.10.0")
    );
    let set = set_of(&text);
    let snapshot = run(
        &set,
        &ready_artifacts(&set, "sha256:a"),
        &HashMap::new(),
        T0,
    );
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

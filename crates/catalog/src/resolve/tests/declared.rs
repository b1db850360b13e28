use super::*;

#[test]
fn generations_and_transition_times_follow_changes() {
    let text = format!("{BASE}{}", release("echo-1.0.0", "echo", "1.0.0"));
    let set = set_of(&text);
    let artifacts = ready_artifacts(&set, "sha256:a");
    let first = run(&set, &artifacts, &HashMap::new(), T0);
    let unchanged = run(&set, &artifacts, &previous_of(&first), T1);
    let tool = state(&unchanged, Kind::Tool, "echo");
    assert_eq!(tool.generation, 1);
    assert_eq!(
        tool.status["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );

    let changed = set_of(&format!(
        "{}{}",
        BASE.replace("effect: read", "effect: write"),
        release("echo-1.0.0", "echo", "1.0.0")
    ));
    let third = run(&changed, &artifacts, &previous_of(&unchanged), T1);
    let tool = state(&third, Kind::Tool, "echo");
    assert_eq!(tool.generation, 2);
    assert_eq!(tool.status["observedGeneration"], 2);
    assert_eq!(tool.status["conditions"][0]["observedGeneration"], 2);
    assert_eq!(
        tool.status["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z",
        "still Ready"
    );

    // A tool losing its release transitions.
    let bare = set_of(BASE);
    let fourth = run(&bare, &HashMap::new(), &previous_of(&third), T1);
    let tool = state(&fourth, Kind::Tool, "echo");
    assert_eq!(tool.ready.reason, Reason::NoReadyRelease);
    assert_eq!(
        tool.status["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:05:00Z"
    );
}

#[test]
fn a_name_declared_twice_serves_neither() {
    let mut set = set_of(BASE);
    load_text(Path::new("other.yaml"), BASE, &mut set);
    let snapshot = run(&set, &HashMap::new(), &HashMap::new(), T0);
    let tool = state(&snapshot, Kind::Tool, "echo");
    assert_eq!(tool.ready.reason, Reason::DuplicateName);
    assert!(tool.ready.message.contains("m.yaml") && tool.ready.message.contains("other.yaml"));
    assert!(snapshot.tool("default", "echo").is_none());
    assert!(snapshot.pools.is_empty());
}

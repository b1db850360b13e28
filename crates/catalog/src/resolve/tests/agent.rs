//! Agents: an OAuth subject belongs to one Agent of a namespace, the older one.

use super::*;
use crate::resolve::agent::later_oauth_claims;
use toolgrid_api::Agent;

fn agent(namespace: &str, name: &str, created: Option<&str>, subjects: &[&str]) -> String {
    let created = created
        .map(|t| format!(", creationTimestamp: \"{t}\""))
        .unwrap_or_default();
    let subjects = subjects
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: {name}, namespace: {namespace}{created}}}\nspec: {{oauthSubjects: [{subjects}], permissions: [{{tools: [\"*\"]}}]}}\n"
    )
}

fn later(text: &str) -> Vec<(String, String, String)> {
    let set = set_of(text);
    let agents: Vec<(ObjectKey, &Agent)> = set
        .agents
        .iter()
        .map(|a| {
            let meta = &a.object.metadata;
            (
                ObjectKey::new(
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
                &a.object,
            )
        })
        .collect();
    later_oauth_claims(agents.iter().map(|(k, a)| (k, *a)))
        .into_iter()
        .map(|(key, (subject, owner))| (key.to_string(), subject, owner.to_string()))
        .collect()
}

#[test]
fn the_older_agent_keeps_a_subject_within_its_namespace() {
    // By creation time: the newer one loses, whatever its name.
    let text = agent("team-a", "aaa", Some("2026-02-01T00:00:00Z"), &["alice"])
        + &agent(
            "team-a",
            "zzz",
            Some("2026-01-01T00:00:00Z"),
            &["alice", "bob"],
        );
    assert_eq!(
        later(&text),
        vec![("team-a/aaa".into(), "alice".into(), "team-a/zzz".into())]
    );
    // Without timestamps (a manifest directory), by name.
    let text = agent("team-a", "b", None, &["carol"]) + &agent("team-a", "a", None, &["carol"]);
    assert_eq!(
        later(&text),
        vec![("team-a/b".into(), "carol".into(), "team-a/a".into())]
    );
    // The same subject in another namespace is another user: no duplicate.
    let text = agent("team-a", "x", None, &["alice"]) + &agent("team-b", "x", None, &["alice"]);
    assert_eq!(later(&text), vec![]);
    // A loser claims none of its subjects, so a third Agent listing one of them is not
    // blamed on it.
    let text = agent("ns", "a", None, &["alice"])
        + &agent("ns", "b", None, &["alice", "dave"])
        + &agent("ns", "c", None, &["dave"]);
    assert_eq!(
        later(&text),
        vec![("ns/b".into(), "alice".into(), "ns/a".into())]
    );
}

#[test]
fn a_duplicate_subject_is_not_ready_on_the_newer_agent_only() {
    let text =
        agent("default", "first", None, &["alice"]) + &agent("default", "second", None, &["alice"]);
    let snapshot = run(&set_of(&text), &HashMap::new(), &HashMap::new(), T0);
    let first = state(&snapshot, Kind::Agent, "first");
    assert_eq!(
        first.ready.reason,
        Reason::Resolved,
        "{}",
        first.ready.message
    );
    let second = state(&snapshot, Kind::Agent, "second");
    assert!(!second.ready.status);
    assert_eq!(second.ready.reason, Reason::DuplicateOAuthSubject);
    assert!(
        second.ready.message.contains("first"),
        "{}",
        second.ready.message
    );
    assert!(
        snapshot
            .agents
            .contains_key(&ObjectKey::new("default", "first"))
    );
    assert!(
        !snapshot
            .agents
            .contains_key(&ObjectKey::new("default", "second"))
    );
}

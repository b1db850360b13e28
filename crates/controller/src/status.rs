//! Status decisions of the controller as plain functions: what to write, when a change is
//! worth an event, and a pool's live status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::core::object::HasStatus;
use serde_json::{Value, json};
use toolgrid_api::WorkerPoolStatus;
use toolgrid_api::conditions;
use toolgrid_catalog::ResourceState;
use toolgrid_catalog::pool_health::pool_ready;

/// The field manager of every write the controller makes (server-side apply).
pub const MANAGER: &str = "toolgrid-controller";

/// An object's status as JSON (null when it has none), read through the `HasStatus` that
/// kube-derive writes for each kind, without the rest of the object: serializing each whole
/// object (its spec, every command's schemas) to read its status was a tenth of a resolve's
/// time with 1,000 tools.
pub fn status_json<K>(object: &K) -> Value
where
    K: HasStatus,
    K::Status: serde::Serialize,
{
    object
        .status()
        .and_then(|status| serde_json::to_value(status).ok())
        .unwrap_or(Value::Null)
}

/// The status to write, or `None` when the object already has it.
pub fn status_change(current: &Value, desired: &Value) -> Option<Value> {
    (current != desired).then(|| desired.clone())
}

/// The server-side apply body that sets only the status (an apply names its object).
pub fn status_patch(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    status: &Value,
) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    })
}

fn ready_of(status: &Value) -> Option<Condition> {
    let conditions: Vec<Condition> =
        serde_json::from_value(status.get("conditions")?.clone()).ok()?;
    conditions::ready(&conditions).cloned()
}

/// A change of the Ready condition's status: (now ready, reason, message).
pub fn ready_transition(current: &Value, desired: &Value) -> Option<(bool, String, String)> {
    let after = ready_of(desired)?;
    let before = ready_of(current).map(|c| c.status);
    if before.as_deref() == Some(after.status.as_str()) {
        return None;
    }
    Some((after.status == "True", after.reason, after.message))
}

/// A binding's canary rolled back since `current` (`Degraded` turned `True`): its reason
/// and message, with the figures.
pub fn rolled_back(current: &Value, desired: &Value) -> Option<(String, String)> {
    let degraded = |status: &Value| -> Option<Condition> {
        let conditions: Vec<Condition> =
            serde_json::from_value(status.get("conditions")?.clone()).ok()?;
        conditions
            .into_iter()
            .find(|c| c.type_ == conditions::DEGRADED)
    };
    let after = degraded(desired).filter(|c| c.status == "True")?;
    if degraded(current).is_some_and(|c| c.status == "True") {
        return None;
    }
    Some((after.reason, after.message))
}

pub use toolgrid_catalog::pool_health::LivePool;

/// A pool's status: the resolved one, with the live counts, and Ready as
/// [`pool_ready`] decides (the same as `toolgrid get pools`).
pub fn pool_status(
    resolved: &ResourceState,
    current: &Value,
    live: LivePool,
    now: Timestamp,
) -> Value {
    let mut status: WorkerPoolStatus =
        serde_json::from_value(resolved.status.clone()).unwrap_or_default();
    status.desired_workers = live.desired;
    status.ready_workers = live.ready;
    status.attached_workers = live.attached;
    status.busy_slots = live.busy;
    status.queued_calls = live.queued;
    if resolved.ready.status {
        let current: Option<Vec<Condition>> = current
            .get("conditions")
            .filter(|c| !c.is_null())
            .and_then(|c| serde_json::from_value(c.clone()).ok());
        match current {
            // A fresh leader knows no workers yet: keep what the last leader said rather
            // than flapping Ready to False and back while workers re-attach.
            Some(conditions) if live.may_be_reattaching() => status.conditions = conditions,
            current => {
                let mut conditions = current.unwrap_or_default();
                conditions::apply_ready(
                    &mut conditions,
                    &pool_ready(&live),
                    Some(resolved.generation),
                    now,
                );
                status.conditions = conditions;
            }
        }
    }
    serde_json::to_value(&status).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollback_is_told_once() {
        let status = |degraded: &str| {
            json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Resolved", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Degraded", "status": degraded, "reason": "CanaryRolledBack",
                "message": "rolled back at 10%: 30.0% errors", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        };
        assert_eq!(
            rolled_back(&status("False"), &status("True")),
            Some((
                "CanaryRolledBack".into(),
                "rolled back at 10%: 30.0% errors".into()
            ))
        );
        assert_eq!(
            rolled_back(&json!({}), &status("True")).map(|r| r.0),
            Some("CanaryRolledBack".into())
        );
        assert_eq!(rolled_back(&status("True"), &status("True")), None);
        assert_eq!(rolled_back(&status("False"), &status("False")), None);
    }
    use toolgrid_api::Kind;
    use toolgrid_api::conditions::{Desired, Reason};
    use toolgrid_catalog::ResourceId;

    fn resolved(ready: bool) -> ResourceState {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let desired = if ready {
            Desired::ready(Reason::Resolved, "2 workers of 16 slots")
        } else {
            Desired::not_ready(
                Reason::InvalidSpec,
                "spec: set replicas or autoscale, not both",
            )
        };
        let mut conditions = Vec::new();
        conditions::apply(&mut conditions, &desired, Some(3), now);
        ResourceState {
            id: ResourceId {
                kind: Kind::WorkerPool,
                key: toolgrid_core::ids::ObjectKey::new("team", "default"),
            },
            source: "the cluster".into(),
            generation: 3,
            spec_hash: String::new(),
            ready: desired,
            status: json!({"conditions": conditions, "observedGeneration": 3, "desiredWorkers": 2}),
            columns: Vec::new(),
        }
    }

    #[test]
    fn writes_only_what_changed() {
        let status = json!({"observedGeneration": 1});
        assert_eq!(status_change(&status, &status), None);
        assert_eq!(status_change(&json!(null), &status), Some(status.clone()));
        assert_eq!(
            status_patch("toolgrid.dev/v1alpha1", "Tool", "team", "echo", &status),
            json!({
                "apiVersion": "toolgrid.dev/v1alpha1",
                "kind": "Tool",
                "metadata": {"name": "echo", "namespace": "team"},
                "status": {"observedGeneration": 1}
            })
        );
    }

    #[test]
    fn pools_are_ready_with_a_worker_attached() {
        let t1: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let live = LivePool {
            desired: 2,
            ready: 0,
            attached: 0,
            busy: 0,
            queued: 4,
            reattaching: false,
        };
        let waiting = pool_status(&resolved(true), &json!(null), live, t1);
        assert_eq!(waiting["conditions"][0]["reason"], "NoWorkers");
        assert_eq!(waiting["queuedCalls"], 4);
        let attached = pool_status(
            &resolved(true),
            &waiting,
            LivePool {
                attached: 2,
                ..live
            },
            t1,
        );
        assert_eq!(attached["conditions"][0]["status"], "True");
        assert_eq!(attached["attachedWorkers"], 2);
        let (ready, reason, _) = ready_transition(&waiting, &attached).expect("a transition");
        assert!(ready);
        assert_eq!(reason, "WorkersAttached");
        assert_eq!(ready_transition(&attached, &attached), None);
        let invalid = pool_status(
            &resolved(false),
            &json!(null),
            LivePool {
                attached: 2,
                ..live
            },
            t1,
        );
        assert_eq!(
            invalid["conditions"][0]["reason"], "InvalidSpec",
            "an invalid pool stays not ready"
        );
    }

    #[test]
    fn a_new_leader_keeps_pool_conditions_while_workers_reattach() {
        let t1: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let live = LivePool {
            desired: 2,
            attached: 2,
            ..LivePool::default()
        };
        let was_ready = pool_status(&resolved(true), &json!(null), live, t1);
        assert_eq!(was_ready["conditions"][0]["status"], "True");
        let none_yet = LivePool {
            attached: 0,
            reattaching: true,
            ..live
        };
        let kept = pool_status(&resolved(true), &was_ready, none_yet, t1);
        assert_eq!(kept["conditions"], was_ready["conditions"]);
        assert_eq!(ready_transition(&was_ready, &kept), None, "no event either");
        let fresh = pool_status(&resolved(true), &json!(null), none_yet, t1);
        assert_eq!(
            fresh["conditions"][0]["reason"], "NoWorkers",
            "with nothing to keep, the pool says what it sees"
        );
        let grace_over = LivePool {
            reattaching: false,
            ..none_yet
        };
        let lost = pool_status(&resolved(true), &was_ready, grace_over, t1);
        assert_eq!(lost["conditions"][0]["reason"], "NoWorkers");
    }

    /// The status read alone is what the whole object's JSON holds under `status`.
    #[test]
    fn an_objects_status_json_is_the_status_of_its_whole_json() {
        let mut release: toolgrid_api::ToolRelease = serde_json::from_value(serde_json::json!({
            "apiVersion": "toolgrid.dev/v1alpha1",
            "kind": "ToolRelease",
            "metadata": {"name": "t-1.0.0", "namespace": "default"},
            "spec": {"tool": "t", "version": "1.0.0",
                     "artifact": {"configMap": {"name": "a", "key": "t.wasm"}}},
        }))
        .unwrap();
        let whole = |r: &toolgrid_api::ToolRelease| {
            serde_json::to_value(r)
                .unwrap()
                .get("status")
                .cloned()
                .unwrap_or(serde_json::Value::Null)
        };
        assert_eq!(status_json(&release), serde_json::Value::Null);
        assert_eq!(status_json(&release), whole(&release));
        release.status = Some(
            serde_json::from_value(serde_json::json!({
                "observedGeneration": 3,
                "digest": "sha256:ab",
                "conditions": [{"type": "Ready", "status": "True", "reason": "ArtifactReady",
                                "message": "ok", "lastTransitionTime": "2026-12-06T00:00:00Z",
                                "observedGeneration": 3}],
            }))
            .unwrap(),
        );
        assert_eq!(status_json(&release), whole(&release));
        assert_eq!(status_json(&release)["digest"], "sha256:ab");
    }
}

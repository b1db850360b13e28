//! Status conditions in the Kubernetes shape, shared by every kind.
//!
//! `lastTransitionTime` moves only when a condition's status changes, so that Argo CD,
//! Flux and `kubectl wait` see stable conditions across repeated reconciles.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition every kind carries.
pub const READY: &str = "Ready";

/// One condition as a reconcile decides it, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    /// CamelCase, machine-readable.
    pub reason: String,
    pub message: String,
}

impl Desired {
    pub fn ready(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: true,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn not_ready(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Merges `desired` into `conditions`: a new status gets `now` as its transition time, an
/// unchanged status keeps the old one while reason, message and generation are refreshed.
pub fn apply(
    conditions: &mut Vec<Condition>,
    desired: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = status_str(desired.status);
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = Time(now);
                existing.status = status.to_string();
            }
            existing.reason = desired.reason.clone();
            existing.message = desired.message.clone();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: desired.type_.to_string(),
            status: status.to_string(),
            reason: desired.reason.clone(),
            message: desired.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// The `Ready` condition, if present.
pub fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == READY)
}

/// True when `Ready` is `True`.
pub fn is_ready(conditions: &[Condition]) -> bool {
    ready(conditions).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        apply(
            &mut conditions,
            &Desired::not_ready("Pending", "waiting"),
            Some(1),
            t0,
        );
        apply(
            &mut conditions,
            &Desired::not_ready("StillPending", "still"),
            Some(2),
            t1,
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[0].reason, "StillPending");
        assert_eq!(conditions[0].observed_generation, Some(2));
        apply(
            &mut conditions,
            &Desired::ready("Resolved", "ok"),
            Some(2),
            t2,
        );
        assert_eq!(conditions[0].last_transition_time, Time(t2));
        assert!(is_ready(&conditions));
    }
}

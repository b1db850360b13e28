//! Status conditions in the Kubernetes shape, shared by every kind.
//!
//! Every kind carries `Ready`. Next to it, the kstatus pair that Flux's health checks (and
//! kpt, cli-utils) read for custom resources: `Reconciling=True` while the object is on its
//! way to Ready (waiting for an artifact, a referenced object, workers), `Stalled=True`
//! when it cannot get there without a change to it (an invalid spec, a digest that does not
//! match). Both are removed once the object is Ready.
//!
//! `lastTransitionTime` moves only when a condition's status changes, so that Argo CD,
//! Flux and `kubectl wait` see stable conditions across repeated reconciles.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition every kind carries.
pub const READY: &str = "Ready";
/// kstatus: the object is not Ready yet, and the controller is still working toward it.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the object cannot become Ready until it (or its artifact) changes.
pub const STALLED: &str = "Stalled";
/// A binding's canary was rolled back (`True`, with the figures), or is healthy so far.
pub const DEGRADED: &str = "Degraded";

/// Declares [`Reason`]: each variant's name is its CamelCase string, and whether it is
/// stalled is said once, next to it.
macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident: $kind:ident,)*) => {
        /// Why a resource is (or is not) Ready: the condition's machine-readable reason.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $($(#[$doc])* $name,)*
        }

        impl Reason {
            /// Every reason.
            pub const ALL: &'static [Reason] = &[$(Reason::$name,)*];

            /// The CamelCase name written to the condition.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)*
                }
            }

            /// Whether `Ready=False` with this reason is a fault of the object itself, so only
            /// a change to it helps (kstatus `Stalled`); otherwise it waits for something (an
            /// artifact being loaded, a referenced object, workers) and is `Reconciling`.
            pub fn stalled(self) -> bool {
                match self {
                    $(Reason::$name => reasons!(@stalled $kind),)*
                }
            }
        }
    };
    (@stalled stalled) => { true };
    (@stalled waiting) => { false };
    (@stalled ready) => { false };
}

reasons! {
    // Ready=True
    /// A pool, agent, middleware or binding whose spec and references check out.
    Resolved: ready,
    /// A release whose artifact is loaded and checked.
    ArtifactReady: ready,
    /// A tool with a Ready release.
    Released: ready,
    /// A pool with workers attached.
    WorkersAttached: ready,
    /// A pool that wants no workers.
    ScaledToZero: ready,
    /// `Degraded=False`: the binding's canary is healthy so far (or promoted).
    CanaryHealthy: ready,
    /// `Degraded=True`: the binding's canary was rolled back on its error rate (or by an
    /// operator); every new call runs the stable release.
    CanaryRolledBack: ready,
    /// A ToolSource whose upstream was read: its tools are callable.
    SourceRead: ready,
    // Ready=False, waiting for something else: Reconciling
    ArtifactPending: waiting,
    ArtifactNotFound: waiting,
    ToolNotValid: waiting,
    UnknownTool: waiting,
    UnknownPool: waiting,
    UnknownAgent: waiting,
    UnknownMiddleware: waiting,
    /// A binding names a Middleware that is not Ready, or an `enforce: true` Middleware of
    /// its namespace is not Ready (the chain fails closed).
    MiddlewareNotReady: waiting,
    NoReadyRelease: waiting,
    NoMatchingRelease: waiting,
    MissingServiceAccount: waiting,
    MissingSecret: waiting,
    MissingConfigMap: waiting,
    /// A binding lists a config key its agent's ConfigMap does not have.
    MissingConfigKey: waiting,
    /// A binding lists a secret key its agent's Secret does not have (or an Agent's
    /// `tokenSecretRef` names a key its Secret does not have).
    MissingSecretKey: waiting,
    NoWorkers: waiting,
    /// A ToolSource's upstream refused, was not reached, did not answer in time, answered
    /// garbage or too much: it is read again later.
    UpstreamRefused: waiting,
    UpstreamUnreachable: waiting,
    UpstreamTimeout: waiting,
    UpstreamGarbage: waiting,
    UpstreamTooLarge: waiting,
    /// A ToolSource that has not been read yet.
    SourcePending: waiting,
    // Ready=False, only a change to the object helps: Stalled
    InvalidSpec: stalled,
    DuplicateName: stalled,
    /// An Agent lists an OAuth subject that an older Agent of its namespace already lists
    /// (the older keeps the user; this one serves no one until the subject is removed).
    DuplicateOAuthSubject: stalled,
    DuplicateVersion: stalled,
    ImmutableRelease: stalled,
    InvalidArtifact: stalled,
    InvalidArtifactFile: stalled,
    InvalidArtifactSource: stalled,
    InvalidDigest: stalled,
    /// A release's `spec.files` is invalid: too many, a bad or repeated path, no digest.
    InvalidReleaseFile: stalled,
    DigestMismatch: stalled,
    UnsupportedSource: stalled,
    /// An artifact URL (or a redirect) names a host outside the controller's
    /// `--artifact-hosts`.
    ArtifactHostNotAllowed: stalled,
    /// An artifact URL's host (or a redirect's) is or resolves to a loopback, private,
    /// link-local or other non-public address, and the controller was not started with
    /// `--artifact-allow-private`.
    ArtifactAddressRestricted: stalled,
    /// A Middleware with a CEL expression that does not compile (the message is the
    /// compiler's).
    InvalidExpression: stalled,

    /// A binding's release declares egress headers that refer to a secret key the binding
    /// makes neither readable nor revealable (`network.egress[].headers`).
    UngrantedSecretReference: stalled,
    /// A ToolSource's OpenAPI document is not OpenAPI 3.0 or 3.1, or does not parse.
    InvalidDocument: stalled,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Reason {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reason::ALL
            .iter()
            .copied()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a toolgrid condition reason"))
    }
}

/// One condition as a reconcile decides it, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: Reason,
    pub message: String,
}

impl Desired {
    pub fn ready(reason: Reason, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: true,
            reason,
            message: message.into(),
        }
    }

    pub fn not_ready(reason: Reason, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

impl Desired {
    /// A binding's `Degraded` condition: `true` when its canary was rolled back.
    pub fn degraded(status: bool, reason: Reason, message: impl Into<String>) -> Self {
        Desired {
            type_: DEGRADED,
            status,
            reason,
            message: message.into(),
        }
    }
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
            existing.reason = desired.reason.to_string();
            existing.message = desired.message.clone();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: desired.type_.to_string(),
            status: status.to_string(),
            reason: desired.reason.to_string(),
            message: desired.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// Merges a `Ready` decision and the kstatus pair that follows from it: `Stalled` or
/// `Reconciling` (with Ready's reason and message) while not Ready, neither once Ready.
pub fn apply_ready(
    conditions: &mut Vec<Condition>,
    ready: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) {
    apply(conditions, ready, generation, now);
    let kstatus = match (ready.status, ready.reason.stalled()) {
        (true, _) => None,
        (false, true) => Some(STALLED),
        (false, false) => Some(RECONCILING),
    };
    conditions.retain(|c| {
        !(c.type_ == RECONCILING || c.type_ == STALLED) || Some(c.type_.as_str()) == kstatus
    });
    if let Some(type_) = kstatus {
        let desired = Desired {
            type_,
            status: true,
            reason: ready.reason,
            message: ready.message.clone(),
        };
        apply(conditions, &desired, generation, now);
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
            &Desired::not_ready(Reason::ArtifactPending, "waiting"),
            Some(1),
            t0,
        );
        apply(
            &mut conditions,
            &Desired::not_ready(Reason::ArtifactNotFound, "still"),
            Some(2),
            t1,
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[0].reason, "ArtifactNotFound");
        assert_eq!(conditions[0].observed_generation, Some(2));
        apply(
            &mut conditions,
            &Desired::ready(Reason::Resolved, "ok"),
            Some(2),
            t2,
        );
        assert_eq!(conditions[0].last_transition_time, Time(t2));
        assert!(is_ready(&conditions));
    }

    fn types(conditions: &[Condition]) -> Vec<(&str, &str, &str)> {
        conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }

    #[test]
    fn ready_carries_the_kstatus_pair() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        // Waiting for something else: Reconciling.
        let pending = Desired::not_ready(Reason::ArtifactPending, "loading");
        apply_ready(&mut conditions, &pending, Some(1), t0);
        assert_eq!(
            types(&conditions),
            [
                ("Ready", "False", "ArtifactPending"),
                ("Reconciling", "True", "ArtifactPending")
            ]
        );
        assert_eq!(conditions[1].message, "loading");
        assert_eq!(conditions[1].observed_generation, Some(1));
        // A fault of the object: Stalled replaces Reconciling; Ready keeps its transition time.
        let bad = Desired::not_ready(Reason::DigestMismatch, "sha256:aa is not sha256:bb");
        apply_ready(&mut conditions, &bad, Some(2), t1);
        assert_eq!(
            types(&conditions),
            [
                ("Ready", "False", "DigestMismatch"),
                ("Stalled", "True", "DigestMismatch")
            ]
        );
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[1].last_transition_time, Time(t1));
        // Still stalled at the next reconcile: nothing moves.
        apply_ready(&mut conditions, &bad, Some(2), t2);
        assert_eq!(conditions[1].last_transition_time, Time(t1));
        // Ready: both kstatus conditions go.
        apply_ready(
            &mut conditions,
            &Desired::ready(Reason::Resolved, "ok"),
            Some(3),
            t2,
        );
        assert_eq!(types(&conditions), [("Ready", "True", "Resolved")]);
    }

    #[test]
    fn reasons_are_camel_case_round_trip_and_know_whether_they_are_stalled() {
        for reason in Reason::ALL {
            let name = reason.as_str();
            assert!(
                name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                    && name.chars().all(|c| c.is_ascii_alphanumeric()),
                "{name}"
            );
            assert_eq!(name.parse::<Reason>(), Ok(*reason));
        }
        assert!(Reason::DigestMismatch.stalled());
        assert!(!Reason::ArtifactPending.stalled());
        assert!(!Reason::Resolved.stalled());
        assert!("Pending".parse::<Reason>().is_err());
    }

    #[test]
    fn the_docs_list_exactly_the_stalled_reasons() {
        let docs = include_str!("../../../docs/gitops.md");
        let row = docs
            .lines()
            .find(|l| l.starts_with("| `Stalled=True` |"))
            .expect("docs/gitops.md has the Stalled row");
        let listed: Vec<&str> = row.split('`').skip(3).step_by(2).collect();
        let stalled: Vec<&str> = Reason::ALL
            .iter()
            .filter(|r| r.stalled())
            .map(|r| r.as_str())
            .collect();
        assert_eq!(listed, stalled);
    }
}

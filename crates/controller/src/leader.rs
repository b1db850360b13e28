//! Leader election with a `coordination.k8s.io` Lease: only the leader reconciles and
//! schedules; a standby takes over when the leader stops renewing.
//!
//! Two leaders must never act at once. A standby takes the lease over once `duration` has
//! passed since its `renewTime`; the leader stops leading earlier, once no renewal has
//! succeeded for `renew_deadline` (counted from when that renewal started, which is no later
//! than the `renewTime` it wrote). Every round against the API has a deadline, so a call
//! that hangs cannot keep a leader leading: the round is abandoned and the leader steps
//! down. `duration - renew_deadline` is the safety margin (clock skew between replicas, the
//! time to stop). The decisions are pure ([`decide`], [`after_round`], [`LeaseSettings`]'s
//! deadlines) and take the time as an argument.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Who is electing, and how.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica (its pod name).
    pub identity: String,
    /// A lease not renewed for this long can be taken over.
    pub duration: Duration,
    /// A leader none of whose renewals succeeded for this long steps down; shorter than
    /// `duration` by a safety margin. It is also the deadline of every round.
    pub renew_deadline: Duration,
    /// How often the leader renews (and a standby tries); shorter than `renew_deadline`.
    pub renew_every: Duration,
}

impl LeaseSettings {
    /// The lease of `identity` with Kubernetes' usual timing: 15 s, step down after 10 s
    /// without a renewal, renew every 2 s.
    pub fn standard(name: String, namespace: String, identity: String) -> LeaseSettings {
        LeaseSettings {
            name,
            namespace,
            identity,
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
        }
    }

    /// The same lease with other timing, when it keeps two leaders from acting at once:
    /// renewals more often than the step-down deadline, which is shorter than the lease.
    pub fn with_timing(
        self,
        duration: Duration,
        renew_deadline: Duration,
        renew_every: Duration,
    ) -> Result<LeaseSettings, String> {
        if renew_every.is_zero() || renew_every >= renew_deadline || renew_deadline >= duration {
            return Err(format!(
                "the leader lease needs renewals ({renew_every:?}) more often than its \
                 step-down deadline ({renew_deadline:?}), which must be shorter than the lease \
                 ({duration:?})"
            ));
        }
        Ok(LeaseSettings {
            duration,
            renew_deadline,
            renew_every,
            ..self
        })
    }

    /// Until when `standing` lets us lead (None when following).
    pub fn lead_until(&self, standing: Standing) -> Option<Instant> {
        match standing {
            Standing::Following => None,
            Standing::Leading { renewed } => Some(renewed + self.renew_deadline),
        }
    }

    /// When a round that starts at `started` must be abandoned: a leader's by the time it
    /// must step down, a follower's `renew_deadline` after it started.
    pub fn round_deadline(&self, standing: Standing, started: Instant) -> Instant {
        self.lead_until(standing)
            .unwrap_or(started + self.renew_deadline)
    }

    /// `standing` at `now`: a leadership whose time is up has ended, round or no round.
    pub fn standing_at(&self, standing: Standing, now: Instant) -> Standing {
        match self.lead_until(standing) {
            Some(until) if now >= until => Standing::Following,
            _ => standing,
        }
    }
}

/// Where this replica stands, on its own monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Following,
    /// Leading on the strength of a round that started at `renewed` and wrote the lease
    /// (its `renewTime` is no earlier than that).
    Leading {
        renewed: Instant,
    },
}

impl Standing {
    pub fn leading(self) -> bool {
        matches!(self, Standing::Leading { .. })
    }
}

/// How a round against the API ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// We wrote the lease: created, renewed or taken over.
    Held,
    /// Another replica holds it, or wrote it first.
    Lost,
    /// The API failed, or did not answer by the round's deadline.
    Failed,
}

/// The standing after a round that started at `started` and ended at `now` with `round`.
/// A failed round leaves a leader leading only while its last renewal is recent enough; a
/// renewal that succeeded too late to count (past its deadline) does not make us lead.
pub fn after_round(
    settings: &LeaseSettings,
    standing: Standing,
    started: Instant,
    round: Round,
    now: Instant,
) -> Standing {
    match round {
        Round::Held if now < started + settings.renew_deadline => {
            Standing::Leading { renewed: started }
        }
        Round::Held | Round::Lost => Standing::Following,
        Round::Failed => settings.standing_at(standing, now),
    }
}

/// What to do about the lease.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nobody holds it: create it, held by us.
    Create(Lease),
    /// We hold it: renew it.
    Renew(Lease),
    /// Its holder stopped renewing: take it over.
    TakeOver(Lease),
    /// Someone else holds it.
    Follow { holder: String },
}

fn held_by(
    settings: &LeaseSettings,
    now: Timestamp,
    transitions: i32,
    acquired: Option<MicroTime>,
    meta: ObjectMeta,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(settings.name.clone()),
            namespace: Some(settings.namespace.clone()),
            ..meta
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(settings.identity.clone()),
            lease_duration_seconds: Some(settings.duration.as_secs().max(1) as i32),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// Decides from the lease as it is (None when absent) and the time now.
pub fn decide(current: Option<&Lease>, settings: &LeaseSettings, now: Timestamp) -> Decision {
    let Some(current) = current else {
        return Decision::Create(held_by(settings, now, 0, None, ObjectMeta::default()));
    };
    let spec = current.spec.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == settings.identity {
        return Decision::Renew(held_by(
            settings,
            now,
            transitions,
            spec.acquire_time,
            current.metadata.clone(),
        ));
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec
        .renew_time
        .map(|t| t.0)
        .or(spec.acquire_time.map(|t| t.0));
    let expired = holder.is_empty() || renewed.is_none_or(|t| t + duration < now);
    if expired {
        Decision::TakeOver(held_by(
            settings,
            now,
            transitions + 1,
            None,
            current.metadata.clone(),
        ))
    } else {
        Decision::Follow { holder }
    }
}

/// Runs the election against the API.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, settings: LeaseSettings) -> Self {
        LeaderElector { api, settings }
    }

    /// One round: acquires or renews the lease if it can; true while we lead.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.settings.name).await?;
        let decision = decide(current.as_ref(), &self.settings, Timestamp::now());
        let written = match decision {
            Decision::Follow { holder } => {
                tracing::debug!(%holder, "another replica leads");
                return Ok(false);
            }
            Decision::Create(lease) => self.api.create(&PostParams::default(), &lease).await,
            Decision::Renew(lease) | Decision::TakeOver(lease) => {
                self.api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(true),
            // Another replica wrote first: it leads this round.
            Err(error) if is_conflict(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Gives the lease up (on shutdown), so a successor need not wait for it to expire.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(current) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let mut spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        let released = Lease {
            metadata: current.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_conflict(&error) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// One round with its deadline (see [`LeaseSettings::round_deadline`]).
    async fn round(&self, standing: Standing, started: Instant) -> Round {
        let deadline = self.settings.round_deadline(standing, started);
        match tokio::time::timeout_at(deadline.into(), self.try_lead()).await {
            Ok(Ok(true)) => Round::Held,
            Ok(Ok(false)) => Round::Lost,
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot reach the lease");
                Round::Failed
            }
            Err(_) => {
                tracing::warn!(
                    waited = ?deadline.saturating_duration_since(started),
                    "the lease API did not answer in time"
                );
                Round::Failed
            }
        }
    }

    /// Campaigns forever; the receiver says whether we lead. A leader steps down (the
    /// receiver sees false) as soon as no renewal has succeeded for `renew_deadline`, before
    /// the lease can expire for the other replicas, whether the API fails or hangs.
    pub fn run(self: std::sync::Arc<Self>) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let settings = &self.settings;
            let mut standing = Standing::Following;
            loop {
                let started = Instant::now();
                let round = self.round(standing, started).await;
                let next = after_round(settings, standing, started, round, Instant::now());
                match (standing.leading(), next.leading()) {
                    (false, true) => {
                        tracing::info!(identity = %settings.identity, lease = %settings.name, "became the leader")
                    }
                    (true, false) if round == Round::Lost => {
                        tracing::warn!("lost the lease to another replica")
                    }
                    (true, false) => tracing::warn!(
                        deadline = ?settings.renew_deadline,
                        "could not renew the lease in time; stepping down"
                    ),
                    _ => {}
                }
                standing = next;
                tx.send_replace(standing.leading());
                // The next round, but no later than our leadership ends.
                let mut wake = Instant::now() + settings.renew_every;
                if let Some(until) = settings.lead_until(standing) {
                    wake = wake.min(until);
                }
                tokio::time::sleep_until(wake.into()).await;
                let now = Instant::now();
                if standing.leading() && !settings.standing_at(standing, now).leading() {
                    tracing::warn!("could not renew the lease in time; stepping down");
                    standing = Standing::Following;
                    tx.send_replace(false);
                }
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_timing_that_could_let_two_leaders_act_at_once_is_refused() {
        let standard = || LeaseSettings::standard("l".into(), "ns".into(), "me".into());
        let s = Duration::from_secs;
        let quick = standard()
            .with_timing(s(4), s(3), Duration::from_millis(500))
            .expect("a shorter lease keeps its order");
        assert_eq!(quick.duration, s(4));
        assert_eq!(quick.identity, "me");
        for (duration, deadline, every) in
            [(s(4), s(4), s(1)), (s(4), s(3), s(3)), (s(4), s(5), s(1))]
        {
            let refused = standard()
                .with_timing(duration, deadline, every)
                .unwrap_err();
            assert!(refused.contains("more often than"), "{refused}");
        }
        assert!(standard().with_timing(s(4), s(3), s(0)).is_err());
    }

    fn settings(identity: &str) -> LeaseSettings {
        LeaseSettings {
            name: "toolgrid-controller".into(),
            namespace: "toolgrid".into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
        }
    }

    fn lease(holder: &str, renewed: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("toolgrid-controller".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let me = settings("pod-a");
        let Decision::Create(created) = decide(None, &me, now) else {
            panic!("create")
        };
        assert_eq!(
            created.spec.unwrap().holder_identity.as_deref(),
            Some("pod-a")
        );

        let Decision::Renew(renewed) =
            decide(Some(&lease("pod-a", "2026-01-01T00:00:55Z")), &me, now)
        else {
            panic!("renew")
        };
        assert_eq!(
            renewed.metadata.resource_version.as_deref(),
            Some("7"),
            "optimistic concurrency"
        );
        assert_eq!(renewed.spec.unwrap().renew_time, Some(MicroTime(now)));

        assert_eq!(
            decide(Some(&lease("pod-b", "2026-01-01T00:00:50Z")), &me, now),
            Decision::Follow {
                holder: "pod-b".into()
            }
        );
        let Decision::TakeOver(taken) =
            decide(Some(&lease("pod-b", "2026-01-01T00:00:30Z")), &me, now)
        else {
            panic!("take over an expired lease")
        };
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(spec.lease_transitions, Some(3));
    }
}

#[cfg(test)]
mod standing_tests {
    //! The leader's standing with fake time: instants made by adding to one start.
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings::standard("l".into(), "ns".into(), "pod-a".into())
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn the_timing_leaves_a_safety_margin() {
        let s = settings();
        assert!(s.renew_every < s.renew_deadline);
        assert!(
            s.renew_deadline + secs(2.0) <= s.duration,
            "a margin of seconds"
        );
    }

    #[test]
    fn a_renewal_that_hangs_past_its_deadline_steps_the_leader_down_before_the_lease_expires() {
        let s = settings();
        let t0 = Instant::now();
        // Renewed in a round that started at t0: the lease's renewTime is t0 or later, so no
        // standby may take it over before t0 + duration.
        let leading = after_round(&s, Standing::Following, t0, Round::Held, t0 + secs(0.1));
        assert_eq!(leading, Standing::Leading { renewed: t0 });
        let expiry = t0 + s.duration;

        // The next round starts at t0 + 2 s and hangs: it is abandoned at its deadline,
        // which is before the lease can expire.
        let started = t0 + s.renew_every;
        let deadline = s.round_deadline(leading, started);
        assert_eq!(deadline, t0 + s.renew_deadline);
        assert!(deadline < expiry);
        let after = after_round(&s, leading, started, Round::Failed, deadline);
        assert_eq!(after, Standing::Following, "stepped down at the deadline");
        // Even had the round not been abandoned, the time alone ends the leadership.
        assert_eq!(s.standing_at(leading, deadline), Standing::Following);
        assert_eq!(s.standing_at(leading, deadline - secs(0.01)), leading);

        // A write that succeeds only `renew_deadline` after its round started does not
        // count as a renewal (the round would have been abandoned by then).
        let late = after_round(
            &s,
            Standing::Following,
            started,
            Round::Held,
            started + s.renew_deadline,
        );
        assert_eq!(late, Standing::Following);
    }

    #[test]
    fn renewals_that_fail_again_and_again_step_the_leader_down_before_the_lease_expires() {
        let s = settings();
        let t0 = Instant::now();
        let mut standing = after_round(&s, Standing::Following, t0, Round::Held, t0);
        let mut stepped_down = None;
        let mut now = t0;
        for _ in 0..20 {
            now += s.renew_every;
            let started = now;
            now += secs(0.05); // the API answers an error quickly
            standing = after_round(&s, standing, started, Round::Failed, now);
            if !standing.leading() {
                stepped_down = Some(now);
                break;
            }
            assert!(
                now < t0 + s.renew_deadline,
                "still leading at {:?}",
                now - t0
            );
        }
        let stepped_down = stepped_down.expect("the leader steps down");
        assert!(stepped_down >= t0 + s.renew_deadline);
        assert!(
            stepped_down < t0 + s.duration,
            "stepped down {:?} after the last renewal, the lease lasts {:?}",
            stepped_down - t0,
            s.duration
        );
        // A success in between renews the leadership from when that round started.
        let renewed = after_round(
            &s,
            Standing::Leading { renewed: t0 },
            t0 + secs(8.0),
            Round::Held,
            t0 + secs(8.2),
        );
        assert_eq!(
            renewed,
            Standing::Leading {
                renewed: t0 + secs(8.0)
            }
        );
        assert_eq!(s.lead_until(renewed), Some(t0 + secs(18.0)));
    }

    #[test]
    fn losing_the_lease_steps_down_at_once_and_a_follower_round_has_its_own_deadline() {
        let s = settings();
        let t0 = Instant::now();
        let leading = Standing::Leading { renewed: t0 };
        assert_eq!(
            after_round(&s, leading, t0 + secs(2.0), Round::Lost, t0 + secs(2.1)),
            Standing::Following
        );
        assert_eq!(
            s.round_deadline(Standing::Following, t0 + secs(3.0)),
            t0 + secs(3.0) + s.renew_deadline
        );
        assert_eq!(
            after_round(&s, Standing::Following, t0, Round::Failed, t0 + secs(1.0)),
            Standing::Following
        );
    }
}

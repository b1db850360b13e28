//! A WorkerPool's health, in one place for `toolgrid get pools` (the gateway, under
//! `toolgrid up` and the controller alike) and the WorkerPool status the controller writes:
//! a valid pool is Ready while a worker is attached, or while none is wanted and no call
//! waits; a control plane that has just started gives workers a grace to re-attach.

use std::collections::HashMap;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_core::scheduler::WorkerInfo;

/// What the scheduler (and, in a cluster, the Deployment) says about a pool right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LivePool {
    /// Workers wanted.
    pub desired: u32,
    /// Pods the Deployment reports ready (0 where there is no Deployment).
    pub ready: u32,
    pub attached: u32,
    pub busy: u32,
    pub queued: u32,
    /// The control plane has just started and workers may still be re-attaching, so
    /// "none attached" is not yet news.
    pub reattaching: bool,
}

impl LivePool {
    /// The scheduler's view of pool `pool` (`namespace/name`): attached workers, their busy
    /// slots and the calls queued for it. `desired` and `ready` are the caller's to fill.
    pub fn observe(
        pool: &str,
        workers: &[WorkerInfo],
        queued: &HashMap<String, usize>,
        reattaching: bool,
    ) -> LivePool {
        let attached = workers.iter().filter(|w| w.pool == pool);
        LivePool {
            attached: attached.clone().count() as u32,
            busy: attached.map(|w| w.busy).sum(),
            queued: queued.get(pool).copied().unwrap_or_default() as u32,
            reattaching,
            ..LivePool::default()
        }
    }

    /// No worker is attached, but the control plane has just started: what was said
    /// before (if anything) still stands.
    pub fn may_be_reattaching(&self) -> bool {
        self.attached == 0 && self.reattaching
    }
}

/// The Ready condition of a valid pool from what is live.
pub fn pool_ready(live: &LivePool) -> Desired {
    if live.attached > 0 {
        Desired::ready(
            Reason::WorkersAttached,
            format!(
                "{} of {} workers attached, {} slots busy",
                live.attached, live.desired, live.busy
            ),
        )
    } else if live.desired == 0 && live.queued == 0 {
        Desired::ready(Reason::ScaledToZero, "no workers are wanted")
    } else if live.reattaching {
        Desired::not_ready(
            Reason::NoWorkers,
            format!(
                "0 of {} workers attached yet (the control plane has just started; workers may still be re-attaching)",
                live.desired
            ),
        )
    } else {
        Desired::not_ready(
            Reason::NoWorkers,
            format!("0 of {} workers attached yet", live.desired),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_with_a_worker_attached_or_none_wanted() {
        let workers = vec![
            WorkerInfo {
                id: "w1".into(),
                pool: "team/default".into(),
                slots: 8,
                busy: 3,
            },
            WorkerInfo {
                id: "w2".into(),
                pool: "team/other".into(),
                slots: 8,
                busy: 8,
            },
        ];
        let queued = HashMap::from([("team/default".to_string(), 4)]);
        let live = LivePool {
            desired: 2,
            ..LivePool::observe("team/default", &workers, &queued, false)
        };
        assert_eq!((live.attached, live.busy, live.queued), (1, 3, 4));
        let ready = pool_ready(&live);
        assert!(ready.status);
        assert_eq!(ready.reason, Reason::WorkersAttached);
        assert_eq!(ready.message, "1 of 2 workers attached, 3 slots busy");

        let none = LivePool::observe("team/empty", &workers, &queued, false);
        assert_eq!(pool_ready(&none).reason, Reason::ScaledToZero);
        let waiting = LivePool { queued: 1, ..none };
        assert_eq!(
            pool_ready(&waiting).reason,
            Reason::NoWorkers,
            "calls wait for a pool that wants no workers"
        );
        let wanted = LivePool { desired: 2, ..none };
        assert!(!pool_ready(&wanted).status);
        assert!(!wanted.may_be_reattaching());
        let fresh = LivePool {
            reattaching: true,
            ..wanted
        };
        assert!(fresh.may_be_reattaching());
        assert!(pool_ready(&fresh).message.contains("re-attaching"));
    }
}

//! WorkerPools: checked first, as releases name the pool they run in.

use super::Resolver;
use crate::snapshot::ResolvedPool;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{Kind, KindStatus, WorkerPool, WorkerPoolStatus};
use toolgrid_core::interface::FieldError;

impl<'a> Resolver<'a> {
    pub(super) fn pools(&mut self) {
        for d in self.declared(Kind::WorkerPool, &self.input.set.pools) {
            match check_pool(d.object) {
                Err(e) => self.invalid(&d, e),
                Ok((desired, slots)) => {
                    let columns = vec![
                        ("Desired".into(), desired.to_string()),
                        ("Slots".into(), slots.to_string()),
                    ];
                    let status = KindStatus::WorkerPool(WorkerPoolStatus {
                        desired_workers: desired,
                        ..WorkerPoolStatus::default()
                    });
                    self.record_declared(
                        &d,
                        Desired::ready(
                            Reason::Resolved,
                            format!("{desired} workers of {slots} slots"),
                        ),
                        status,
                        columns,
                    );
                    self.snapshot.pools.insert(
                        d.id.key.clone(),
                        ResolvedPool {
                            key: d.id.key.clone(),
                            spec: d.object.spec.clone(),
                            desired_workers: desired,
                            slots_per_worker: slots,
                        },
                    );
                }
            }
        }
    }
}

/// Checks a WorkerPool; returns the workers wanted and the slots of each.
pub fn check_pool(pool: &WorkerPool) -> Result<(u32, u32), FieldError> {
    let spec = &pool.spec;
    let slots = spec.slots();
    if slots == 0 || slots > 4096 {
        return Err(FieldError::new(
            "spec.slotsPerWorker",
            format!("must be between 1 and 4096, not {slots}"),
        ));
    }
    match (&spec.replicas, &spec.autoscale) {
        (Some(_), Some(_)) => Err(FieldError::new(
            "spec",
            "set replicas or autoscale, not both",
        )),
        (_, Some(a)) if a.min > a.max => Err(FieldError::new(
            "spec.autoscale",
            format!("min ({}) is above max ({})", a.min, a.max),
        )),
        (_, Some(a)) if a.max == 0 => {
            Err(FieldError::new("spec.autoscale.max", "must be at least 1"))
        }
        (_, Some(a)) => Ok((a.min, slots)),
        (Some(r), None) => Ok((*r, slots)),
        (None, None) => Ok((1, slots)),
    }
}

//! `toolgrid rollout status|promote|abort TOOL`: operators look at a tool's canary
//! rollouts and step, promote or roll them back by hand (docs/rollout.md).

use super::Gateway;
use crate::rollout::{self, Live};
use toolgrid_core::auth::Principal;
use toolgrid_core::error::ApiError;
use toolgrid_core::rollout::Order;

impl Gateway {
    /// The rollouts of `tool` in `namespace` (of binding `binding` only, when given) after
    /// `order`, if any. Operators only (`permission-denied`); a tool with no binding with
    /// a Ready canary is `not-found`; an order to a rollout promoted or rolled back already
    /// is `rollout-ended`.
    pub async fn rollout(
        &self,
        caller: &Principal,
        namespace: &str,
        tool: &str,
        binding: Option<&str>,
        order: Option<Order>,
    ) -> Result<Vec<Live>, ApiError> {
        super::authz::operators_only(caller, "look at or change a rollout")?;
        let snapshot = self.catalog.current();
        if let Some(order) = order {
            rollout::order(
                &*self.store,
                &snapshot,
                &self.rollouts,
                namespace,
                tool,
                binding,
                order,
            )
            .await?;
        }
        let mut live = rollout::status(&*self.store, &snapshot, namespace, tool).await?;
        live.retain(|l| binding.is_none_or(|name| l.binding.name == name));
        Ok(live)
    }
}

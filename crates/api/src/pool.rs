//! `WorkerPool`: the sandbox workers that run calls.

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Sandbox workers: a fixed number of replicas or autoscaling bounds, and slots per worker.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "WorkerPool",
    namespaced,
    status = "WorkerPoolStatus",
    shortname = "wp",
    category = "toolgrid",
    doc = "Sandbox workers: replicas or autoscaling bounds, slots per worker, resources and placement.",
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.desiredWorkers"
    ),
    printcolumn(name = "Pods", type_ = "integer", json_path = ".status.readyWorkers"),
    printcolumn(
        name = "Attached",
        type_ = "integer",
        json_path = ".status.attachedWorkers"
    ),
    printcolumn(name = "Busy", type_ = "integer", json_path = ".status.busySlots"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerPoolSpec {
    /// A fixed number of workers (default 1 when autoscale is not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Or: scale between bounds on queue depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<Autoscale>,
    /// Calls one worker runs at once (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_per_worker: Option<u32>,
    /// Container resources of each worker pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Worker image (default: the controller's own image). Its pods run `toolgrid-worker`,
    /// found on the image's PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The ServiceAccount worker pods run as; their projected token (audience
    /// `toolgrid-worker`) is how the control plane knows a worker belongs to this pool.
    /// Default: `POOL-worker`, created by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Autoscale {
    pub min: u32,
    pub max: u32,
    /// Queued calls per worker above which the pool grows (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_queue_depth: Option<u32>,
}

/// The slots of one worker when the pool says none.
pub const DEFAULT_SLOTS_PER_WORKER: u32 = 64;

impl WorkerPoolSpec {
    pub fn slots(&self) -> u32 {
        self.slots_per_worker.unwrap_or(DEFAULT_SLOTS_PER_WORKER)
    }

    /// The ServiceAccount the workers of pool `pool_name` run as.
    pub fn service_account_name(&self, pool_name: &str) -> String {
        self.service_account
            .clone()
            .unwrap_or_else(|| format!("{pool_name}-worker"))
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub desired_workers: u32,
    /// Worker pods the Deployment reports ready.
    #[serde(default)]
    pub ready_workers: u32,
    #[serde(default)]
    pub attached_workers: u32,
    #[serde(default)]
    pub busy_slots: u32,
    #[serde(default)]
    pub queued_calls: u32,
}

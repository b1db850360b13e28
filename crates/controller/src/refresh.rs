//! `toolgrid refresh` in a cluster: the ToolSource's `toolgrid.dev/refresh` annotation is set
//! (a merge patch of metadata only: no new generation), and the source's reconcile reads
//! the upstream because `status.refreshed` no longer matches it.

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use toolgrid_api::{REFRESH_ANNOTATION, ToolSource};
use toolgrid_core::ids::ObjectKey;

/// Sets the refresh annotation through the API.
pub struct AnnotationRefresher {
    pub client: Client,
}

/// The patch that asks for a read answering `nonce`.
pub fn refresh_patch(nonce: &str) -> serde_json::Value {
    json!({"metadata": {"annotations": {REFRESH_ANNOTATION: nonce}}})
}

#[async_trait::async_trait]
impl toolgrid_control_plane::gateway::SourceRefresher for AnnotationRefresher {
    async fn request(&self, key: &ObjectKey) -> Result<String, String> {
        let nonce = k8s_openapi::jiff::Timestamp::now().to_string();
        let api: Api<ToolSource> = Api::namespaced(self.client.clone(), &key.namespace);
        api.patch(
            &key.name,
            &PatchParams::default(),
            &Patch::Merge(refresh_patch(&nonce)),
        )
        .await
        .map_err(|e| format!("cannot annotate ToolSource {key}: {e}"))?;
        Ok(nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_touches_only_the_annotation() {
        assert_eq!(
            refresh_patch("2026-12-05T00:00:00Z"),
            json!({"metadata": {"annotations": {"toolgrid.dev/refresh": "2026-12-05T00:00:00Z"}}})
        );
    }
}

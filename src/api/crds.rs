//! The CRDs, generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD, in a stable order.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        super::Tool::crd(),
        super::ToolRelease::crd(),
        super::ToolBinding::crd(),
        super::Middleware::crd(),
        super::Agent::crd(),
        super::WorkerPool::crd(),
    ]
}

/// All CRDs as one YAML stream, as `toolgrid crds` prints it and `crds/` stores it.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crds/` and the chart's CRDs are generated; regenerate them with
    /// `cargo run -- crds > crds/toolgrid.yaml && cp crds/toolgrid.yaml charts/toolgrid/crds/ && cp crds/toolgrid.yaml deploy/crds/`.
    #[test]
    fn committed_crds_are_current() {
        let generated = crds_yaml().unwrap();
        for path in [
            "crds/toolgrid.yaml",
            "charts/toolgrid/crds/toolgrid.yaml",
            "deploy/crds/toolgrid.yaml",
        ] {
            let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            let committed = std::fs::read_to_string(&full).unwrap_or_default();
            assert!(
                committed == generated,
                "{path} is stale: run `cargo run -- crds > crds/toolgrid.yaml && cp crds/toolgrid.yaml charts/toolgrid/crds/ && cp crds/toolgrid.yaml deploy/crds/`"
            );
        }
    }

    #[test]
    fn every_crd_has_status_short_name_ready_column_and_a_structural_schema() {
        for crd in all_crds() {
            let name = crd.metadata.name.clone().unwrap();
            assert!(name.ends_with(".toolgrid.dev"), "{name}");
            assert_eq!(crd.spec.scope, "Namespaced");
            let short = crd.spec.names.short_names.clone().unwrap_or_default();
            assert_eq!(short.len(), 1, "{name} has one short name");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, "v1alpha1");
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name} has a status subresource"
            );
            let columns = version
                .additional_printer_columns
                .clone()
                .unwrap_or_default();
            assert!(
                columns.iter().any(|c| c.name == "Ready"),
                "{name} shows Ready"
            );
            let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
            let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
            assert!(
                status["conditions"].is_object(),
                "{name} status has conditions"
            );
            assert!(
                status["observedGeneration"].is_object(),
                "{name} status has observedGeneration"
            );
            assert_structural(&schema["openAPIV3Schema"], &name);
        }
    }

    /// Every node names a type, unless it keeps unknown fields or is int-or-string.
    fn assert_structural(node: &serde_json::Value, at: &str) {
        let Some(obj) = node.as_object() else { return };
        let free = obj.get("x-kubernetes-preserve-unknown-fields")
            == Some(&serde_json::json!(true))
            || obj.get("x-kubernetes-int-or-string") == Some(&serde_json::json!(true));
        assert!(obj.contains_key("type") || free, "{at} has no type: {node}");
        if let Some(props) = obj.get("properties").and_then(|p| p.as_object()) {
            for (key, child) in props {
                assert_structural(child, &format!("{at}.{key}"));
            }
        }
        if let Some(items) = obj.get("items") {
            assert_structural(items, &format!("{at}[]"));
        }
        if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            assert_structural(extra, &format!("{at}.*"));
        }
    }
}

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

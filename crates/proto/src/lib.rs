//! toolgrid's wire: the gRPC types and services of `toolgrid.v1` generated from
//! `proto/toolgrid/v1/` (the front doors' `Tools` and `Workspaces`, the `WorkerLink`), their
//! conversions to and from the domain ([`convert`]: oplog entries, workspace trees, a
//! worker's result), the gRPC status of each error kind ([`status`]), and clients' TLS
//! ([`tls`]).

pub mod convert;
pub mod status;
pub mod tls;

pub use convert::{
    LINK_BATCH_BYTES, call_to_proto, commit_of, entries_from_wire, entries_to_wire, link_batches,
    tree_from_wire, tree_to_wire,
};
pub use generated::*;

/// The code `tonic` generates, as it generates it (its docs are the `.proto` files'
/// comments, written for protobuf readers).
#[allow(clippy::all, missing_docs, rustdoc::invalid_html_tags)]
mod generated {
    tonic::include_proto!("toolgrid.v1");
}

/// An assignment carries secret values (`secrets`, and revealed ones in `env`): its `Debug`
/// names their keys and never shows a value.
impl std::fmt::Debug for Assign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assign")
            .field("call_id", &self.call_id)
            .field("epoch", &self.epoch)
            .field("namespace", &self.namespace)
            .field("tool", &self.tool)
            .field("command", &self.command)
            .field("release", &self.release)
            .field("digest", &self.digest)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("attempt", &self.attempt)
            .field("replay", &self.replay.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_debugs_without_its_secret_values() {
        let assign = Assign {
            call_id: "c1".into(),
            env: [("signing-key".to_string(), "r3v3aled".to_string())].into(),
            secrets: [("api-token".to_string(), "s3cr3t".to_string())].into(),
            ..Assign::default()
        };
        let event = ControlEvent {
            event: Some(control_event::Event::Assign(assign)),
        };
        let text = format!("{event:?}");
        assert!(text.contains("c1") && text.contains("api-token"), "{text}");
        assert!(
            !text.contains("r3v3aled") && !text.contains("s3cr3t"),
            "{text}"
        );
    }
}

//! Who calls: [`Principal`], an authenticated caller (how a token becomes one is the
//! control plane's `auth`).

use crate::ids::ObjectKey;

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// May call anything and read everything (the admin token of `toolgrid up`, or a subject
    /// Kubernetes RBAC allows to operate toolgrid). May act as an agent (`--as`).
    Operator { subject: String },
    /// An Agent: calls only its bound tools, reads only its own calls.
    Agent { agent: ObjectKey },
}

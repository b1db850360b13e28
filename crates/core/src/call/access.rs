//! What a call may use besides its arguments: the agent it acts for, and what that agent's
//! binding grants it (filesystem, config, secrets). Fixed at admission, from the binding
//! intersected with the agent, and stored with the call so that a re-run gets the same.
//!
//! Secret **values** are never part of it: it names keys, and the control plane resolves
//! their values when it assigns the call to an (authenticated) worker.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a call sees its agent's workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Filesystem {
    /// No filesystem at all.
    #[default]
    None,
    /// The workspace's version V, read-only.
    ReadOnly,
    /// A copy-on-write view of version V; committed as V+1 when the call succeeds.
    ReadWrite,
}

impl Filesystem {
    pub fn as_str(self) -> &'static str {
        match self {
            Filesystem::None => "none",
            Filesystem::ReadOnly => "readOnly",
            Filesystem::ReadWrite => "readWrite",
        }
    }
}

/// The grants of one call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallAccess {
    /// The Agent (in the call's namespace) the call acts for; `None` for an operator's own
    /// call, which gets no workspace, config or secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "is_none")]
    pub filesystem: Filesystem,
    /// Readable config keys and their values as admitted (not secret), given to the tool as
    /// environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// Secret keys the tool may use by reference (`${secret:KEY}` in an outgoing request's
    /// URL or headers); it never sees their values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets_readable: Vec<String>,
    /// Secret keys the tool sees as environment variables (never written to the oplog or
    /// logs in plaintext).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets_revealable: Vec<String>,
}

fn is_none(filesystem: &Filesystem) -> bool {
    *filesystem == Filesystem::None
}

impl CallAccess {
    /// Every secret key the call may use, either way.
    pub fn secret_keys(&self) -> impl Iterator<Item = &String> {
        self.secrets_readable
            .iter()
            .chain(self.secrets_revealable.iter())
    }
}

//! Signed per-call identity for upstreams.
//!
//! When toolgrid calls an upstream (an imported MCP server or HTTP API) on an agent's
//! behalf it never forwards the agent's own token. With `auth: {type: identity}` it signs a
//! short-lived token for that one upstream request instead: a JWT signed with Ed25519
//! (`EdDSA`) that names the platform (`iss`), the upstream (`aud`), the agent (`sub`,
//! `namespace/name`), its namespace (`tenant`), the tool and the call, valid for
//! [`token::TOKEN_LIFETIME`]. Upstreams verify it with the public keys the platform
//! publishes at [`JWKS_PATH`] (unauthenticated: a JWKS is public). See `docs/identity.md`.
//!
//! | module | owns |
//! |---|---|
//! | [`keys`] | the Ed25519 key set and its rotation, a pure plan over dates |
//! | [`token`] | minting a token |
//! | [`jwks`] | the published JWKS document |
//! | [`store`] | the key file of `toolgrid up` and the shared, rotating [`IdentityKeys`] |

pub mod jwks;
pub mod keys;
pub mod store;
pub mod token;

pub use jwks::jwks;
pub use keys::{Plan, PublicKey, SigningKey, SigningKeys, plan};
pub use store::{IdentityKeys, KEY_FILE};
pub use token::{IdentityClaims, TOKEN_LIFETIME, mint};

/// Where the HTTP port publishes the JWKS.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// How long upstreams may cache the JWKS (`cache-control: max-age`); a new signing key is
/// published longer than this before it signs ([`keys::PUBLISH_AHEAD`]).
pub const JWKS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(300);

/// The keys and the platform's URL: what mints identity tokens.
#[derive(Clone, Debug)]
pub struct Issuer {
    pub keys: IdentityKeys,
    /// The platform's URL, each token's `iss` (where `/.well-known/jwks.json` is served).
    pub url: String,
}

impl Issuer {
    /// A token, issued now, for the agent `namespace/agent` calling `tool` at `audience`
    /// in call `call`.
    pub fn mint_now(
        &self,
        audience: &str,
        namespace: &str,
        agent: &str,
        tool: &str,
        call: &str,
    ) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        self.keys.mint(
            &IdentityClaims {
                issuer: self.url.clone(),
                audience: audience.to_string(),
                namespace: namespace.to_string(),
                agent: agent.to_string(),
                tool: tool.to_string(),
                call: call.to_string(),
            },
            now,
        )
    }
}

/// Where the issuer is set once the platform knows its URL, shared by the parts that mint
/// (the scheduler's assignments, the ToolSource reader) and serve the JWKS.
pub type IssuerCell = std::sync::Arc<std::sync::OnceLock<Issuer>>;

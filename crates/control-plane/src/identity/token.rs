//! Minting an identity token: a compact JWS (RFC 7515) signed with Ed25519 (`EdDSA`,
//! RFC 8037), naming who calls an upstream, for which tool and call, for that upstream
//! alone, for [`TOKEN_LIFETIME`].

use super::keys::SigningKeys;
use base64::Engine as _;
use serde::Serialize;
use std::time::Duration;

/// How long an identity token is valid after it is minted (`exp - iat`).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(120);

/// Who calls which upstream, and why: what a token says besides its times and id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityClaims {
    /// The platform's URL (`iss`).
    pub issuer: String,
    /// The upstream's URL (`aud`): the one service the token is for.
    pub audience: String,
    /// The agent's namespace (`tenant`, and the first half of `sub`).
    pub namespace: String,
    /// The agent's name (the second half of `sub`).
    pub agent: String,
    /// The tool the call is to (`tool`, `namespace/name` or the tool's name).
    pub tool: String,
    /// The call's id (`call`).
    pub call: String,
}

/// The claims as signed, in this order.
#[derive(Serialize)]
struct Payload<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: String,
    tenant: &'a str,
    tool: &'a str,
    call: &'a str,
    iat: i64,
    exp: i64,
    jti: String,
}

#[derive(Serialize)]
struct Header<'a> {
    alg: &'static str,
    typ: &'static str,
    kid: &'a str,
}

fn enc(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A token for `claims`, issued at `now_s` (unix seconds), signed by the current key of
/// `keys`; a fresh random `jti` each time.
pub fn mint(keys: &SigningKeys, claims: &IdentityClaims, now_s: i64) -> String {
    let key = &keys.current;
    let mut jti = [0u8; 16];
    rand::fill(&mut jti);
    let header = Header {
        alg: "EdDSA",
        typ: "JWT",
        kid: &key.kid,
    };
    let payload = Payload {
        iss: &claims.issuer,
        aud: &claims.audience,
        sub: format!("{}/{}", claims.namespace, claims.agent),
        tenant: &claims.namespace,
        tool: &claims.tool,
        call: &claims.call,
        iat: now_s,
        exp: now_s.saturating_add(TOKEN_LIFETIME.as_secs() as i64),
        jti: enc(&jti),
    };
    // Serializing these structs of strings and integers cannot fail.
    let header = serde_json::to_vec(&header).unwrap_or_default();
    let payload = serde_json::to_vec(&payload).unwrap_or_default();
    let signed = format!("{}.{}", enc(&header), enc(&payload));
    let signature = key.sign(signed.as_bytes());
    format!("{signed}.{}", enc(&signature))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const NOW: i64 = 1_800_000_000;

    fn claims() -> IdentityClaims {
        IdentityClaims {
            issuer: "https://toolgrid.example.com".into(),
            audience: "https://api.example.com/v1".into(),
            namespace: "team-a".into(),
            agent: "triage-bot".into(),
            tool: "tickets".into(),
            call: "01J9ZCALL".into(),
        }
    }

    fn part(token: &str, i: usize) -> Vec<u8> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(i).unwrap())
            .unwrap()
    }

    #[test]
    fn a_token_names_the_caller_for_one_upstream_for_two_minutes() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let token = mint(&keys, &claims(), NOW);
        assert_eq!(token.split('.').count(), 3);
        assert!(!token.contains('='), "base64url without padding");
        let header: Value = serde_json::from_slice(&part(&token, 0)).unwrap();
        assert_eq!(
            header,
            json!({"alg": "EdDSA", "typ": "JWT", "kid": keys.current.kid})
        );
        let payload: Value = serde_json::from_slice(&part(&token, 1)).unwrap();
        let jti = payload["jti"].as_str().unwrap().to_string();
        assert_eq!(jti.len(), 22, "16 random bytes");
        assert_eq!(
            payload,
            json!({
                "iss": "https://toolgrid.example.com",
                "aud": "https://api.example.com/v1",
                "sub": "team-a/triage-bot",
                "tenant": "team-a",
                "tool": "tickets",
                "call": "01J9ZCALL",
                "iat": NOW,
                "exp": NOW + 120,
                "jti": jti,
            })
        );
        // The claims in the documented order.
        let text = String::from_utf8(part(&token, 1)).unwrap();
        let order: Vec<usize> = [
            "iss", "aud", "sub", "tenant", "tool", "call", "iat", "exp", "jti",
        ]
        .iter()
        .map(|k| text.find(&format!("\"{k}\"")).unwrap())
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn the_signature_verifies_with_the_published_key_and_nothing_else() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let token = mint(&keys, &claims(), NOW);
        let (signed, _) = token.rsplit_once('.').unwrap();
        let signature = part(&token, 2);
        let verify = |public: &[u8], message: &[u8]| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
                .verify(message, &signature)
                .is_ok()
        };
        assert!(verify(keys.current.public(), signed.as_bytes()));
        // A changed payload does not verify.
        let mut payload: Value = serde_json::from_slice(&part(&token, 1)).unwrap();
        payload["sub"] = json!("team-a/admin");
        let forged = format!(
            "{}.{}",
            token.split('.').next().unwrap(),
            enc(payload.to_string().as_bytes())
        );
        assert!(!verify(keys.current.public(), forged.as_bytes()));
        // Another key does not verify it.
        let other = SigningKeys::fresh(NOW).unwrap();
        assert!(!verify(other.current.public(), signed.as_bytes()));
    }

    #[test]
    fn every_token_has_its_own_id() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let ids: std::collections::BTreeSet<String> = (0..100)
            .map(|_| {
                let token = mint(&keys, &claims(), NOW);
                let payload: Value = serde_json::from_slice(&part(&token, 1)).unwrap();
                payload["jti"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(ids.len(), 100);
    }

    #[test]
    fn after_a_switch_tokens_name_the_new_key() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let old = keys.current.kid.clone();
        let plan = super::super::keys::Plan {
            switch: true,
            ..Default::default()
        };
        let keys = keys.advance(plan, NOW).unwrap();
        let token = mint(&keys, &claims(), NOW);
        let header: Value = serde_json::from_slice(&part(&token, 0)).unwrap();
        assert_eq!(header["kid"], json!(keys.current.kid));
        assert_ne!(header["kid"], json!(old));
    }
}

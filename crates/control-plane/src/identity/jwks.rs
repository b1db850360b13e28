//! The JWKS (RFC 7517) upstreams verify identity tokens with: one OKP Ed25519 key
//! (RFC 8037) per published key, the signing key first.

use super::keys::SigningKeys;
use base64::Engine as _;
use serde_json::{Value, json};

/// `{"keys": [...]}` with the current key, its published successor and the retired keys
/// still published. Public halves only.
pub fn jwks(keys: &SigningKeys) -> Value {
    let keys: Vec<Value> = keys
        .published()
        .into_iter()
        .map(|(kid, x)| {
            json!({
                "kty": "OKP",
                "crv": "Ed25519",
                "x": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(x),
                "kid": kid,
                "alg": "EdDSA",
                "use": "sig",
            })
        })
        .collect();
    json!({ "keys": keys })
}

#[cfg(test)]
mod tests {
    use super::super::keys::{Plan, SigningKeys};
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn the_jwks_holds_each_published_key_as_an_okp_ed25519_key() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let doc = jwks(&keys);
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(keys.current.public());
        assert_eq!(
            doc,
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": keys.current.kid,
                "alg": "EdDSA", "use": "sig"}]})
        );
        assert_eq!(x.len(), 43);

        // A successor ahead of its use, then the retired key after the switch.
        let make_next = Plan {
            make_next: true,
            ..Plan::default()
        };
        let keys = keys.advance(make_next, NOW).unwrap();
        let next = keys.next.as_ref().unwrap().kid.clone();
        let kids = |doc: &Value| -> Vec<String> {
            doc["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k["kid"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(kids(&jwks(&keys)), [keys.current.kid.clone(), next.clone()]);
        let old = keys.current.kid.clone();
        let switch = Plan {
            switch: true,
            ..Plan::default()
        };
        let keys = keys.advance(switch, NOW).unwrap();
        let doc = jwks(&keys);
        assert_eq!(kids(&doc), [next, old]);
        for key in doc["keys"].as_array().unwrap() {
            let mut fields: Vec<&String> = key.as_object().unwrap().keys().collect();
            fields.sort();
            assert_eq!(
                fields,
                ["alg", "crv", "kid", "kty", "use", "x"],
                "no private `d`"
            );
        }
    }
}

//! OAuth 2.0 access tokens from a configured authorization server: JWTs (RFC 9068 style)
//! signed with a key of the issuer's JWKS, checked for signature, `iss`, `exp` (and `nbf`),
//! and an `aud` naming this resource (RFC 8707: a token minted for another resource is
//! refused, so a token cannot be replayed across servers).
//!
//! Pure: the JWKS is read once at start; no clock but the `now` passed in. Algorithms:
//! `ES256` (P-256) and `RS256` (RSA PKCS#1 v1.5 with SHA-256, 2048 bits and more); `none`
//! and anything else is refused. The subject is mapped to an Agent by the caller (an Agent's
//! `oauthSubjects`), and only within the namespace the issuer is trusted for
//! ([`NamespaceTrust`]): one configured namespace, or the namespace a claim of the token
//! names. An Agent elsewhere that lists the same subject is never that user.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// Why an access token is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a JWT")]
    Malformed,
    #[error("signed with {0:?}, which is not accepted (ES256, RS256)")]
    Algorithm(String),
    #[error("signed by no key of the issuer's JWKS")]
    Signature,
    #[error("issued by {0:?}, not the configured issuer")]
    Issuer(String),
    #[error("expired")]
    Expired,
    #[error("not valid yet")]
    NotYetValid,
    #[error("its audience {0:?} does not name this resource")]
    Audience(Vec<String>),
    #[error("it has no subject")]
    NoSubject,
    #[error("its claim {0:?} names no namespace")]
    NoNamespace(String),
}

/// Which namespace an issuer's subjects are Agents of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceTrust {
    /// Every subject is an Agent of this one namespace.
    Namespace(String),
    /// Each token names its namespace in this claim (a string, a Kubernetes namespace
    /// name); a token without it is refused.
    Claim(String),
}

impl Default for NamespaceTrust {
    fn default() -> Self {
        NamespaceTrust::Namespace("default".into())
    }
}

/// One public key of a JWKS.
#[derive(Clone, Debug)]
enum Key {
    /// The uncompressed P-256 point.
    Es256 { kid: Option<String>, point: Vec<u8> },
    Rs256 {
        kid: Option<String>,
        n: Vec<u8>,
        e: Vec<u8>,
    },
}

impl Key {
    fn kid(&self) -> Option<&str> {
        match self {
            Key::Es256 { kid, .. } | Key::Rs256 { kid, .. } => kid.as_deref(),
        }
    }
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
}

fn b64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

/// The issuer whose access tokens are accepted, with its keys and the audience they must
/// name.
#[derive(Clone, Debug)]
pub struct OAuthIssuer {
    pub issuer: String,
    /// The resource identifier (`https://tools.example.com/mcp`) tokens must be minted for.
    pub audience: String,
    /// The namespace its subjects are Agents of.
    pub trust: NamespaceTrust,
    keys: Vec<Key>,
}

/// An accepted access token's subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject(pub String);

/// An accepted access token: its subject, and the namespace that subject is an Agent of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub subject: Subject,
    pub namespace: String,
}

impl OAuthIssuer {
    /// An issuer with the keys of a JWKS document (`{"keys": [...]}`); keys of other types
    /// are skipped, and a JWKS with none usable is an error.
    pub fn new(issuer: &str, audience: &str, jwks: &Value) -> Result<Self, String> {
        let keys: Vec<Jwk> = serde_json::from_value(jwks.get("keys").cloned().unwrap_or_default())
            .map_err(|e| format!("JWKS: {e}"))?;
        let keys: Vec<Key> = keys
            .into_iter()
            .filter_map(|k| match (k.kty.as_str(), k.crv.as_deref()) {
                ("EC", Some("P-256")) => {
                    let (x, y) = (b64(k.x.as_deref()?)?, b64(k.y.as_deref()?)?);
                    (x.len() == 32 && y.len() == 32).then(|| {
                        let mut point = vec![4u8];
                        point.extend(x);
                        point.extend(y);
                        Key::Es256 { kid: k.kid, point }
                    })
                }
                ("RSA", _) => Some(Key::Rs256 {
                    kid: k.kid,
                    n: b64(k.n.as_deref()?)?,
                    e: b64(k.e.as_deref()?)?,
                }),
                _ => None,
            })
            .collect();
        if keys.is_empty() {
            return Err("the JWKS has no EC P-256 or RSA key".into());
        }
        Ok(OAuthIssuer {
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            trust: NamespaceTrust::default(),
            keys,
        })
    }

    /// The same issuer, its subjects Agents of the namespace `trust` gives.
    pub fn with_trust(mut self, trust: NamespaceTrust) -> Self {
        self.trust = trust;
        self
    }

    /// Whether `token` looks like a JWT at all (three base64url parts), so other tokens
    /// are not reported as bad JWTs.
    pub fn looks_like_jwt(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3 && parts[0].starts_with("eyJ")
    }

    /// Whether `token` is a JWT that says this issuer issued it (read before any check:
    /// it only routes the token; [`OAuthIssuer::verify`] decides). A JWT of another issuer
    /// (a ServiceAccount token names the cluster's) goes elsewhere.
    pub fn claims_to_be_mine(&self, token: &str) -> bool {
        if !Self::looks_like_jwt(token) {
            return false;
        }
        let Some(payload) = token.split('.').nth(1).and_then(b64) else {
            return false;
        };
        #[derive(Deserialize)]
        struct Iss {
            #[serde(default)]
            iss: Option<String>,
        }
        serde_json::from_slice::<Iss>(&payload)
            .ok()
            .and_then(|claims| claims.iss)
            .is_some_and(|iss| iss == self.issuer)
    }

    /// The subject of a valid access token at `now_s` (Unix seconds), and its namespace.
    pub fn verify(&self, token: &str, now_s: i64) -> Result<Verified, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Value = b64(h)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        let signature = b64(s).ok_or(TokenError::Malformed)?;
        let alg = header["alg"].as_str().unwrap_or_default().to_string();
        let kid = header["kid"].as_str();
        let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
        let candidates = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid().is_none() || k.kid() == kid);
        let verified = match alg.as_str() {
            "ES256" => candidates
                .filter_map(|k| match k {
                    Key::Es256 { point, .. } => Some(point),
                    _ => None,
                })
                .any(|point| {
                    ring::signature::UnparsedPublicKey::new(
                        &ring::signature::ECDSA_P256_SHA256_FIXED,
                        point,
                    )
                    .verify(signed, &signature)
                    .is_ok()
                }),
            "RS256" => candidates
                .filter_map(|k| match k {
                    Key::Rs256 { n, e, .. } => Some((n, e)),
                    _ => None,
                })
                .any(|(n, e)| {
                    ring::signature::RsaPublicKeyComponents { n, e }
                        .verify(
                            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                            signed,
                            &signature,
                        )
                        .is_ok()
                }),
            _ => return Err(TokenError::Algorithm(alg)),
        };
        if !verified {
            return Err(TokenError::Signature);
        }
        let claims: Value = b64(p)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        let subject = check_claims(&claims, &self.issuer, &self.audience, now_s)?;
        let namespace = namespace_of(&claims, &self.trust)?;
        Ok(Verified { subject, namespace })
    }
}

/// The namespace a verified token's subject is an Agent of.
fn namespace_of(claims: &Value, trust: &NamespaceTrust) -> Result<String, TokenError> {
    match trust {
        NamespaceTrust::Namespace(namespace) => Ok(namespace.clone()),
        NamespaceTrust::Claim(claim) => match claims[claim.as_str()].as_str() {
            Some(namespace) if is_namespace_name(namespace) => Ok(namespace.to_string()),
            _ => Err(TokenError::NoNamespace(claim.clone())),
        },
    }
}

/// A Kubernetes namespace name: an RFC 1123 label.
pub fn is_namespace_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The claims checks, after the signature.
fn check_claims(
    claims: &Value,
    issuer: &str,
    audience: &str,
    now_s: i64,
) -> Result<Subject, TokenError> {
    let iss = claims["iss"].as_str().unwrap_or_default();
    if iss != issuer {
        return Err(TokenError::Issuer(iss.to_string()));
    }
    match claims["exp"].as_f64() {
        Some(exp) if (now_s as f64) < exp => {}
        _ => return Err(TokenError::Expired),
    }
    if let Some(nbf) = claims["nbf"].as_f64()
        && (now_s as f64) < nbf
    {
        return Err(TokenError::NotYetValid);
    }
    let audiences: Vec<String> = match &claims["aud"] {
        Value::String(a) => vec![a.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    };
    let same = |a: &str| a.trim_end_matches('/') == audience.trim_end_matches('/');
    if !audiences.iter().any(|a| same(a)) {
        return Err(TokenError::Audience(audiences));
    }
    match claims["sub"].as_str() {
        Some(sub) if !sub.is_empty() => Ok(Subject(sub.to_string())),
        _ => Err(TokenError::NoSubject),
    }
}

/// Keys and signed tokens for tests.
#[cfg(test)]
pub(crate) mod test_tokens {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    use serde_json::{Value, json};

    pub(crate) fn enc(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    pub(crate) fn keypair() -> EcdsaKeyPair {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap()
    }

    pub(crate) fn jwks(key: &EcdsaKeyPair) -> Value {
        let point = key.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1",
            "x": enc(&point[1..33]), "y": enc(&point[33..65])}]})
    }

    pub(crate) fn sign(key: &EcdsaKeyPair, claims: &Value) -> String {
        let header = enc(br#"{"alg":"ES256","kid":"k1","typ":"at+jwt"}"#);
        let payload = enc(claims.to_string().as_bytes());
        let signed = format!("{header}.{payload}");
        let rng = ring::rand::SystemRandom::new();
        let sig = key.sign(&rng, signed.as_bytes()).unwrap();
        format!("{signed}.{}", enc(sig.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::test_tokens::{enc, jwks, keypair, sign};
    use super::*;
    use serde_json::json;

    const ISS: &str = "https://auth.example.com";
    const AUD: &str = "http://127.0.0.1:9/mcp";

    #[test]
    fn a_token_for_this_resource_names_its_subject() {
        let key = keypair();
        let issuer = OAuthIssuer::new(ISS, AUD, &jwks(&key)).unwrap();
        let good = json!({"iss": ISS, "aud": AUD, "sub": "user-1", "exp": 2000});
        let token = sign(&key, &good);
        assert!(OAuthIssuer::looks_like_jwt(&token));
        assert_eq!(
            issuer.verify(&token, 1000),
            Ok(Verified {
                subject: Subject("user-1".into()),
                namespace: "default".into()
            })
        );
        assert_eq!(issuer.verify(&token, 2000), Err(TokenError::Expired));
        let wrong_aud = sign(
            &key,
            &json!({"iss": ISS, "aud": ["http://other/mcp"], "sub": "u", "exp": 2000}),
        );
        assert!(matches!(
            issuer.verify(&wrong_aud, 1000),
            Err(TokenError::Audience(_))
        ));
        let wrong_iss = sign(
            &key,
            &json!({"iss": "https://evil", "aud": AUD, "sub": "u", "exp": 2000}),
        );
        assert!(matches!(
            issuer.verify(&wrong_iss, 1000),
            Err(TokenError::Issuer(_))
        ));
        let other = OAuthIssuer::new(ISS, AUD, &jwks(&keypair())).unwrap();
        assert_eq!(other.verify(&token, 1000), Err(TokenError::Signature));
        let mut tampered = token.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert!(issuer.verify(&tampered, 1000).is_err());
        let none = format!(
            "{}.{}.",
            enc(br#"{"alg":"none"}"#),
            enc(good.to_string().as_bytes())
        );
        assert_eq!(
            issuer.verify(&none, 1000),
            Err(TokenError::Algorithm("none".into()))
        );
    }

    #[test]
    fn the_namespace_is_the_configured_one_or_the_tokens_claim() {
        let key = keypair();
        let claims = |tenant: Value| json!({"iss": ISS, "aud": AUD, "sub": "alice", "exp": 2000, "tenant": tenant});
        let fixed = OAuthIssuer::new(ISS, AUD, &jwks(&key))
            .unwrap()
            .with_trust(NamespaceTrust::Namespace("team-a".into()));
        // The configured namespace, whatever the token claims.
        let token = sign(&key, &claims(json!("team-b")));
        assert_eq!(fixed.verify(&token, 1000).unwrap().namespace, "team-a");
        let by_claim = OAuthIssuer::new(ISS, AUD, &jwks(&key))
            .unwrap()
            .with_trust(NamespaceTrust::Claim("tenant".into()));
        assert_eq!(by_claim.verify(&token, 1000).unwrap().namespace, "team-b");
        for bad in [
            json!(null),
            json!(""),
            json!(7),
            json!("Team_B"),
            json!("a/b"),
        ] {
            let token = sign(&key, &claims(bad.clone()));
            assert_eq!(
                by_claim.verify(&token, 1000),
                Err(TokenError::NoNamespace("tenant".into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn tokens_are_routed_by_the_issuer_they_name() {
        let key = keypair();
        let issuer = OAuthIssuer::new(ISS, AUD, &jwks(&key)).unwrap();
        let mine = sign(&key, &json!({"iss": ISS, "sub": "u"}));
        assert!(issuer.claims_to_be_mine(&mine));
        // A ServiceAccount token names the cluster as its issuer.
        let cluster = sign(
            &key,
            &json!({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:a:b"}),
        );
        assert!(!issuer.claims_to_be_mine(&cluster));
        assert!(!issuer.claims_to_be_mine("opaque-token"));
        assert!(!issuer.claims_to_be_mine("eyJhbGciOiJub25lIn0.!!!.x"));
    }
}

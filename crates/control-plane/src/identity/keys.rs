//! The Ed25519 keys identity tokens are signed with, and their rotation.
//!
//! A [`SigningKeys`] set holds the key that signs now ([`SigningKeys::current`]), the
//! successor made ahead of time and already published ([`SigningKeys::next`]), and the
//! public halves of retired keys, published until every token they signed has expired
//! ([`SigningKeys::previous`]). Rotation is a pure decision ([`plan`]) over the set's dates
//! and the time now; [`SigningKeys::advance`] carries it out (key generation, no IO), like
//! the CA of [`crate::platform::ca`].
//!
//! The signing key is replaced every [`ROTATE_AFTER`]. Its successor is made and published
//! [`PUBLISH_AHEAD`] before it signs, so an upstream holding a JWKS it fetched (and cached,
//! up to [`crate::identity::JWKS_MAX_AGE`]) before the switch already knows the new key; a
//! retired key stays published [`RETIRED_PUBLISHED_FOR`] (far longer than a token lives,
//! [`crate::identity::token::TOKEN_LIFETIME`]), so tokens signed just before the switch
//! still verify after it. No token is ever signed by a key its verifiers cannot have.

use base64::Engine as _;
use ring::signature::{ED25519_PUBLIC_KEY_LEN, Ed25519KeyPair, KeyPair as _};
use std::sync::Arc;
use std::time::Duration;
use toolgrid_core::secret::SecretValue;

const DAY: u64 = 24 * 3600;
/// How long a key signs before its successor takes over.
pub const ROTATE_AFTER: Duration = Duration::from_secs(30 * DAY);
/// How long before it signs a successor is made and published.
pub const PUBLISH_AHEAD: Duration = Duration::from_secs(DAY);
/// How long a retired key stays published after it signed its last token.
pub const RETIRED_PUBLISHED_FOR: Duration = Duration::from_secs(DAY);

fn secs(d: Duration) -> i64 {
    d.as_secs() as i64
}

/// Why a key cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot generate an Ed25519 key")]
    Generate,
    #[error("not an Ed25519 PKCS#8 key: {0}")]
    Invalid(String),
}

/// The key id of an Ed25519 public key: base64url of the first 8 bytes of its SHA-256.
pub fn kid_of(public: &[u8]) -> String {
    let digest = toolgrid_core::secret::sha256(public);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..8])
}

/// A key that signs (or is about to): its private half as PKCS#8, never printed.
#[derive(Clone)]
pub struct SigningKey {
    pub kid: String,
    /// Unix seconds.
    pub created: i64,
    pkcs8: SecretValue,
    pair: Arc<Ed25519KeyPair>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

impl PartialEq for SigningKey {
    fn eq(&self, other: &Self) -> bool {
        self.kid == other.kid && self.created == other.created && self.pkcs8 == other.pkcs8
    }
}

impl Eq for SigningKey {}

impl SigningKey {
    /// A new key, made at `now` (unix seconds).
    pub fn generate(now: i64) -> Result<SigningKey, KeyError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Generate)?;
        SigningKey::from_pkcs8(SecretValue::new(pkcs8.as_ref()), now)
    }

    /// The key whose PKCS#8 document is `pkcs8`, made at `created`.
    pub fn from_pkcs8(pkcs8: SecretValue, created: i64) -> Result<SigningKey, KeyError> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8.expose())
            .map_err(|e| KeyError::Invalid(e.to_string()))?;
        Ok(SigningKey {
            kid: kid_of(pair.public_key().as_ref()),
            created,
            pkcs8,
            pair: Arc::new(pair),
        })
    }

    /// The PKCS#8 document, for storage only.
    pub fn pkcs8(&self) -> &SecretValue {
        &self.pkcs8
    }

    /// The 32-byte public key.
    pub fn public(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// The Ed25519 signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }

    /// Its public half, retired at `retired`.
    fn retire(&self, retired: i64) -> PublicKey {
        PublicKey {
            kid: self.kid.clone(),
            created: self.created,
            retired,
            x: self.public().to_vec(),
        }
    }
}

/// The public half of a retired key, published until [`PublicKey::published_until`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: String,
    /// Unix seconds.
    pub created: i64,
    /// When it signed its last token (unix seconds).
    pub retired: i64,
    /// The 32-byte Ed25519 public key.
    pub x: Vec<u8>,
}

impl PublicKey {
    /// When it leaves the JWKS (unix seconds).
    pub fn published_until(&self) -> i64 {
        self.retired.saturating_add(secs(RETIRED_PUBLISHED_FOR))
    }

    /// Whether `x` is an Ed25519 public key whose id is `kid`.
    pub fn is_consistent(&self) -> bool {
        self.x.len() == ED25519_PUBLIC_KEY_LEN && kid_of(&self.x) == self.kid
    }
}

/// The keys identity tokens are signed with and verified by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningKeys {
    /// Signs every token minted now.
    pub current: SigningKey,
    /// Made ahead of time and published, signing nothing yet.
    pub next: Option<SigningKey>,
    /// Retired keys still published (tokens they signed may still be in flight).
    pub previous: Vec<PublicKey>,
}

/// What a key set needs, from the dates alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nothing usable is stored: make a key.
    pub fresh: bool,
    /// Make the successor and publish it.
    pub make_next: bool,
    /// The successor takes over signing; the current key retires.
    pub switch: bool,
    /// Some retired key has been published long enough: drop it.
    pub drop_previous: bool,
}

impl Plan {
    /// Whether the key set stays as it is.
    pub fn is_keep(&self) -> bool {
        *self == Plan::default()
    }
}

/// What `keys` needs at `now` (unix seconds).
pub fn plan(keys: Option<&SigningKeys>, now: i64) -> Plan {
    let Some(keys) = keys else {
        return Plan {
            fresh: true,
            ..Plan::default()
        };
    };
    let age = now - keys.current.created;
    let switch = age >= secs(ROTATE_AFTER);
    let make_next = keys.next.is_none() && !switch && age >= secs(ROTATE_AFTER - PUBLISH_AHEAD);
    let drop_previous = keys.previous.iter().any(|p| p.published_until() <= now);
    Plan {
        fresh: false,
        make_next,
        switch,
        drop_previous,
    }
}

impl SigningKeys {
    /// A set of one new key, made at `now`.
    pub fn fresh(now: i64) -> Result<SigningKeys, KeyError> {
        Ok(SigningKeys {
            current: SigningKey::generate(now)?,
            next: None,
            previous: Vec::new(),
        })
    }

    /// The key set after `plan` (from [`plan`] over this set and `now`).
    pub fn advance(self, plan: Plan, now: i64) -> Result<SigningKeys, KeyError> {
        if plan.fresh {
            return SigningKeys::fresh(now);
        }
        let mut keys = self;
        if plan.drop_previous {
            keys.previous.retain(|p| p.published_until() > now);
        }
        if plan.make_next {
            keys.next = Some(SigningKey::generate(now)?);
        }
        if plan.switch {
            // Without a successor published ahead (a platform that was down over the
            // rotation), one is made now: verifiers that refetch the JWKS for an unknown
            // `kid` find it at once; others once their cached copy ages out.
            let next = match keys.next.take() {
                Some(next) => next,
                None => SigningKey::generate(now)?,
            };
            let retired = std::mem::replace(&mut keys.current, next);
            keys.previous.push(retired.retire(now));
        }
        Ok(keys)
    }

    /// The earliest time [`plan`] may want something done (unix seconds): when to look
    /// again at the latest.
    pub fn next_due(&self) -> i64 {
        let created = self.current.created;
        let mut due = vec![created.saturating_add(secs(ROTATE_AFTER))];
        if self.next.is_none() {
            due.push(created.saturating_add(secs(ROTATE_AFTER - PUBLISH_AHEAD)));
        }
        due.extend(self.previous.iter().map(PublicKey::published_until));
        due.into_iter().min().unwrap_or(i64::MAX)
    }

    /// The public keys a verifier needs now: `(kid, x)` of the current key, its successor
    /// and the retired keys still published.
    pub fn published(&self) -> Vec<(&str, &[u8])> {
        let mut keys = vec![(self.current.kid.as_str(), self.current.public())];
        if let Some(next) = &self.next {
            keys.push((next.kid.as_str(), next.public()));
        }
        keys.extend(
            self.previous
                .iter()
                .map(|p| (p.kid.as_str(), p.x.as_slice())),
        );
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;
    const D: i64 = DAY as i64;

    #[test]
    fn nothing_stored_makes_a_key() {
        assert!(plan(None, NOW).fresh);
        let keys = SigningKeys::fresh(NOW).unwrap();
        assert_eq!(keys.current.created, NOW);
        assert_eq!(keys.current.public().len(), 32);
        assert_eq!(keys.current.kid, kid_of(keys.current.public()));
        assert_eq!(
            keys.current.kid.len(),
            11,
            "8 bytes, base64url without padding"
        );
        assert!(plan(Some(&keys), NOW).is_keep());
        assert_eq!(keys.next_due(), NOW + 29 * D);
    }

    #[test]
    fn a_key_rotates_monthly_its_successor_published_a_day_ahead_and_retired_kept_a_day() {
        let first = SigningKeys::fresh(NOW).unwrap();
        let kid0 = first.current.kid.clone();
        assert!(plan(Some(&first), NOW + 29 * D - 1).is_keep());

        // A day before the switch: a successor, published, signing nothing.
        let at = NOW + 29 * D;
        let step = plan(Some(&first), at);
        assert_eq!(
            step,
            Plan {
                make_next: true,
                ..Plan::default()
            }
        );
        let ahead = first.advance(step, at).unwrap();
        let kid1 = ahead.next.as_ref().unwrap().kid.clone();
        assert_ne!(kid1, kid0);
        assert_eq!(ahead.current.kid, kid0, "the old key still signs");
        let published: Vec<&str> = ahead.published().iter().map(|(k, _)| *k).collect();
        assert_eq!(published, [kid0.as_str(), kid1.as_str()]);
        assert!(plan(Some(&ahead), at + D - 1).is_keep());
        assert_eq!(ahead.next_due(), NOW + 30 * D);

        // Thirty days after it was made: the successor signs, the old key stays published.
        let at = NOW + 30 * D;
        let step = plan(Some(&ahead), at);
        assert_eq!(
            step,
            Plan {
                switch: true,
                ..Plan::default()
            }
        );
        let switched = ahead.advance(step, at).unwrap();
        assert_eq!(switched.current.kid, kid1);
        assert!(switched.next.is_none());
        assert_eq!(switched.previous.len(), 1);
        assert_eq!(switched.previous[0].kid, kid0);
        assert_eq!(switched.previous[0].retired, at);
        assert!(switched.previous[0].is_consistent());
        let published: Vec<&str> = switched.published().iter().map(|(k, _)| *k).collect();
        assert_eq!(published, [kid1.as_str(), kid0.as_str()]);
        assert_eq!(switched.next_due(), at + D);

        // Longer than any token lives, and then some: the retired key is still published.
        assert!(plan(Some(&switched), at + 3600).is_keep());
        // A day after it retired it goes.
        let step = plan(Some(&switched), at + D);
        assert_eq!(
            step,
            Plan {
                drop_previous: true,
                ..Plan::default()
            }
        );
        let later = switched.advance(step, at + D).unwrap();
        assert!(later.previous.is_empty());
        assert_eq!(later.current.kid, kid1);
    }

    #[test]
    fn a_platform_down_over_the_rotation_switches_at_once() {
        let old = SigningKeys::fresh(NOW).unwrap();
        let at = NOW + 45 * D;
        let step = plan(Some(&old), at);
        assert_eq!(
            step,
            Plan {
                switch: true,
                ..Plan::default()
            }
        );
        let kid0 = old.current.kid.clone();
        let keys = old.advance(step, at).unwrap();
        assert_ne!(keys.current.kid, kid0);
        assert_eq!(keys.current.created, at);
        assert_eq!(keys.previous[0].kid, kid0);
    }

    #[test]
    fn walking_a_year_hourly_never_signs_with_an_unpublished_key() {
        let mut keys = SigningKeys::fresh(NOW).unwrap();
        // What a verifier that fetched the JWKS an hour ago holds.
        let mut held: Vec<String> = keys
            .published()
            .iter()
            .map(|(k, _)| k.to_string())
            .collect();
        let mut switches = 0;
        let mut hour = NOW;
        while hour < NOW + 365 * D {
            hour += 3600;
            let step = plan(Some(&keys), hour);
            switches += step.switch as u32;
            keys = keys.advance(step, hour).unwrap();
            assert!(
                held.contains(&keys.current.kid),
                "at {hour}: signing with a key published less than an hour ago"
            );
            assert!(keys.previous.len() <= 1);
            held = keys
                .published()
                .iter()
                .map(|(k, _)| k.to_string())
                .collect();
        }
        assert_eq!(switches, 12);
    }

    #[test]
    fn debug_never_shows_the_private_key() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        let pkcs8 = keys.current.pkcs8().expose().to_vec();
        let text = format!("{keys:?} {keys:#?}");
        assert!(text.contains(&keys.current.kid));
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let url = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        // The private seed sits at the end of the PKCS#8 document; no form of it shows.
        let seed = &pkcs8[16..48];
        for form in [
            hex::encode(seed),
            b64(&pkcs8),
            url(&pkcs8),
            url(seed),
            format!("{seed:?}"),
        ] {
            assert!(!text.contains(&form), "{text}");
        }
        assert!(!text.contains("pkcs8"), "{text}");
    }

    #[test]
    fn a_key_survives_its_pkcs8_document() {
        let key = SigningKey::generate(NOW).unwrap();
        let again = SigningKey::from_pkcs8(key.pkcs8().clone(), NOW).unwrap();
        assert_eq!(again, key);
        assert_eq!(again.public(), key.public());
        assert!(SigningKey::from_pkcs8(SecretValue::new("not a key"), NOW).is_err());
    }
}

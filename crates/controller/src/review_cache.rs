//! A small, bounded memory of the cluster's recent answers about tokens and subjects, so
//! that a burst of calls with one token costs one TokenReview, not one per call. Pure: the
//! caller passes the time, so expiry and eviction are tested with fake time.
//!
//! Keys are SHA-256 digests ([`digest_key`]): a token is never kept, only its digest.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an answer is believed by default: a revoked token or a removed RoleBinding
/// stops working at most this long after the cluster changed its mind.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Entries kept at most by default.
pub const DEFAULT_CAPACITY: usize = 4096;

/// A key: the SHA-256 of the parts it is made from.
pub type Key = [u8; 32];

/// The SHA-256 of `parts`, each length-prefixed so that no two different lists of parts
/// give the same bytes (`["ab", "c"]` and `["a", "bc"]` differ).
pub fn digest_key(parts: &[&str]) -> Key {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

/// Answers by key, each until its expiry; at most `capacity` of them.
#[derive(Debug)]
pub struct AnswerCache<V> {
    entries: HashMap<Key, (V, Instant)>,
    ttl: Duration,
    capacity: usize,
}

impl<V: Clone> AnswerCache<V> {
    /// A cache believing answers for `ttl`, keeping at most `capacity` (at least one).
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        AnswerCache {
            entries: HashMap::new(),
            ttl,
            capacity: capacity.max(1),
        }
    }

    /// The answer for `key` if it has not expired at `now`.
    pub fn get(&mut self, key: &Key, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((value, expires)) if now < *expires => Some(value.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `value` for `key` from `now` on. When full, expired answers go first, then
    /// the one that would expire soonest.
    pub fn insert(&mut self, key: Key, value: V, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, now + self.ttl));
    }

    /// Answers held (expired ones included until they are looked up or evicted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_believed_until_it_expires() {
        let t0 = Instant::now();
        let mut cache = AnswerCache::new(Duration::from_secs(30), 10);
        let key = digest_key(&["token", "toolgrid"]);
        cache.insert(key, Some("alice"), t0);
        assert_eq!(cache.get(&key, t0), Some(Some("alice")));
        assert_eq!(
            cache.get(&key, t0 + Duration::from_secs(29)),
            Some(Some("alice"))
        );
        assert_eq!(cache.get(&key, t0 + Duration::from_secs(30)), None);
        assert!(cache.is_empty(), "an expired answer is dropped when seen");
        // A negative answer is remembered as well.
        cache.insert(key, None, t0);
        assert_eq!(cache.get(&key, t0 + Duration::from_secs(1)), Some(None));
    }

    #[test]
    fn the_cache_never_holds_more_than_its_capacity() {
        let t0 = Instant::now();
        let mut cache = AnswerCache::new(Duration::from_secs(30), 3);
        for i in 0..3u64 {
            let key = digest_key(&[&i.to_string()]);
            cache.insert(key, i, t0 + Duration::from_secs(i));
        }
        // Full: the answer that expires soonest (the first) makes room.
        cache.insert(digest_key(&["3"]), 3, t0 + Duration::from_secs(3));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&digest_key(&["0"]), t0), None);
        assert_eq!(cache.get(&digest_key(&["1"]), t0), Some(1));
        // Expired answers make room before live ones.
        let later = t0 + Duration::from_secs(32);
        cache.insert(digest_key(&["4"]), 4, later);
        assert_eq!(cache.len(), 2, "1 and 2 had expired; 3 and 4 remain");
        assert_eq!(cache.get(&digest_key(&["3"]), later), Some(3));
        // Replacing a key does not evict another one.
        cache.insert(digest_key(&["4"]), 40, later);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&digest_key(&["4"]), later), Some(40));
    }

    #[test]
    fn keys_are_digests_that_keep_their_parts_apart() {
        assert_ne!(digest_key(&["ab", "c"]), digest_key(&["a", "bc"]));
        assert_eq!(digest_key(&["t", "a"]), digest_key(&["t", "a"]));
        let key = digest_key(&["s3cr3t-token"]);
        assert!(
            !key.windows(6).any(|w| w == b"s3cr3t"),
            "the token is not in its key"
        );
    }
}

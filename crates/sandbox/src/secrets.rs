//! Secrets inside a call: references the release declares, values the tool never sees.
//!
//! A tool uses a readable secret by reference, and only through its release: an egress rule
//! declares headers the host sets on every request to its destination
//! (`network.egress[].headers`, e.g. `authorization: "Bearer ${secret:api-token}"`), and the
//! host substitutes the references in those templates, and nowhere else, as the request
//! leaves ([`CallSecrets::sending_headers`]). Text the tool writes into a request (its URL,
//! headers and body, which may carry what its caller passed) is sent exactly as written:
//! `${secret:NAME}` there is not a reference, so a caller cannot make the host put a value
//! where the caller's text goes. A header of a declared name the tool writes is dropped; the
//! declared one is sent.
//!
//! Every value of the call, readable or revealable, is kept out of what the tool reads back
//! and of everything recorded: a response, the tool's output and every recorded message have
//! each occurrence replaced by its reference ([`CallSecrets::redact`]); what the call returns
//! to its caller is also scrubbed of the values' encodings ([`CallSecrets::scrub_output`],
//! [`toolgrid_core::secret::scrub`]). Headers that carry credentials are recorded as a digest
//! of what was written ([`recorded_headers`]): the declared template, not its value, so the
//! oplog never holds them and a replay still matches them, across a rotation of the secret
//! too.
//!
//! These are pure functions over the call's secrets; [`super::http`] applies them.

use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;
use toolgrid_core::secret::SecretValue;
use toolgrid_core::secret::scrub::Scrubber;

pub use toolgrid_core::secret::reference::REFERENCE_OPEN;

/// Headers always recorded as a digest, whatever they hold.
pub const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

/// The reference text of a secret key.
pub fn reference(name: &str) -> String {
    format!("{REFERENCE_OPEN}{name}}}")
}

/// A declared header's reference the host cannot substitute: unknown to the call, or
/// malformed. The request is refused and never leaves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error(
        "the release's egress headers refer to ${{secret:{0}}}, which is not a secret this \
         call may use (its binding grants no such key)"
    )]
    Unknown(String),
    #[error(
        "a header the release declares holds a malformed secret reference at byte {0} \
         (write ${{secret:NAME}}, NAME of letters, digits, '-', '_' and '.')"
    )]
    Malformed(usize),
    #[error(
        "the release's declared headers would add more than {0} bytes to the request once \
         their secret references are substituted"
    )]
    TooLarge(usize),
}

/// The most bytes substituting references may add to one request's declared headers
/// together.
pub const SUBSTITUTION_ALLOWANCE: usize = 1 << 20;

/// Whether `text` holds anything that looks like a reference (well-formed or not).
pub fn has_reference(text: &str) -> bool {
    text.contains(REFERENCE_OPEN)
}

/// Whether a header is recorded as a digest by its name alone.
pub fn is_credential_header(name: &str) -> bool {
    CREDENTIAL_HEADERS
        .iter()
        .any(|credential| name.eq_ignore_ascii_case(credential))
}

/// The digest a credential header is recorded as: `sha256:<hex>` of the value as the tool
/// wrote it (with its references, not their values).
pub fn header_digest(written: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(written.as_bytes())))
}

fn valid_name(name: &str) -> bool {
    toolgrid_core::secret::reference::valid_key(name)
}

/// The secret values of one call: every key its binding grants, readable or revealable.
/// All of them may be referred to, and all of them are redacted. `Debug` shows the keys.
#[derive(Clone, Default)]
pub struct CallSecrets {
    values: BTreeMap<String, SecretValue>,
    /// Non-empty values with their references, longest value first, so that a value that
    /// contains another is replaced whole.
    redactions: Vec<(Vec<u8>, String)>,
    /// The values and their encodings, for what the call returns to its caller.
    scrubber: Scrubber,
}

impl std::fmt::Debug for CallSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSecrets")
            .field("keys", &self.values.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl CallSecrets {
    pub fn new(values: BTreeMap<String, SecretValue>) -> Self {
        let mut redactions: Vec<(Vec<u8>, String)> = values
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| (value.expose().to_vec(), reference(name)))
            .collect();
        redactions.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.1.cmp(&b.1)));
        let scrubber = Scrubber::new(values.values());
        CallSecrets {
            values,
            redactions,
            scrubber,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Replaces every `${secret:NAME}` in `text` with the value of NAME. A reference to a
    /// key the call does not have, or a malformed one, refuses the whole text. Substituted
    /// values are not scanned again.
    pub fn substitute<'a>(&self, text: &'a str) -> Result<Cow<'a, str>, ReferenceError> {
        let mut unbounded = usize::MAX;
        self.substitute_within(text, &mut unbounded)
    }

    /// [`CallSecrets::substitute`], adding at most `budget` bytes (what it adds is taken
    /// from the budget).
    fn substitute_within<'a>(
        &self,
        text: &'a str,
        budget: &mut usize,
    ) -> Result<Cow<'a, str>, ReferenceError> {
        if !has_reference(text) {
            return Ok(Cow::Borrowed(text));
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut offset = 0;
        while let Some(at) = rest.find(REFERENCE_OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + REFERENCE_OPEN.len()..];
            let Some(close) = after.find('}') else {
                return Err(ReferenceError::Malformed(offset + at));
            };
            let name = &after[..close];
            if !valid_name(name) {
                return Err(ReferenceError::Malformed(offset + at));
            }
            let Some(value) = self.values.get(name) else {
                return Err(ReferenceError::Unknown(name.to_string()));
            };
            let added = value
                .expose()
                .len()
                .saturating_sub(REFERENCE_OPEN.len() + name.len() + 1);
            *budget = budget
                .checked_sub(added)
                .ok_or(ReferenceError::TooLarge(SUBSTITUTION_ALLOWANCE))?;
            // Values reach a worker as text (the `Assign` message's strings).
            out.push_str(&String::from_utf8_lossy(value.expose()));
            let consumed = at + REFERENCE_OPEN.len() + close + 1;
            offset += consumed;
            rest = &rest[consumed..];
        }
        out.push_str(rest);
        Ok(Cow::Owned(out))
    }

    /// `bytes` with every occurrence of a secret value replaced by its reference. The
    /// result is longer than `bytes` by at most [`CallSecrets::growth_bound`].
    pub fn redact<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let Some(first) = self.find(bytes, 0) else {
            return Cow::Borrowed(bytes);
        };
        let mut out = Vec::with_capacity(bytes.len());
        let mut copied = 0;
        let mut next = Some(first);
        while let Some((at, index)) = next {
            let (value, reference) = &self.redactions[index];
            out.extend_from_slice(&bytes[copied..at]);
            out.extend_from_slice(reference.as_bytes());
            copied = at + value.len();
            next = self.find(bytes, copied);
        }
        out.extend_from_slice(&bytes[copied..]);
        Cow::Owned(out)
    }

    /// What the call returns to its caller (output, error messages, progress): every value
    /// replaced by its reference ([`CallSecrets::redact`]), then every encoded form of a value
    /// (hex, base64, percent-encoding) replaced by `[secret]`
    /// ([`toolgrid_core::secret::scrub`]). Longer than `bytes` by at most
    /// [`CallSecrets::growth_bound`].
    pub fn scrub_output<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        match self.redact(bytes) {
            Cow::Borrowed(bytes) => self.scrubber.scrub(bytes),
            Cow::Owned(redacted) => Cow::Owned(self.scrubber.scrub(&redacted).into_owned()),
        }
    }

    /// [`CallSecrets::scrub_output`] for text.
    pub fn scrub_output_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.scrub_output(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        }
    }

    /// [`CallSecrets::redact`] for text.
    pub fn redact_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            // Values and references are whole UTF-8 strings, so the result is UTF-8 too.
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        }
    }

    /// The most bytes redacting `len` bytes can add: every value replaced by a longer
    /// reference, as often as it fits.
    pub fn growth_bound(&self, len: usize) -> usize {
        self.redactions
            .iter()
            .filter(|(value, reference)| reference.len() > value.len())
            .map(|(value, reference)| (len / value.len()) * (reference.len() - value.len()))
            .max()
            .unwrap_or(0)
    }

    /// The first occurrence of any value at or after `from`: its position and which value
    /// (the longest one that starts there).
    fn find(&self, bytes: &[u8], from: usize) -> Option<(usize, usize)> {
        if self.redactions.is_empty() {
            return None;
        }
        (from..bytes.len()).find_map(|at| {
            let rest = &bytes[at..];
            self.redactions
                .iter()
                .position(|(value, _)| rest.starts_with(value))
                .map(|index| (at, index))
        })
    }

    /// The headers of a request as they are sent: the tool's `written` headers as written
    /// (`${secret:...}` in them is not substituted), except those of a name the release
    /// `declared` for the destination, then the declared ones with their references
    /// substituted.
    pub fn sending_headers(
        &self,
        written: &[(String, String)],
        declared: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, ReferenceError> {
        let mut budget = SUBSTITUTION_ALLOWANCE;
        let mut headers: Vec<(String, String)> = written
            .iter()
            .filter(|(name, _)| !is_declared(declared, name))
            .cloned()
            .collect();
        for (name, template) in declared {
            headers.push((
                name.clone(),
                self.substitute_within(template, &mut budget)?.into_owned(),
            ));
        }
        Ok(headers)
    }
}

/// Whether the release declares a header of this name (names compare case-insensitively).
fn is_declared(declared: &BTreeMap<String, String>, name: &str) -> bool {
    declared.keys().any(|d| d.eq_ignore_ascii_case(name))
}

/// A request's headers as the oplog records them, and which of them are digests: what is
/// sent ([`CallSecrets::sending_headers`]), but each declared header as [`header_digest`] of
/// its template (never its value); a credential header the tool wrote, or one whose value
/// holds reference text (or a value, once redacted), as [`header_digest`] of what the tool
/// wrote; any other header as written, with secret values redacted.
pub fn recorded_headers(
    headers: &[(String, String)],
    declared: &BTreeMap<String, String>,
    secrets: &CallSecrets,
) -> (Vec<(String, String)>, Vec<u32>) {
    let mut recorded = Vec::with_capacity(headers.len() + declared.len());
    let mut digested = Vec::new();
    for (name, value) in headers
        .iter()
        .filter(|(name, _)| !is_declared(declared, name))
    {
        let written = secrets.redact_text(value);
        if is_credential_header(name) || has_reference(&written) {
            digested.push(recorded.len() as u32);
            recorded.push((name.clone(), header_digest(&written)));
        } else {
            recorded.push((name.clone(), written.into_owned()));
        }
    }
    for (name, template) in declared {
        digested.push(recorded.len() as u32);
        recorded.push((name.clone(), header_digest(template)));
    }
    (recorded, digested)
}

/// The credential headers of a recorded request, by lower-case name and digest, in order:
/// what a replay must match. Headers recorded before digests existed (a credential header
/// in plaintext, in an old oplog) are digested here, so they match too.
pub fn credential_digests(headers: &[(String, String)], digested: &[u32]) -> Vec<(String, String)> {
    headers
        .iter()
        .enumerate()
        .filter_map(|(index, (name, value))| {
            if digested.contains(&(index as u32)) {
                Some((name.to_ascii_lowercase(), value.clone()))
            } else if is_credential_header(name) {
                Some((name.to_ascii_lowercase(), header_digest(value)))
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(pairs: &[(&str, &str)]) -> CallSecrets {
        CallSecrets::new(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), SecretValue::new(*v)))
                .collect(),
        )
    }

    #[test]
    fn references_are_substituted_and_unknown_or_malformed_ones_refused() {
        let s = secrets(&[("api-token", "s3cr3t"), ("user.name", "bob")]);
        assert_eq!(
            s.substitute("Bearer ${secret:api-token}").unwrap(),
            "Bearer s3cr3t"
        );
        assert_eq!(
            s.substitute("http://h/x?k=${secret:api-token}&u=${secret:user.name}")
                .unwrap(),
            "http://h/x?k=s3cr3t&u=bob"
        );
        assert!(matches!(
            s.substitute("no references here").unwrap(),
            Cow::Borrowed(_)
        ));
        // Not a reference: only `${secret:` opens one.
        assert_eq!(
            s.substitute("${other} $secret").unwrap(),
            "${other} $secret"
        );
        assert_eq!(
            s.substitute("Bearer ${secret:nope}").unwrap_err(),
            ReferenceError::Unknown("nope".into())
        );
        assert_eq!(
            s.substitute("x ${secret:api-token").unwrap_err(),
            ReferenceError::Malformed(2)
        );
        assert_eq!(
            s.substitute("${secret:api-token}${secret:}").unwrap_err(),
            ReferenceError::Malformed(19)
        );
        assert!(matches!(
            s.substitute("${secret:a b}"),
            Err(ReferenceError::Malformed(0))
        ));
        // A substituted value is not scanned again.
        let tricky = secrets(&[("a", "${secret:b}"), ("b", "x")]);
        assert_eq!(tricky.substitute("${secret:a}").unwrap(), "${secret:b}");
        // The refusal names the key, never a value.
        let message = s.substitute("${secret:nope}").unwrap_err().to_string();
        assert!(
            message.contains("${secret:nope}") && !message.contains("s3cr3t"),
            "{message}"
        );
    }

    #[test]
    fn debug_shows_keys_never_values() {
        let s = secrets(&[("api-token", "s3cr3t")]);
        let text = format!("{s:?}");
        assert!(
            text.contains("api-token") && !text.contains("s3cr3t"),
            "{text}"
        );
    }

    fn declared(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn what_references_add_to_a_request_is_bounded() {
        let big = "x".repeat(300 << 10);
        let s = secrets(&[("big", &big)]);
        let three = "${secret:big}".repeat(3);
        let headers = s.sending_headers(&[], &declared(&[("a", &three)])).unwrap();
        assert_eq!(headers[0].1.len(), 3 * big.len());
        // The budget is per request, over all declared headers together.
        assert_eq!(
            s.sending_headers(&[], &declared(&[("a", &three), ("b", "${secret:big}")])),
            Err(ReferenceError::TooLarge(SUBSTITUTION_ALLOWANCE))
        );
    }

    #[test]
    fn only_declared_headers_are_substituted_and_they_win_over_written_ones() {
        let s = secrets(&[("api-token", "s3cr3t-token")]);
        let written = vec![
            // What a caller smuggled through the tool: sent as written.
            ("x-input".to_string(), "${secret:api-token}".to_string()),
            // A header of the declared name the tool wrote: dropped.
            (
                "Authorization".to_string(),
                "Bearer ${secret:api-token}".to_string(),
            ),
            ("accept".to_string(), "text/plain".to_string()),
        ];
        let sent = s
            .sending_headers(
                &written,
                &declared(&[("authorization", "Bearer ${secret:api-token}")]),
            )
            .unwrap();
        assert_eq!(
            sent,
            vec![
                ("x-input".to_string(), "${secret:api-token}".to_string()),
                ("accept".to_string(), "text/plain".to_string()),
                (
                    "authorization".to_string(),
                    "Bearer s3cr3t-token".to_string()
                ),
            ]
        );
        // Without a declaration nothing is substituted, whatever the tool wrote.
        assert_eq!(
            s.sending_headers(&written, &BTreeMap::new()).unwrap(),
            written
        );
        // A declared reference the call does not have refuses the request.
        assert_eq!(
            s.sending_headers(&[], &declared(&[("x-key", "${secret:other}")])),
            Err(ReferenceError::Unknown("other".into()))
        );
    }

    #[test]
    fn output_is_scrubbed_of_values_and_their_encodings() {
        let s = secrets(&[("api-token", "s3cr3t-token"), ("short", "abc")]);
        let text = format!(
            "raw s3cr3t-token hex {} b64 {} short abc",
            hex::encode("s3cr3t-token"),
            "czNjcjN0LXRva2Vu"
        );
        assert_eq!(
            s.scrub_output_text(&text),
            "raw ${secret:api-token} hex [secret] b64 [secret] short ${secret:short}"
        );
        let worst = "s3cr3t-token".repeat(50);
        assert!(
            s.scrub_output(worst.as_bytes()).len() <= worst.len() + s.growth_bound(worst.len())
        );
    }

    #[test]
    fn every_value_is_redacted_to_its_reference() {
        let s = secrets(&[
            ("token", "s3cr3t"),
            ("long", "s3cr3t-and-more"),
            ("empty", ""),
        ]);
        assert_eq!(
            s.redact_text("a s3cr3t b s3cr3t-and-more c s3cr3ts3cr3t"),
            "a ${secret:token} b ${secret:long} c ${secret:token}${secret:token}"
        );
        assert!(matches!(s.redact_text("nothing secret"), Cow::Borrowed(_)));
        assert_eq!(
            &s.redact(b"\x00\xffs3cr3t\x01")[..],
            b"\x00\xff${secret:token}\x01"
        );
        // An empty value redacts nothing.
        assert_eq!(s.redact_text(""), "");
        // The growth bound holds for the worst case.
        let worst = "s3cr3t".repeat(100);
        let redacted = s.redact_text(&worst);
        assert!(redacted.len() - worst.len() <= s.growth_bound(worst.len()));
        assert!(!redacted.contains("s3cr3t"));
        assert_eq!(CallSecrets::default().growth_bound(1000), 0);
    }

    #[test]
    fn credential_headers_are_recorded_as_digests_of_what_the_tool_wrote() {
        let s = secrets(&[("api-token", "s3cr3t"), ("shown", "v4lue")]);
        let headers = vec![
            (
                "Authorization".to_string(),
                "Bearer ${secret:api-token}".to_string(),
            ),
            ("Cookie".to_string(), "plain=1".to_string()),
            ("X-Key".to_string(), "${secret:api-token}".to_string()),
            ("X-Shown".to_string(), "v4lue".to_string()),
            ("Content-Type".to_string(), "text/plain".to_string()),
        ];
        let (recorded, digested) = recorded_headers(&headers, &BTreeMap::new(), &s);
        assert_eq!(digested, [0, 1, 2, 3]);
        assert_eq!(recorded[0].1, header_digest("Bearer ${secret:api-token}"));
        assert_eq!(recorded[1].1, header_digest("plain=1"));
        // A revealed value written literally is digested as its reference: stable across a
        // rotation of the secret, and never the value.
        assert_eq!(recorded[3].1, header_digest("${secret:shown}"));
        assert_eq!(recorded[4], headers[4]);
        for (_, value) in &recorded {
            assert!(!value.contains("s3cr3t") && !value.contains("v4lue"));
        }
        assert!(recorded[0].1.starts_with("sha256:") && recorded[0].1.len() == 7 + 64);

        // Rotated values record the same.
        let rotated = secrets(&[("api-token", "n3w"), ("shown", "v4lue")]);
        assert_eq!(
            recorded_headers(&headers, &BTreeMap::new(), &rotated).0,
            recorded
        );

        // What a replay matches: credential headers only, by digest; an old oplog's
        // plaintext credential header is digested the same way.
        let digests = credential_digests(&recorded, &digested);
        assert_eq!(digests.len(), 4);
        assert_eq!(digests[0].0, "authorization");
        let old = vec![(
            "authorization".to_string(),
            "Bearer ${secret:api-token}".to_string(),
        )];
        assert_eq!(credential_digests(&old, &[])[0], digests[0]);
    }

    #[test]
    fn declared_headers_are_recorded_as_digests_of_their_templates() {
        let s = secrets(&[("api-token", "s3cr3t-token")]);
        let written = vec![
            ("authorization".to_string(), "Bearer mine".to_string()),
            ("x-plain".to_string(), "1".to_string()),
        ];
        let declared = declared(&[("Authorization", "Bearer ${secret:api-token}")]);
        let (recorded, digested) = recorded_headers(&written, &declared, &s);
        assert_eq!(
            recorded,
            vec![
                ("x-plain".to_string(), "1".to_string()),
                (
                    "Authorization".to_string(),
                    header_digest("Bearer ${secret:api-token}")
                ),
            ]
        );
        assert_eq!(digested, [1]);
    }
}

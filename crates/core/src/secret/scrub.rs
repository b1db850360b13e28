//! Scrubbing secret values out of what a call returns to its caller.
//!
//! A secret a tool uses by reference can still come back: an upstream that echoes the
//! request it received returns the header the host set, perhaps encoded. [`Scrubber`]
//! replaces every occurrence of a value, and of its common encodings, with [`SCRUBBED`]:
//!
//! - the value itself;
//! - its hexadecimal form, lower and upper case;
//! - its base64 and base64url forms, at each of the three alignments a value can have
//!   inside a longer encoded text (only the characters that depend on the value alone);
//! - its percent-encoded form (RFC 3986 unreserved bytes kept), `%XX` in upper and lower
//!   case.
//!
//! Only values of at least [`MIN_SCRUBBED_LEN`] bytes are scrubbed, so that short values do
//! not shred ordinary output; every encoded form is at least as long as [`SCRUBBED`], so
//! scrubbing never makes a text longer. The work is linear in the text (one automaton over
//! all forms); building it is bounded by [`MAX_SCRUBBED_LEN`] per value.
//!
//! This is a pure function over bytes; the sandbox applies it to a call's output, error
//! messages and progress before they are stored, and a front door can apply it to anything
//! else it shows a caller (`Scrubber::new(values).scrub(bytes)`).

use super::SecretValue;
use crate::call::{OplogEntry, OplogRecord};
use base64::Engine as _;
use std::borrow::Cow;

/// What a scrubbed value or encoding is replaced with.
pub const SCRUBBED: &str = "[secret]";

/// Values shorter than this are not scrubbed (they would match ordinary text).
pub const MIN_SCRUBBED_LEN: usize = 8;

/// Values longer than this are scrubbed by their first [`MAX_SCRUBBED_LEN`] bytes (and their
/// encodings): what it takes to build the automaton stays bounded, and a longer value still
/// cannot come back whole.
pub const MAX_SCRUBBED_LEN: usize = 4 << 10;

/// The compiled forms of a set of secret values. `Debug` shows how many forms, never one.
#[derive(Clone, Default)]
pub struct Scrubber {
    automaton: Option<regex::bytes::Regex>,
    forms: usize,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("forms", &self.forms)
            .finish_non_exhaustive()
    }
}

/// Every form of `value` that is scrubbed (see the module's documentation).
pub fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    if value.len() < MIN_SCRUBBED_LEN {
        return Vec::new();
    }
    let value = &value[..value.len().min(MAX_SCRUBBED_LEN)];
    let mut out = vec![
        value.to_vec(),
        hex::encode(value).into_bytes(),
        hex::encode_upper(value).into_bytes(),
        percent_encoded(value, b"0123456789ABCDEF"),
        percent_encoded(value, b"0123456789abcdef"),
    ];
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for shift in 0..3usize {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(value);
            let encoded = engine.encode(&shifted).into_bytes();
            // Characters whose six bits all come from the value.
            let start = (8 * shift).div_ceil(6);
            let end = (8 * (shift + value.len())) / 6;
            out.push(encoded[start..end].to_vec());
        }
    }
    out.sort();
    out.dedup();
    out
}

fn percent_encoded(value: &[u8], digits: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(b >> 4)],
                digits[usize::from(b & 15)],
            ]);
        }
    }
    out
}

impl Scrubber {
    /// The scrubber of `values` (values shorter than [`MIN_SCRUBBED_LEN`] are ignored).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a SecretValue>) -> Self {
        let mut all: Vec<Vec<u8>> = values
            .into_iter()
            .flat_map(|value| forms(value.expose()))
            .collect();
        // Longest first: where forms overlap, the longer one is replaced whole.
        all.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        all.dedup();
        if all.is_empty() {
            return Scrubber::default();
        }
        let mut pattern = String::from("(?-u:");
        for (i, form) in all.iter().enumerate() {
            if i > 0 {
                pattern.push('|');
            }
            for b in form {
                pattern.push_str(&format!("\\x{b:02X}"));
            }
        }
        pattern.push(')');
        let total: usize = all.iter().map(Vec::len).sum();
        let automaton = regex::bytes::RegexBuilder::new(&pattern)
            .unicode(false)
            .size_limit(total.saturating_mul(64).max(10 << 20))
            .dfa_size_limit(16 << 20)
            .build()
            // Only literal bytes: it cannot fail but by size, which the limit above allows
            // for; a scrubber that could not be built scrubs nothing rather than panic, and
            // says so to whoever checks `is_armed`.
            .ok();
        Scrubber {
            automaton,
            forms: all.len(),
        }
    }

    /// Whether there is anything to scrub (some value was long enough, and its forms
    /// compiled).
    pub fn is_armed(&self) -> bool {
        self.automaton.is_some()
    }

    /// `bytes` with every form of every value replaced by [`SCRUBBED`]; never longer.
    pub fn scrub<'b>(&self, bytes: &'b [u8]) -> Cow<'b, [u8]> {
        match &self.automaton {
            Some(automaton) => automaton.replace_all(bytes, SCRUBBED.as_bytes()),
            None => Cow::Borrowed(bytes),
        }
    }

    /// [`Scrubber::scrub`] for text (replacing whole forms of UTF-8 values keeps it UTF-8;
    /// a value that is not UTF-8 could cut a character, which is then replaced).
    pub fn scrub_text<'b>(&self, text: &'b str) -> Cow<'b, str> {
        match self.scrub(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            }),
        }
    }
}

impl Scrubber {
    /// Scrubs the text of an oplog entry that a tool or a peer wrote
    /// ([`OplogEntry::visit_written_text`]): a response body as bytes, the rest as text.
    pub fn scrub_entry(&self, entry: &mut OplogEntry) {
        if self.is_armed() {
            entry.visit_written_text(&mut |t| self.scrub_in_place(t), &mut |b| {
                self.scrub_bytes_in_place(b)
            });
        }
    }

    /// A stored oplog record with its entry scrubbed ([`Scrubber::scrub_entry`]); a payload
    /// that does not parse as its kind (a corrupted row) is scrubbed as one text.
    pub fn scrub_record(&self, record: &mut OplogRecord) {
        if self.is_armed() {
            record.rewrite_written_text(&mut |t| self.scrub_in_place(t), &mut |b| {
                self.scrub_bytes_in_place(b)
            });
        }
    }

    fn scrub_in_place(&self, text: &mut String) {
        if let Cow::Owned(scrubbed) = self.scrub_text(text) {
            *text = scrubbed;
        }
    }

    fn scrub_bytes_in_place(&self, bytes: &mut Vec<u8>) {
        if let Cow::Owned(scrubbed) = self.scrub(bytes) {
            *bytes = scrubbed;
        }
    }
}

/// `bytes` scrubbed of `values` (see [`Scrubber`]): for one-off use; build a [`Scrubber`]
/// once to scrub many texts.
pub fn scrub<'b>(bytes: &'b [u8], values: &[SecretValue]) -> Cow<'b, [u8]> {
    match Scrubber::new(values).scrub(bytes) {
        Cow::Borrowed(_) => Cow::Borrowed(bytes),
        Cow::Owned(out) => Cow::Owned(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

    const VALUE: &str = "s3cr3t-value-7Qx9";

    fn scrubber(values: &[&str]) -> Scrubber {
        let values: Vec<SecretValue> = values.iter().map(|v| SecretValue::new(*v)).collect();
        Scrubber::new(&values)
    }

    #[track_caller]
    fn assert_gone(out: &[u8], value: &[u8]) {
        for form in forms(value) {
            assert!(
                !out.windows(form.len()).any(|w| w == form.as_slice()),
                "a form of the value survived: {}",
                String::from_utf8_lossy(out)
            );
        }
    }

    #[test]
    fn an_oplog_record_keeps_its_shape_and_loses_the_value() {
        use crate::call::{HttpResponse, ProgressReport};
        let s = scrubber(&[VALUE]);
        let record = |entry: OplogEntry| OplogRecord {
            seq: 3,
            epoch: 1,
            kind: entry.kind().to_string(),
            payload: entry.payload_text(),
            recorded_at_ms: 0,
        };
        let mut response = record(OplogEntry::HttpResponse(HttpResponse {
            seq: 1,
            status: 200,
            headers: vec![("x-echo".into(), format!("Bearer {VALUE}"))],
            body: format!("{{\"echo\":\"{}\"}}", STANDARD.encode(VALUE)).into_bytes(),
        }));
        s.scrub_record(&mut response);
        let Ok(OplogEntry::HttpResponse(scrubbed)) = response.entry() else {
            panic!("the scrubbed record no longer parses: {response:?}");
        };
        assert_eq!(scrubbed.headers[0].1, "Bearer [secret]");
        assert!(
            scrubbed.body.starts_with(br#"{"echo":"[secret]"#),
            "{scrubbed:?}"
        );
        assert_gone(&scrubbed.body, VALUE.as_bytes());
        let mut progress = record(OplogEntry::Progress(ProgressReport {
            message: format!("using {VALUE}"),
        }));
        s.scrub_record(&mut progress);
        assert!(progress.payload.contains("using [secret]"), "{progress:?}");
        // A payload that does not parse is scrubbed as text.
        let mut broken = OplogRecord {
            payload: format!("not json {VALUE}"),
            ..progress.clone()
        };
        s.scrub_record(&mut broken);
        assert_eq!(broken.payload, "not json [secret]");
    }

    #[test]
    fn the_value_and_its_encodings_are_scrubbed() {
        let s = scrubber(&[VALUE]);
        let text = format!(
            "raw {VALUE} hex {} HEX {} b64 {} b64url {} pct {}",
            hex::encode(VALUE),
            hex::encode_upper(VALUE),
            STANDARD.encode(VALUE),
            URL_SAFE_NO_PAD.encode(VALUE),
            VALUE,
        );
        let out = s.scrub_text(&text);
        assert_gone(out.as_bytes(), VALUE.as_bytes());
        assert!(
            out.starts_with("raw [secret] hex [secret] HEX [secret] b64 [secret]"),
            "{out}"
        );
        // A value with reserved bytes, percent-encoded either way.
        let spaced = "a secret with spaces/and+slashes";
        let s = scrubber(&[spaced]);
        for encoded in [
            "a%20secret%20with%20spaces%2Fand%2Bslashes",
            "a%20secret%20with%20spaces%2fand%2bslashes",
        ] {
            assert_eq!(s.scrub_text(&format!("q={encoded}&x=1")), "q=[secret]&x=1");
        }
    }

    #[test]
    fn a_value_inside_a_longer_base64_text_is_scrubbed_at_every_alignment() {
        let s = scrubber(&[VALUE]);
        for prefix in ["", "a", "ab", "abc", "Authorization: Bearer "] {
            let whole = format!("{prefix}{VALUE}\" and more");
            for encoded in [STANDARD.encode(&whole), URL_SAFE_NO_PAD.encode(&whole)] {
                let out = s.scrub_text(&encoded);
                assert!(out.contains(SCRUBBED), "{prefix:?}: {out}");
                assert_gone(out.as_bytes(), VALUE.as_bytes());
                // What is left cannot be decoded back into the value.
                assert!(out.len() < encoded.len(), "{out}");
            }
        }
    }

    #[test]
    fn short_values_and_other_text_are_left_alone() {
        let s = scrubber(&["short", "1234567"]);
        assert!(!s.is_armed());
        assert!(matches!(
            s.scrub_text("a short 1234567 text"),
            Cow::Borrowed(_)
        ));
        let s = scrubber(&[VALUE]);
        assert!(matches!(
            s.scrub_text("nothing secret here"),
            Cow::Borrowed(_)
        ));
        assert!(matches!(Scrubber::default().scrub(b"x"), Cow::Borrowed(_)));
    }

    #[test]
    fn scrubbing_never_lengthens_and_takes_the_longest_form() {
        let s = scrubber(&["12345678", "12345678-and-longer"]);
        assert_eq!(
            s.scrub_text("x 12345678-and-longer y 12345678"),
            "x [secret] y [secret]"
        );
        let worst = "12345678".repeat(1000);
        let out = s.scrub_text(&worst);
        assert!(out.len() <= worst.len());
        assert_eq!(out, SCRUBBED.repeat(1000));
        // Binary around the value survives untouched.
        assert_eq!(
            &scrub(b"\x00\xff12345678\x01", &[SecretValue::new("12345678")])[..],
            b"\x00\xff[secret]\x01"
        );
    }

    #[test]
    fn a_very_long_value_is_scrubbed_by_its_bounded_prefix() {
        let long = "k".repeat(MAX_SCRUBBED_LEN) + "-tail-0123456789";
        let s = scrubber(&[&long]);
        let text = format!("<{long}>");
        let out = s.scrub_text(&text);
        assert!(!out.contains(&long), "the value came back whole");
        assert!(out.starts_with("<[secret]"), "{}", &out[..20]);
    }

    #[test]
    fn debug_shows_no_form() {
        let text = format!("{:?}", scrubber(&[VALUE]));
        assert!(
            !text.contains("s3cr3t") && !text.contains(&hex::encode(VALUE)),
            "{text}"
        );
    }
}

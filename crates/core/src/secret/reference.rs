//! Secret references in the header templates a release declares on an egress rule
//! (`network.egress[].headers`): `${secret:NAME}`, substituted by the host as a matching
//! request leaves. Only these templates are ever substituted; text a tool writes into a
//! request is sent as written.

/// What opens a reference: `${secret:NAME}`.
pub const REFERENCE_OPEN: &str = "${secret:";

/// Why a template does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "malformed secret reference at byte {0} (write ${{secret:NAME}}, NAME of letters, \
         digits, '-', '_' and '.')"
    )]
    Malformed(usize),
}

/// Whether `name` may be a secret key in a reference.
pub fn valid_key(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The keys `template` refers to, in order (repeats kept).
pub fn template_keys(template: &str) -> Result<Vec<&str>, TemplateError> {
    let mut keys = Vec::new();
    let mut rest = template;
    let mut offset = 0;
    while let Some(at) = rest.find(REFERENCE_OPEN) {
        let after = &rest[at + REFERENCE_OPEN.len()..];
        let name = after
            .find('}')
            .map(|close| &after[..close])
            .filter(|name| valid_key(name))
            .ok_or(TemplateError::Malformed(offset + at))?;
        keys.push(name);
        let consumed = at + REFERENCE_OPEN.len() + name.len() + 1;
        offset += consumed;
        rest = &rest[consumed..];
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_and_malformed_references_refused() {
        assert_eq!(
            template_keys("Bearer ${secret:api-token}").unwrap(),
            ["api-token"]
        );
        assert_eq!(
            template_keys("${secret:a}:${secret:b.c_d}${secret:a}").unwrap(),
            ["a", "b.c_d", "a"]
        );
        assert!(template_keys("plain ${other}").unwrap().is_empty());
        assert_eq!(
            template_keys("x ${secret:open").unwrap_err(),
            TemplateError::Malformed(2)
        );
        assert_eq!(
            template_keys("${secret:a}${secret:}").unwrap_err(),
            TemplateError::Malformed(11)
        );
        assert_eq!(
            template_keys("${secret:a b}").unwrap_err(),
            TemplateError::Malformed(0)
        );
    }
}

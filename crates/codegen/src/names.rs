//! Names and text in generated code: identifiers valid in the target language (cased,
//! keywords and clashes escaped), string literals and comments that cannot end early.

use std::collections::BTreeSet;

/// The target language's spelling rules for identifiers.
pub struct Lang {
    pub keywords: &'static [&'static str],
}

/// Identifiers handed out in one scope: valid, not a keyword, not taken twice.
pub struct Idents {
    lang: &'static Lang,
    taken: BTreeSet<String>,
}

impl Idents {
    pub fn new(lang: &'static Lang, reserved: &[&str]) -> Self {
        Idents {
            lang,
            taken: reserved.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A fresh identifier spelled from `base` (already cased): `_`-suffixed while it is a
    /// keyword or taken.
    pub fn claim(&mut self, base: &str) -> String {
        let mut ident: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if ident.is_empty() || ident.starts_with(|c: char| c.is_ascii_digit()) {
            ident.insert(0, '_');
        }
        while self.lang.keywords.contains(&ident.as_str()) || self.taken.contains(&ident) {
            ident.push('_');
        }
        self.taken.insert(ident.clone());
        ident
    }
}

fn words(name: &str) -> impl Iterator<Item = &str> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// `max-bytes` -> `max_bytes`.
pub fn snake(name: &str) -> String {
    words(name)
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("_")
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => {
            first.to_ascii_uppercase().to_string() + &chars.as_str().to_ascii_lowercase()
        }
        None => String::new(),
    }
}

/// `max-bytes` -> `maxBytes`.
pub fn camel(name: &str) -> String {
    let mut out = String::new();
    for (i, w) in words(name).enumerate() {
        if i == 0 {
            out.push_str(&w.to_ascii_lowercase());
        } else {
            out.push_str(&capitalized(w));
        }
    }
    out
}

/// `max-bytes` -> `MaxBytes`.
pub fn pascal(name: &str) -> String {
    words(name).map(capitalized).collect()
}

/// A double-quoted string literal with only printable ASCII inside: `"`, `\` and every
/// other character escaped (`\uXXXX`; above U+FFFF, `astral` spells it). Valid in Python
/// and in TypeScript, and it can never end a comment or a line.
pub fn quoted(text: &str, astral: fn(u32) -> String) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&astral(c as u32)),
        }
    }
    out.push('"');
    out
}

/// Text for a one-line comment: printable ASCII only, no `*/`.
pub fn comment_text(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { ' ' })
        .collect();
    flat.replace("*/", "* /")
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_LANG: Lang = Lang {
        keywords: &["class", "def"],
    };

    #[test]
    fn cases_and_identifiers() {
        assert_eq!(snake("max-bytes"), "max_bytes");
        assert_eq!(camel("max-bytes"), "maxBytes");
        assert_eq!(pascal("invalid-version"), "InvalidVersion");
        let mut ids = Idents::new(&TEST_LANG, &["self"]);
        assert_eq!(ids.claim("class"), "class_");
        assert_eq!(ids.claim("self"), "self_");
        assert_eq!(ids.claim("2fa"), "_2fa");
        assert_eq!(ids.claim(""), "_");
        assert_eq!(ids.claim("x"), "x");
        assert_eq!(ids.claim("x"), "x_");
    }

    #[test]
    fn literals_and_comments_cannot_escape() {
        let astral = |c: u32| format!("\\U{c:08x}");
        assert_eq!(quoted("a\"b\\c\nd", astral), r#""a\"b\\c\nd""#);
        assert_eq!(quoted("\u{2028}é😀", astral), r#""\u2028\u00e9\U0001f600""#);
        assert_eq!(comment_text("x */ y\n\u{2028}z"), "x * / y  z");
    }
}

//! Plain aligned tables, as `kubectl get` prints them.

/// Prints rows under headers, each column as wide as its widest cell.
pub fn print(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", render(headers, rows));
}

pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let text = super::render(
            &["NAME", "READY"],
            &[
                vec!["semver".into(), "True".into()],
                vec!["x".into(), "False".into()],
            ],
        );
        assert_eq!(text, "NAME     READY\nsemver   True\nx        False\n");
    }
}

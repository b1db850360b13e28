//! The console's HTML, rendered on the server from plain data (pure functions, no IO).
//!
//! Every value that comes from a call, its arguments, its oplog, a resource or a caller is
//! hostile: it reaches the page only through [`escape`]. The pages carry no script.

use super::timeline::Line;
use std::fmt::Write as _;
use toolgrid_store::CallRecord;

/// Text made safe for HTML element content and for double- or single-quoted attribute
/// values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment made safe for a URL inside an attribute (only unreserved characters
/// pass; everything else is percent-encoded).
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1b1b1b}\
header{background:#233;color:#fff;padding:.6em 1em;display:flex;gap:1.2em;align-items:center}\
header a{color:#fff}header form{margin-left:auto}main{padding:1em}\
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:.3em .5em;\
text-align:left;vertical-align:top}pre{margin:0;white-space:pre-wrap;word-break:break-all}\
.msg{padding:.6em;border:1px solid #c33;background:#fee;margin-bottom:1em}\
.ok{color:#060}.no{color:#a00}form.inline{display:inline}input[type=text]{width:14em}";

/// Who is signed in, as the header shows it, and the form token for POSTs.
pub struct Chrome<'a> {
    pub who: &'a str,
    pub csrf: &'a str,
}

/// A complete page: the header with navigation (when signed in), an optional error
/// message, and `body` (already escaped HTML).
pub fn page(title: &str, chrome: Option<&Chrome<'_>>, message: Option<&str>, body: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{} - toolgrid</title><style>{STYLE}</style></head><body><header>\
         <strong>toolgrid</strong>",
        escape(title)
    );
    if let Some(chrome) = chrome {
        let _ = write!(
            html,
            "<a href=\"/ui\">Awaiting approval</a><a href=\"/ui/calls\">Calls</a>\
             <a href=\"/ui/agents\">Agents</a>\
             <form method=\"post\" action=\"/ui/logout\"><span id=\"who\">{}</span> \
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\" id=\"logout\">Log out</button></form>",
            escape(chrome.who),
            escape(chrome.csrf)
        );
    }
    let _ = write!(html, "</header><main><h1>{}</h1>", escape(title));
    if let Some(message) = message {
        let _ = write!(
            html,
            "<div class=\"msg\" id=\"message\">{}</div>",
            escape(message)
        );
    }
    html.push_str(body);
    html.push_str("</main></body></html>");
    html
}

/// The login form.
pub fn login(message: Option<&str>) -> String {
    page(
        "Log in",
        None,
        message,
        "<form method=\"post\" action=\"/ui/login\">\
         <label>Token <input type=\"password\" name=\"token\" id=\"token\" \
         autocomplete=\"off\" required></label> \
         <button type=\"submit\" id=\"login\">Log in</button></form>\
         <p>The admin token (<code>toolgrid up</code> writes it to its data directory) or an \
         agent's token.</p>",
    )
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rest = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// JSON pretty-printed, escaped, in a `<pre>`.
fn json_block(value: &serde_json::Value, id: Option<&str>) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    match id {
        Some(id) => format!("<pre id=\"{}\">{}</pre>", escape(id), escape(&text)),
        None => format!("<pre>{}</pre>", escape(&text)),
    }
}

fn agent_of(call: &CallRecord) -> String {
    match &call.spec.access.agent {
        Some(agent) => format!("{}/{agent}", call.namespace),
        None => call.spec.caller.clone(),
    }
}

fn call_link(call: &CallRecord) -> String {
    format!(
        "<a href=\"/ui/calls/{}\">{}</a>",
        path_segment(&call.id),
        escape(&call.id)
    )
}

/// The approve and deny forms for a call.
fn decide_forms(call_id: &str, csrf: &str) -> String {
    let action = format!("/ui/calls/{}/decide", path_segment(call_id));
    let mut html = String::new();
    for (decision, label) in [("approve", "Approve"), ("deny", "Deny")] {
        let _ = write!(
            html,
            "<form class=\"inline\" method=\"post\" action=\"{action}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"decision\" value=\"{decision}\">\
             <input type=\"text\" name=\"reason\" placeholder=\"reason\" \
             id=\"{decision}-reason-{id}\" required> \
             <button type=\"submit\" id=\"{decision}-{id}\">{label}</button></form> ",
            csrf = escape(csrf),
            id = escape(call_id),
        );
    }
    html
}

/// Calls waiting for approval, with approve and deny forms.
pub fn awaiting(calls: &[CallRecord], csrf: &str) -> String {
    if calls.is_empty() {
        return "<p id=\"none\">No call is waiting for approval.</p>".into();
    }
    let mut html = String::from(
        "<table id=\"awaiting\"><tr><th>Call</th><th>Agent</th><th>Tool</th><th>Command</th>\
         <th>Arguments</th><th>Asked by</th><th>Waiting since</th><th>Times out</th>\
         <th>Decide</th></tr>",
    );
    for call in calls {
        let approval = call.spec.chain.approval.as_ref();
        let _ = write!(
            html,
            "<tr class=\"call\" id=\"call-{}\"><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td>\
             <td>{}</td><td class=\"middleware\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&call.id),
            call_link(call),
            escape(&agent_of(call)),
            escape(&call.namespace),
            escape(&call.tool),
            escape(&call.command),
            json_block(&call.args, None),
            escape(approval.map(|a| a.middleware.as_str()).unwrap_or("")),
            escape(&time(call.created_at_ms)),
            escape(
                &approval
                    .map(|a| format!("{} ({})", time(a.deadline_ms), on_timeout(a)))
                    .unwrap_or_default()
            ),
            decide_forms(&call.id, csrf),
        );
    }
    html.push_str("</table>");
    html
}

fn on_timeout(wait: &toolgrid_core::call::ApprovalWait) -> &'static str {
    match wait.on_timeout {
        toolgrid_core::call::TimeoutAction::Deny => "then denied",
        toolgrid_core::call::TimeoutAction::Allow => "then allowed",
    }
}

/// Recent calls.
pub fn calls(calls: &[CallRecord]) -> String {
    if calls.is_empty() {
        return "<p>No calls yet.</p>".into();
    }
    let mut html = String::from(
        "<table id=\"calls\"><tr><th>Call</th><th>State</th><th>Agent</th><th>Tool</th>\
         <th>Command</th><th>Created</th></tr>",
    );
    for call in calls {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
            call_link(call),
            escape(call.state.as_str()),
            escape(&agent_of(call)),
            escape(&call.namespace),
            escape(&call.tool),
            escape(&call.command),
            escape(&time(call.created_at_ms)),
        );
    }
    html.push_str("</table>");
    html
}

/// One call: its summary, the decision forms while it waits, and its timeline.
pub fn call(call: &CallRecord, lines: &[Line], csrf: &str) -> String {
    let mut html = String::from("<table id=\"summary\">");
    let mut row = |name: &str, value: String| {
        let _ = write!(html, "<tr><th>{}</th><td>{value}</td></tr>", escape(name));
    };
    row(
        "State",
        format!("<span id=\"state\">{}</span>", escape(call.state.as_str())),
    );
    row("Agent", escape(&agent_of(call)));
    row("Caller", escape(&call.spec.caller));
    row(
        "Tool",
        escape(&format!(
            "{}/{} {}",
            call.namespace, call.tool, call.command
        )),
    );
    row("Release", escape(&call.release));
    row("Arguments", json_block(&call.args, Some("args")));
    row("Created", escape(&time(call.created_at_ms)));
    if let Some(wait) = &call.spec.chain.approval {
        row(
            "Approval asked by",
            format!(
                "<span class=\"middleware\">{}</span>, times out {} ({})",
                escape(&wait.middleware),
                escape(&time(wait.deadline_ms)),
                on_timeout(wait)
            ),
        );
    }
    if let Some(decided) = &call.spec.chain.approved {
        row(
            "Approval",
            escape(&format!(
                "{} by {}: {}",
                if decided.approved {
                    "approved"
                } else {
                    "denied"
                },
                decided.by,
                decided.reason
            )),
        );
    }
    if let Some(result) = &call.result {
        row("Result", json_block(result, Some("result")));
    }
    if let Some(error) = &call.error {
        row(
            "Error",
            format!(
                "<span id=\"error\">{}: {}</span>",
                escape(error.kind.as_str()),
                escape(&error.message)
            ),
        );
    }
    html.push_str("</table>");
    if call.state == toolgrid_core::call::CallState::AwaitingApproval {
        html.push_str("<h2>Decide</h2>");
        html.push_str(&decide_forms(&call.id, csrf));
    }
    html.push_str(
        "<h2>Timeline</h2><table id=\"timeline\"><tr><th>#</th><th>+ms</th><th>Kind</th>\
         <th>What happened</th></tr>",
    );
    for line in lines {
        let _ = write!(
            html,
            "<tr class=\"entry\" data-kind=\"{kind}\"><td>{}</td><td>{}</td><td>{kind}</td>\
             <td>{}</td></tr>",
            line.seq,
            line.offset_ms,
            escape(&line.summary),
            kind = escape(&line.kind),
        );
    }
    html.push_str("</table>");
    html
}

/// Agents as rows of `(namespace, name, ready, message)`.
pub fn agents(rows: &[(String, String, String, String)]) -> String {
    if rows.is_empty() {
        return "<p>No agents.</p>".into();
    }
    let mut html =
        String::from("<table id=\"agents\"><tr><th>Agent</th><th>Ready</th><th>Message</th></tr>");
    for (namespace, name, ready, message) in rows {
        let _ = write!(
            html,
            "<tr><td><a href=\"/ui/agents/{}/{}\">{}/{}</a></td><td>{}</td><td>{}</td></tr>",
            path_segment(namespace),
            path_segment(name),
            escape(namespace),
            escape(name),
            escape(ready),
            escape(message)
        );
    }
    html.push_str("</table>");
    html
}

/// The tools an agent may call and why not the others.
pub fn access(access: &[crate::gateway::authz::ToolAccess]) -> String {
    if access.is_empty() {
        return "<p>No tools in this namespace.</p>".into();
    }
    let mut html = String::from(
        "<table id=\"access\"><tr><th>Tool</th><th>May call</th><th>Binding</th>\
         <th>Release / commands, or why not</th></tr>",
    );
    for tool in access {
        match &tool.verdict {
            Ok(allowed) => {
                let _ = write!(
                    html,
                    "<tr><td>{}</td><td class=\"ok\">yes</td><td>{}</td><td>{}: {}</td></tr>",
                    escape(&tool.tool),
                    escape(&allowed.binding.name),
                    escape(&allowed.release.name),
                    escape(&allowed.commands.join(", "))
                );
            }
            Err(refusal) => {
                let _ = write!(
                    html,
                    "<tr><td>{}</td><td class=\"no\">no ({})</td><td>{}</td><td>{}</td></tr>",
                    escape(&tool.tool),
                    escape(refusal.cause()),
                    escape(refusal.binding().unwrap_or("")),
                    escape(&refusal.to_string())
                );
            }
        }
    }
    html.push_str("</table>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(path_segment("a b/\"<x>"), "a%20b%2F%22%3Cx%3E");
        assert_eq!(path_segment("0193-ab_c.d~"), "0193-ab_c.d~");
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time(1_709_251_199_000), "2024-02-29 23:59:59 UTC");
        assert_eq!(time(1_764_547_200_000), "2025-12-01 00:00:00 UTC");
    }

    #[test]
    fn a_page_escapes_its_title_and_message() {
        let html = page("<t>", None, Some("<m>"), "");
        assert!(html.contains("&lt;t&gt;"));
        assert!(html.contains("&lt;m&gt;"));
        assert!(!html.contains("<t>") && !html.contains("<m>"));
    }
}

//! The egress policy of a release: which destinations a tool may reach.
//!
//! Nothing is reachable unless a rule names its host and port. Destinations are checked by
//! the addresses they resolve to, and the request then connects to exactly those addresses,
//! so DNS rebinding cannot slip past: a name that resolves to a loopback, private,
//! link-local (cloud metadata) or otherwise special address is refused unless its rule says
//! `allowPrivate`.

use std::net::{IpAddr, SocketAddr};
use toolgrid_core::net::{Class, classify};
use toolgrid_core::spec::EgressRule;

/// Where a request may go, decided before it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Connect to these addresses (and only these) for `host`.
    Allowed {
        host: String,
        addrs: Vec<SocketAddr>,
    },
    Denied(String),
    /// The host does not resolve: not a refusal, a failure to reach it.
    Unresolved(String),
}

/// The rules of one release.
#[derive(Clone, Debug, Default)]
pub struct Egress {
    rules: Vec<EgressRule>,
}

/// Ports a rule allows when it lists none.
const DEFAULT_PORTS: [u16; 2] = [80, 443];

impl Egress {
    pub fn new(rules: Vec<EgressRule>) -> Self {
        Egress { rules }
    }

    fn rule_for(&self, host: &str, port: u16) -> Option<&EgressRule> {
        self.rules.iter().find(|rule| {
            let ports_ok = if rule.ports.is_empty() {
                DEFAULT_PORTS.contains(&port)
            } else {
                rule.ports.contains(&port)
            };
            ports_ok && host_matches(&rule.host, host)
        })
    }

    /// Whether a rule names the URL's scheme, host and port (without resolving it): the
    /// check made before a request body is read.
    pub fn admits(&self, url: &url::Url) -> Result<(), String> {
        self.rule_of(url).map(|_| ())
    }

    /// The headers the release declares for the URL's destination (`network.egress[].headers`
    /// of the first rule that admits it): the only text the host substitutes references in.
    pub fn declared_headers(&self, url: &url::Url) -> std::collections::BTreeMap<String, String> {
        self.rule_of(url)
            .map(|(_, _, rule)| rule.headers.clone())
            .unwrap_or_default()
    }

    fn rule_of(&self, url: &url::Url) -> Result<(String, u16, &EgressRule), String> {
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(format!(
                "scheme {scheme:?} is not allowed (use http or https)"
            ));
        }
        let Some(host) = url.host_str() else {
            return Err("the URL has no host".into());
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let Some(port) = url.port_or_known_default() else {
            return Err("the URL has no port".into());
        };
        let Some(rule) = self.rule_for(&host, port) else {
            return Err(format!(
                "egress to {host}:{port} is not allowed by the release's network.egress"
            ));
        };
        Ok((host, port, rule))
    }

    /// Checks a URL: scheme, rule, and every address the host resolves to.
    pub async fn check(&self, url: &url::Url) -> Verdict {
        let (host, port, rule) = match self.rule_of(url) {
            Ok(found) => found,
            Err(reason) => return Verdict::Denied(reason),
        };
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match tokio::net::lookup_host((host.as_str(), port)).await {
                Ok(addrs) => addrs.collect(),
                Err(error) => {
                    return Verdict::Unresolved(format!("cannot resolve {host}: {error}"));
                }
            },
        };
        if addrs.is_empty() {
            return Verdict::Unresolved(format!("{host} resolves to no address"));
        }
        if !rule.allow_private
            && let Some((bad, name)) = addrs.iter().find_map(|a| match classify(a.ip()) {
                Class::Restricted { name } => Some((a.ip(), name)),
                Class::Public => None,
            })
        {
            return Verdict::Denied(format!(
                "{host} resolves to {bad} ({name}), a loopback, private, link-local or reserved \
                 address (allow it with allowPrivate on its egress rule)"
            ));
        }
        Verdict::Allowed { host, addrs }
    }
}

/// `example.org` matches itself; `*.example.org` matches its subdomains; `*` matches all.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim().to_ascii_lowercase();
    let pattern = pattern.trim_start_matches('[').trim_end_matches(']');
    if pattern == "*" {
        return true;
    }
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host[..host.len() - suffix.len()].ends_with('.')
        }
        None => pattern == host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, ports: &[u16], allow_private: bool) -> EgressRule {
        EgressRule {
            host: host.into(),
            ports: ports.to_vec(),
            allow_private,
            headers: Default::default(),
        }
    }

    #[test]
    fn host_patterns() {
        assert!(host_matches("example.org", "example.org"));
        assert!(host_matches("Example.ORG", "example.org"));
        assert!(!host_matches("example.org", "api.example.org"));
        assert!(host_matches("*.example.org", "api.example.org"));
        assert!(host_matches("*.example.org", "a.b.example.org"));
        assert!(!host_matches("*.example.org", "example.org"));
        assert!(!host_matches("*.example.org", "badexample.org"));
        assert!(host_matches("*", "anything.test"));
        assert!(host_matches("10.0.0.1", "10.0.0.1"));
    }

    #[test]
    fn declared_headers_belong_to_the_rule_that_admits_the_destination() {
        let mut api = rule("api.example.org", &[443], false);
        api.headers
            .insert("authorization".into(), "Bearer ${secret:t}".into());
        let egress = Egress::new(vec![api, rule("*.example.org", &[443], false)]);
        let headers = |u: &str| egress.declared_headers(&url::Url::parse(u).unwrap());
        assert_eq!(
            headers("https://api.example.org/x")
                .get("authorization")
                .map(String::as_str),
            Some("Bearer ${secret:t}")
        );
        assert!(headers("https://other.example.org/").is_empty());
        assert!(
            headers("http://api.example.org/").is_empty(),
            "port 80: no rule"
        );
    }

    #[tokio::test]
    async fn checks_rules_ports_and_resolved_addresses() {
        let egress = Egress::new(vec![
            rule("localhost", &[8080], false),
            rule("127.0.0.1", &[8080], true),
            rule("10.9.9.9", &[], false),
            rule("*.example.org", &[443], false),
        ]);
        let check = |u: &str| {
            let url = url::Url::parse(u).unwrap();
            let egress = egress.clone();
            async move { egress.check(&url).await }
        };
        assert!(matches!(
            check("http://127.0.0.1:8080/x").await,
            Verdict::Allowed { .. }
        ));
        let Verdict::Denied(why) = check("http://localhost:8080/").await else {
            panic!("a name resolving to loopback")
        };
        assert!(why.contains("loopback"), "{why}");
        let Verdict::Denied(why) = check("http://10.9.9.9/").await else {
            panic!("a private address")
        };
        assert!(why.contains("private"), "{why}");
        let Verdict::Denied(why) = check("http://127.0.0.1:9090/").await else {
            panic!("another port")
        };
        assert!(why.contains("not allowed"), "{why}");
        let Verdict::Denied(why) = check("https://elsewhere.test/").await else {
            panic!("no rule")
        };
        assert!(why.contains("elsewhere.test:443"), "{why}");
        assert!(matches!(
            check("ftp://127.0.0.1:8080/").await,
            Verdict::Denied(_)
        ));
        assert!(
            matches!(check("http://api.example.org/").await, Verdict::Denied(_)),
            "port 80 is not in the rule"
        );
    }
}

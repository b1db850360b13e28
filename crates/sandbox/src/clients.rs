//! HTTP clients for guests' outgoing requests, built once per destination.
//!
//! Building a `reqwest::Client` loads the TLS trust roots: about 2.8 ms in a release build,
//! which every outgoing request paid. A client here is kept per destination as the egress
//! policy resolved it: the host name and the exact addresses it was checked against (a
//! client connects to those only), so a name that resolves elsewhere later gets a client
//! of its own and nothing reaches an address the policy did not check. Clients pool their
//! connections, so calls to the same destination also share keep-alive connections. Every
//! client follows no redirect and uses no proxy; a request's timeout is set per request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Destinations kept at most; past it the map starts again (a client is cheap to drop).
const MAX_CLIENTS: usize = 256;

/// Where a client connects: the host as written and the addresses the policy allowed
/// (none for an IP address, which is connected to as it is).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Destination {
    host: String,
    addrs: Vec<SocketAddr>,
}

fn clients() -> &'static Mutex<HashMap<Destination, reqwest::Client>> {
    static CLIENTS: OnceLock<Mutex<HashMap<Destination, reqwest::Client>>> = OnceLock::new();
    CLIENTS.get_or_init(Mutex::default)
}

/// The client for `host` pinned to `addrs` (the addresses the egress policy checked; a
/// host that is an IP address is not resolved at all).
pub(crate) fn for_destination(
    host: &str,
    addrs: &[SocketAddr],
) -> Result<reqwest::Client, reqwest::Error> {
    let is_ip = host.parse::<std::net::IpAddr>().is_ok();
    let mut addrs = if is_ip { Vec::new() } else { addrs.to_vec() };
    addrs.sort();
    let destination = Destination {
        host: host.to_string(),
        addrs,
    };
    if let Some(client) = clients()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&destination)
    {
        return Ok(client.clone());
    }
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none());
    if !is_ip {
        // Connect to exactly the addresses the policy checked.
        builder = builder.resolve_to_addrs(&destination.host, &destination.addrs);
    }
    let client = builder.build()?;
    let mut kept = clients().lock().unwrap_or_else(PoisonError::into_inner);
    if kept.len() >= MAX_CLIENTS {
        kept.clear();
    }
    kept.insert(destination, client.clone());
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_destination_keeps_its_client_and_other_addresses_get_another() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let a = [addr("10.0.0.1:443"), addr("10.0.0.2:443")];
        let first = for_destination("api.example", &a).unwrap();
        let again = for_destination("api.example", &[a[1], a[0]]).unwrap();
        let key = |addrs: &[SocketAddr]| Destination {
            host: "api.example".into(),
            addrs: {
                let mut v = addrs.to_vec();
                v.sort();
                v
            },
        };
        let kept = clients().lock().unwrap();
        assert!(
            kept.contains_key(&key(&a)),
            "kept under its sorted addresses"
        );
        drop(kept);
        // The same destination in another order is the same client (one entry).
        let moved = for_destination("api.example", &[addr("10.0.0.9:443")]).unwrap();
        let kept = clients().lock().unwrap();
        assert!(kept.contains_key(&key(&[addr("10.0.0.9:443")])));
        assert!(kept.contains_key(&key(&a)));
        drop((first, again, moved));
    }
}

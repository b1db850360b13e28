//! Network addresses the egress policy treats as non-public: a tool reaches them only
//! through an egress rule that says `allowPrivate` (the sandbox checks every address a host
//! resolves to), and the controller never downloads an artifact from them unless its
//! operator opted in (`--artifact-allow-private`).
//!
//! The classification is one table per family ([`V4_RANGES`], [`V6_RANGES`]) mirroring the
//! IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890, RFC 8190): every entry
//! whose "Globally Reachable" column is False or N/A is [`Treatment::Restricted`]; the
//! entries it marks True are listed too, as [`Treatment::Public`], because they sit inside
//! a restricted block (e.g. `192.0.0.9/32` inside `192.0.0.0/24`). Besides the registries:
//! multicast, the reserved `240.0.0.0/4`, the IPv6 space outside `2000::/3` that is not
//! allocated for global unicast (`fec0::/10` site-local among it), the tunnels `2002::/16`
//! (6to4) and `2001::/32` (Teredo), which lead to IPv4 addresses and are restricted whole,
//! and the forms that carry an IPv4 address in their last 32 bits (IPv4-mapped
//! `::ffff:0:0/96`, IPv4-compatible `::/96`, NAT64 `64:ff9b::/96`), which are judged by that
//! address ([`Treatment::EmbeddedIpv4`]).
//!
//! The most specific (longest) matching prefix decides. An address no entry matches is
//! public.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an entry of the tables means for the addresses in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Treatment {
    /// Not globally reachable (or N/A): refused without `allowPrivate`.
    Restricted,
    /// The registry says globally reachable: allowed, although a wider entry is not.
    Public,
    /// Judged by the IPv4 address in the last 32 bits.
    EmbeddedIpv4,
}

/// One special-purpose block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialRange<A> {
    pub prefix: A,
    pub len: u8,
    pub name: &'static str,
    /// Where the block comes from (the registry and the RFC).
    pub registry: &'static str,
    pub treatment: Treatment,
}

use Treatment::{EmbeddedIpv4, Public, Restricted};

#[allow(clippy::too_many_arguments)]
const fn v4(
    a: u8,
    b: u8,
    c: u8,
    d: u8,
    len: u8,
    name: &'static str,
    registry: &'static str,
    treatment: Treatment,
) -> SpecialRange<Ipv4Addr> {
    SpecialRange {
        prefix: Ipv4Addr::new(a, b, c, d),
        len,
        name,
        registry,
        treatment,
    }
}

const fn v6(
    segments: [u16; 8],
    len: u8,
    name: &'static str,
    registry: &'static str,
    treatment: Treatment,
) -> SpecialRange<Ipv6Addr> {
    let [a, b, c, d, e, f, g, h] = segments;
    SpecialRange {
        prefix: Ipv6Addr::new(a, b, c, d, e, f, g, h),
        len,
        name,
        registry,
        treatment,
    }
}

const IANA4: &str = "IANA IPv4 Special-Purpose Address Registry";
const IANA6: &str = "IANA IPv6 Special-Purpose Address Registry";

/// The IPv4 table: the IANA IPv4 Special-Purpose Address Registry (as of 2025), multicast
/// and the reserved `240.0.0.0/4`.
#[rustfmt::skip]
pub const V4_RANGES: &[SpecialRange<Ipv4Addr>] = &[
    v4(0, 0, 0, 0, 8, "this network", IANA4, Restricted), // RFC 791
    v4(0, 0, 0, 0, 32, "this host on this network", IANA4, Restricted), // RFC 1122
    v4(10, 0, 0, 0, 8, "private-use", IANA4, Restricted), // RFC 1918
    v4(100, 64, 0, 0, 10, "shared address space", IANA4, Restricted), // RFC 6598
    v4(127, 0, 0, 0, 8, "loopback", IANA4, Restricted),   // RFC 1122
    v4(169, 254, 0, 0, 16, "link-local", IANA4, Restricted), // RFC 3927; cloud metadata
    v4(172, 16, 0, 0, 12, "private-use", IANA4, Restricted), // RFC 1918
    v4(192, 0, 0, 0, 24, "IETF protocol assignments", IANA4, Restricted), // RFC 6890
    v4(192, 0, 0, 0, 29, "IPv4 service continuity prefix", IANA4, Restricted), // RFC 7335
    v4(192, 0, 0, 8, 32, "IPv4 dummy address", IANA4, Restricted), // RFC 7600
    v4(192, 0, 0, 9, 32, "port control protocol anycast", IANA4, Public), // RFC 7723
    v4(192, 0, 0, 10, 32, "TURN anycast", IANA4, Public), // RFC 8155
    v4(192, 0, 0, 170, 32, "NAT64/DNS64 discovery", IANA4, Restricted), // RFC 7050
    v4(192, 0, 0, 171, 32, "NAT64/DNS64 discovery", IANA4, Restricted), // RFC 7050
    v4(192, 0, 2, 0, 24, "documentation (TEST-NET-1)", IANA4, Restricted), // RFC 5737
    v4(192, 31, 196, 0, 24, "AS112-v4", IANA4, Public),   // RFC 7535
    v4(192, 52, 193, 0, 24, "AMT", IANA4, Public),        // RFC 7450
    v4(192, 88, 99, 0, 24, "deprecated 6to4 relay anycast", IANA4, Restricted), // RFC 7526, N/A
    v4(192, 88, 99, 2, 32, "6a44-relay anycast", IANA4, Restricted), // RFC 6751
    v4(192, 168, 0, 0, 16, "private-use", IANA4, Restricted), // RFC 1918
    v4(192, 175, 48, 0, 24, "direct delegation AS112 service", IANA4, Public), // RFC 7534
    v4(198, 18, 0, 0, 15, "benchmarking", IANA4, Restricted), // RFC 2544
    v4(198, 51, 100, 0, 24, "documentation (TEST-NET-2)", IANA4, Restricted), // RFC 5737
    v4(203, 0, 113, 0, 24, "documentation (TEST-NET-3)", IANA4, Restricted), // RFC 5737
    v4(224, 0, 0, 0, 4, "multicast", "IANA IPv4 Multicast Address Space Registry", Restricted), // RFC 5771
    v4(240, 0, 0, 0, 4, "reserved", IANA4, Restricted), // RFC 1112
    v4(255, 255, 255, 255, 32, "limited broadcast", IANA4, Restricted), // RFC 919
];

const SPACE6: &str = "IANA IPv6 Address Space (not global unicast)";

/// The IPv6 table: the IANA IPv6 Special-Purpose Address Registry (as of 2025), the forms
/// that embed an IPv4 address, and everything outside `2000::/3` (the only space allocated
/// for global unicast).
#[rustfmt::skip]
pub const V6_RANGES: &[SpecialRange<Ipv6Addr>] = &[
    // Outside 2000::/3: reserved by the IETF, unique-local, link-local, site-local, multicast.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 8, "reserved by IETF", SPACE6, Restricted), // RFC 4291
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 8, "reserved by IETF", SPACE6, Restricted),
    v6([0x200, 0, 0, 0, 0, 0, 0, 0], 7, "reserved by IETF", SPACE6, Restricted),
    v6([0x400, 0, 0, 0, 0, 0, 0, 0], 6, "reserved by IETF", SPACE6, Restricted),
    v6([0x800, 0, 0, 0, 0, 0, 0, 0], 5, "reserved by IETF", SPACE6, Restricted),
    v6([0x1000, 0, 0, 0, 0, 0, 0, 0], 4, "reserved by IETF", SPACE6, Restricted),
    v6([0x4000, 0, 0, 0, 0, 0, 0, 0], 2, "reserved by IETF", SPACE6, Restricted),
    v6([0x8000, 0, 0, 0, 0, 0, 0, 0], 1, "reserved by IETF", SPACE6, Restricted),
    v6([0xfe00, 0, 0, 0, 0, 0, 0, 0], 9, "reserved by IETF", SPACE6, Restricted),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local (deprecated)", SPACE6, Restricted), // RFC 3879
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast", SPACE6, Restricted), // RFC 4291
    // The registry.
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback", IANA6, Restricted), // RFC 4291
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified", IANA6, Restricted), // RFC 4291
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped", IANA6, EmbeddedIpv4), // RFC 4291
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, "IPv4-compatible (deprecated)", "RFC 4291 section 2.5.5.1", EmbeddedIpv4), // RFC 4291
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "IPv4-IPv6 translation (NAT64)", IANA6, EmbeddedIpv4), // RFC 6052
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use IPv4-IPv6 translation", IANA6, Restricted), // RFC 8215
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only", IANA6, Restricted), // RFC 6666
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "dummy IPv6 prefix", IANA6, Restricted), // RFC 9780
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "IETF protocol assignments", IANA6, Restricted), // RFC 2928
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo", IANA6, Restricted), // RFC 4380, N/A
    v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, "port control protocol anycast", IANA6, Public), // RFC 7723
    v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, "TURN anycast", IANA6, Public), // RFC 8155
    v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, "DNS-SD service registration protocol anycast", IANA6, Public), // RFC 9665
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, "benchmarking", IANA6, Restricted), // RFC 5180
    v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, "AMT", IANA6, Public), // RFC 7450
    v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, "AS112-v6", IANA6, Public), // RFC 7535
    v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, "ORCHID (deprecated)", IANA6, Restricted), // RFC 4843, N/A
    v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, "ORCHIDv2", IANA6, Public), // RFC 7343
    v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, "drone remote ID protocol entity tags", IANA6, Public), // RFC 9374
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation", IANA6, Restricted), // RFC 3849
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4", IANA6, Restricted), // RFC 3056, N/A
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, "direct delegation AS112 service", IANA6, Public), // RFC 7534
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation", IANA6, Restricted), // RFC 9637
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, "segment routing (SRv6) SIDs", IANA6, Restricted), // RFC 9602
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local", IANA6, Restricted), // RFC 4193
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local unicast", IANA6, Restricted), // RFC 4291
];

/// What an address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Public,
    /// In a restricted block: `name` is the block's (for an address embedding an IPv4
    /// address, the embedded address's block).
    Restricted {
        name: &'static str,
    },
}

impl Class {
    pub fn is_restricted(self) -> bool {
        matches!(self, Class::Restricted { .. })
    }
}

fn mask4(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// The most specific IPv4 entry holding `ip`.
pub fn special_v4(ip: Ipv4Addr) -> Option<&'static SpecialRange<Ipv4Addr>> {
    let bits = ip.to_bits();
    V4_RANGES
        .iter()
        .filter(|r| bits & mask4(r.len) == r.prefix.to_bits())
        .max_by_key(|r| r.len)
}

/// The most specific IPv6 entry holding `ip`.
pub fn special_v6(ip: Ipv6Addr) -> Option<&'static SpecialRange<Ipv6Addr>> {
    let bits = ip.to_bits();
    V6_RANGES
        .iter()
        .filter(|r| bits & mask6(r.len) == r.prefix.to_bits())
        .max_by_key(|r| r.len)
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    match special_v4(ip) {
        Some(range) if range.treatment == Restricted => Class::Restricted { name: range.name },
        _ => Class::Public,
    }
}

/// Classifies an address by the tables.
pub fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match special_v6(v6) {
            None => Class::Public,
            Some(range) => match range.treatment {
                Public => Class::Public,
                Restricted => Class::Restricted { name: range.name },
                // The last 32 bits (truncation intended).
                EmbeddedIpv4 => classify_v4(Ipv4Addr::from_bits(v6.to_bits() as u32)),
            },
        },
    }
}

/// Whether a tool (or the controller's artifact download) may not reach `ip` without an
/// explicit opt-in.
pub fn is_restricted(ip: IpAddr) -> bool {
    classify(ip).is_restricted()
}

/// The first of `ips` that is not public, with the name of its range: what an egress check
/// (the controller's downloads, a ToolSource's upstream) refuses a whole host for.
pub fn first_restricted(ips: impl IntoIterator<Item = IpAddr>) -> Option<(IpAddr, &'static str)> {
    ips.into_iter().find_map(|ip| match classify(ip) {
        Class::Restricted { name } => Some((ip, name)),
        Class::Public => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_refused_for_its_first_non_public_address() {
        let ips =
            |list: &[&str]| -> Vec<IpAddr> { list.iter().map(|s| s.parse().unwrap()).collect() };
        assert_eq!(
            first_restricted(ips(&["93.184.216.34", "2606:4700::1"])),
            None
        );
        assert_eq!(
            first_restricted(ips(&["93.184.216.34", "10.1.2.3", "127.0.0.1"])),
            Some(("10.1.2.3".parse().unwrap(), "private-use"))
        );
    }

    fn last4(r: &SpecialRange<Ipv4Addr>) -> u32 {
        r.prefix.to_bits() | !mask4(r.len)
    }

    fn last6(r: &SpecialRange<Ipv6Addr>) -> u128 {
        r.prefix.to_bits() | !mask6(r.len)
    }

    /// Whether a restricted (or embedding) entry holds the address, by the table alone and
    /// without the longest-match rule: an address none holds must be public.
    fn held_v4(bits: u32) -> bool {
        V4_RANGES
            .iter()
            .any(|r| r.treatment != Public && bits & mask4(r.len) == r.prefix.to_bits())
    }

    fn held_v6(bits: u128) -> bool {
        V6_RANGES
            .iter()
            .any(|r| r.treatment != Public && bits & mask6(r.len) == r.prefix.to_bits())
    }

    #[test]
    fn every_prefix_is_the_start_of_its_block() {
        for r in V4_RANGES {
            assert_eq!(
                r.prefix.to_bits() & !mask4(r.len),
                0,
                "{}/{}",
                r.prefix,
                r.len
            );
        }
        for r in V6_RANGES {
            assert_eq!(
                r.prefix.to_bits() & !mask6(r.len),
                0,
                "{}/{}",
                r.prefix,
                r.len
            );
        }
    }

    #[test]
    fn every_v4_block_first_and_last_address_and_just_outside() {
        for r in V4_RANGES {
            let (first, last) = (r.prefix.to_bits(), last4(r));
            for bits in [first, last] {
                let ip = IpAddr::V4(Ipv4Addr::from_bits(bits));
                assert_eq!(
                    is_restricted(ip),
                    r.treatment == Restricted,
                    "{ip} in {}/{} ({})",
                    r.prefix,
                    r.len,
                    r.name
                );
            }
            for bits in [first.checked_sub(1), last.checked_add(1)]
                .into_iter()
                .flatten()
            {
                if !held_v4(bits) {
                    let ip = IpAddr::V4(Ipv4Addr::from_bits(bits));
                    assert!(
                        !is_restricted(ip),
                        "{ip}, just outside {}/{}",
                        r.prefix,
                        r.len
                    );
                }
            }
        }
    }

    #[test]
    fn every_v6_block_first_and_last_address_and_just_outside() {
        for r in V6_RANGES {
            let (first, last) = (r.prefix.to_bits(), last6(r));
            for bits in [first, last] {
                let ip = IpAddr::V6(Ipv6Addr::from_bits(bits));
                // The first and last address of an embedding block embed 0.0.0.0 and
                // 255.255.255.255, both restricted.
                assert_eq!(
                    is_restricted(ip),
                    r.treatment != Public,
                    "{ip} in {}/{} ({})",
                    r.prefix,
                    r.len,
                    r.name
                );
            }
            for bits in [first.checked_sub(1), last.checked_add(1)]
                .into_iter()
                .flatten()
            {
                if !held_v6(bits) {
                    let ip = IpAddr::V6(Ipv6Addr::from_bits(bits));
                    assert!(
                        !is_restricted(ip),
                        "{ip}, just outside {}/{}",
                        r.prefix,
                        r.len
                    );
                }
            }
        }
    }

    /// The blocks the registries list, written out independently of the tables: each must
    /// be in them with the registry's verdict.
    #[test]
    #[rustfmt::skip]
    fn the_tables_hold_every_registry_entry() {
        let v4_restricted = [
            "0.0.0.0/8", "0.0.0.0/32", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8",
            "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32",
            "192.0.0.170/32", "192.0.0.171/32", "192.0.2.0/24", "192.88.99.0/24",
            "192.88.99.2/32", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
            "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
        ];
        let v4_public = [
            "192.0.0.9/32", "192.0.0.10/32", "192.31.196.0/24", "192.52.193.0/24",
            "192.175.48.0/24",
        ];
        let v6_restricted = [
            "::1/128", "::/128", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64", "2001::/23",
            "2001::/32", "2001:2::/48", "2001:10::/28", "2001:db8::/32", "2002::/16",
            "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
        ];
        let v6_unallocated = [
            "::/8", "100::/8", "200::/7", "400::/6", "800::/5", "1000::/4", "4000::/2",
            "8000::/1", "fe00::/9",
        ];
        let v6_embedded = ["::ffff:0:0/96", "::/96", "64:ff9b::/96"];
        let v6_public = [
            "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:3::/32", "2001:4:112::/48",
            "2001:20::/28", "2001:30::/28", "2620:4f:8000::/48",
        ];
        let find4 = |block: &str| {
            let (ip, len) = block.split_once('/').unwrap();
            let (ip, len): (Ipv4Addr, u8) = (ip.parse().unwrap(), len.parse().unwrap());
            V4_RANGES
                .iter()
                .find(|r| r.prefix == ip && r.len == len)
                .map(|r| r.treatment)
        };
        let find6 = |block: &str| {
            let (ip, len) = block.split_once('/').unwrap();
            let (ip, len): (Ipv6Addr, u8) = (ip.parse().unwrap(), len.parse().unwrap());
            V6_RANGES
                .iter()
                .find(|r| r.prefix == ip && r.len == len)
                .map(|r| r.treatment)
        };
        for block in v4_restricted {
            assert_eq!(find4(block), Some(Restricted), "{block}");
        }
        for block in v4_public {
            assert_eq!(find4(block), Some(Public), "{block}");
        }
        for block in v6_restricted {
            assert_eq!(find6(block), Some(Restricted), "{block}");
        }
        for block in v6_unallocated {
            assert_eq!(find6(block), Some(Restricted), "{block}");
        }
        for block in v6_embedded {
            assert_eq!(find6(block), Some(EmbeddedIpv4), "{block}");
        }
        for block in v6_public {
            assert_eq!(find6(block), Some(Public), "{block}");
        }
        assert_eq!(
            V4_RANGES.len(),
            v4_restricted.len() + v4_public.len(),
            "an entry of V4_RANGES is not in this list"
        );
        assert_eq!(
            V6_RANGES.len(),
            v6_restricted.len() + v6_unallocated.len() + v6_embedded.len() + v6_public.len(),
            "an entry of V6_RANGES is not in this list"
        );
    }

    #[test]
    fn restricted_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.0.8",
            "192.88.99.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::169.254.169.254",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:808:808::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
            "3fff::1",
            "5f00::1",
            "100::1",
            "ff02::1",
            "4000::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(is_restricted(ip), "{ip} is restricted");
        }
        for ip in [
            "93.184.216.34",
            "1.1.1.1",
            "8.8.8.8",
            "192.0.0.9",
            "192.31.196.1",
            "192.175.48.6",
            "2606:4700:4700::1111",
            "2001:1::1",
            "2001:4:112::1",
            "2620:4f:8000::1",
            "::ffff:8.8.8.8",
            "::8.8.8.8",
            "64:ff9b::808:808",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!is_restricted(ip), "{ip} is public");
        }
    }

    #[test]
    fn a_restricted_address_is_named_by_its_most_specific_block() {
        assert_eq!(
            classify("169.254.169.254".parse().unwrap()),
            Class::Restricted { name: "link-local" }
        );
        assert_eq!(
            classify("::ffff:127.0.0.1".parse().unwrap()),
            Class::Restricted { name: "loopback" }
        );
        assert_eq!(
            classify("2001::1".parse().unwrap()),
            Class::Restricted { name: "Teredo" }
        );
        assert_eq!(
            classify("::1".parse().unwrap()),
            Class::Restricted { name: "loopback" }
        );
    }
}

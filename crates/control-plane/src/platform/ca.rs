//! The CA and serving certificate `toolgrid controller --tls-self-signed` makes when no
//! certificate is given, keeps in a Secret (so every replica serves the same chain and a
//! restart keeps it) and rotates before anything expires, without a moment in which a
//! worker cannot verify the control plane.
//!
//! A [`Bundle`] holds the CA that signs the serving certificate, the serving certificate
//! and its key, and up to two other CAs: the successor made ahead of time and the
//! predecessor kept until it expires. Workers trust all of them ([`Bundle::trust_pem`]).
//! Rotation is a pure decision ([`plan`]) over the bundle's dates, the names the
//! certificate must cover and the time now; [`Bundle::advance`] carries it out (key
//! generation and signing, no IO). The CA lives [`CA_VALIDITY`]: a successor is made
//! [`CA_ROLL_BEFORE`] its end, and signs the serving certificate from [`CA_SWITCH_BEFORE`]
//! its end, so workers hold the successor in their trust for months before it is used. The
//! serving certificate lives [`CERT_VALIDITY`] and is made again [`CERT_RENEW_BEFORE`]
//! its end, when the names change, or when its CA changes.

use std::time::Duration;
use toolgrid_core::secret::SecretValue;

const DAY: i64 = 24 * 3600;
/// How long a CA made here is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * DAY as u64);
/// How long before its CA's end a successor CA is made (and trusted).
pub const CA_ROLL_BEFORE: Duration = Duration::from_secs(365 * DAY as u64);
/// How long before its CA's end the successor starts signing the serving certificate.
pub const CA_SWITCH_BEFORE: Duration = Duration::from_secs(180 * DAY as u64);
/// How long a serving certificate made here is valid.
pub const CERT_VALIDITY: Duration = Duration::from_secs(90 * DAY as u64);
/// How long before its end a serving certificate is made again.
pub const CERT_RENEW_BEFORE: Duration = Duration::from_secs(30 * DAY as u64);
/// Slack for clocks behind ours: certificates are valid from this long before they are made.
const BACKDATE: i64 = 3600;

/// Why a bundle cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot make a certificate: {0}")]
    Mint(#[from] rcgen::Error),
    #[error("the stored CA key of {name:?} is not a PEM private key: {message}")]
    Key { name: String, message: String },
}

/// A CA made here: its certificate, its key, its name (the certificate's common name, which
/// is also how a successor tells itself apart) and its end.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority {
    pub name: String,
    pub cert_pem: String,
    /// Absent for a predecessor: it signs nothing any more.
    pub key_pem: Option<SecretValue>,
    /// Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("name", &self.name)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// What `--tls-self-signed` serves with, and what workers trust.
#[derive(Clone, PartialEq, Eq)]
pub struct Bundle {
    /// Signs the serving certificate.
    pub ca: Authority,
    /// Made ahead of time, trusted already, signing nothing yet.
    pub next: Option<Authority>,
    /// The CA before `ca`, trusted until it expires (certificates it signed may still be
    /// served by a replica that has not reloaded).
    pub previous: Option<Authority>,
    pub cert_pem: String,
    pub key_pem: SecretValue,
    /// Unix seconds.
    pub cert_not_after: i64,
    /// The DNS names and addresses the serving certificate covers.
    pub names: Vec<String>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("ca", &self.ca)
            .field("next", &self.next)
            .field("previous", &self.previous)
            .field("cert_not_after", &self.cert_not_after)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// What a bundle needs, from the dates alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nothing usable is stored: make a CA and a serving certificate.
    pub fresh: bool,
    /// Make a successor CA.
    pub make_next: bool,
    /// The successor takes over signing; the current CA becomes the predecessor.
    pub switch: bool,
    /// The predecessor has expired: stop trusting it.
    pub drop_previous: bool,
    /// Make the serving certificate again.
    pub renew_cert: bool,
}

impl Plan {
    /// Whether the bundle stays as it is.
    pub fn is_keep(&self) -> bool {
        *self == Plan::default()
    }
}

/// What `bundle` needs at `now` (unix seconds) to serve `names`.
pub fn plan(bundle: Option<&Bundle>, names: &[String], now: i64) -> Plan {
    let Some(bundle) = bundle else {
        return Plan {
            fresh: true,
            ..Plan::default()
        };
    };
    let secs = |d: Duration| d.as_secs() as i64;
    // A CA that has ended, or a current one without its key, cannot go on: start over.
    if bundle.ca.not_after <= now || bundle.ca.key_pem.is_none() {
        return Plan {
            fresh: true,
            ..Plan::default()
        };
    }
    let ca_left = bundle.ca.not_after - now;
    let switch = ca_left <= secs(CA_SWITCH_BEFORE);
    let make_next = bundle.next.is_none() && ca_left <= secs(CA_ROLL_BEFORE);
    let drop_previous = bundle.previous.as_ref().is_some_and(|p| p.not_after <= now);
    let renew_cert =
        switch || bundle.cert_not_after - now <= secs(CERT_RENEW_BEFORE) || bundle.names != names;
    Plan {
        fresh: false,
        make_next,
        switch,
        drop_previous,
        renew_cert,
    }
}

impl Bundle {
    /// A new CA and a serving certificate it signed for `names`, at `now`.
    pub fn fresh(names: &[String], now: i64) -> Result<Bundle, CaError> {
        let ca = make_ca(now)?;
        let (cert_pem, key_pem, cert_not_after) = make_cert(&ca, names, now)?;
        Ok(Bundle {
            ca,
            next: None,
            previous: None,
            cert_pem,
            key_pem,
            cert_not_after,
            names: names.to_vec(),
        })
    }

    /// The bundle after `plan` (from [`plan`] over this bundle, `names` and `now`).
    pub fn advance(self, plan: Plan, names: &[String], now: i64) -> Result<Bundle, CaError> {
        if plan.fresh {
            return Bundle::fresh(names, now);
        }
        let mut bundle = self;
        if plan.drop_previous {
            bundle.previous = None;
        }
        if plan.make_next {
            bundle.next = Some(make_ca(now)?);
        }
        if plan.switch {
            // Without a successor made ahead (a controller that was down for months), one
            // is made now: workers that have not yet got it reload from the Deployment.
            let next = match bundle.next.take() {
                Some(next) => next,
                None => make_ca(now)?,
            };
            let mut current = std::mem::replace(&mut bundle.ca, next);
            current.key_pem = None;
            bundle.previous = Some(current);
        }
        if plan.renew_cert {
            let (cert_pem, key_pem, cert_not_after) = make_cert(&bundle.ca, names, now)?;
            bundle.cert_pem = cert_pem;
            bundle.key_pem = key_pem;
            bundle.cert_not_after = cert_not_after;
            bundle.names = names.to_vec();
        }
        Ok(bundle)
    }

    /// The CA certificates workers trust (PEM): the signing CA, its successor and its
    /// predecessor while it lasts.
    pub fn trust_pem(&self) -> String {
        [Some(&self.ca), self.next.as_ref(), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .map(|a| a.cert_pem.trim_end())
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }

    /// The earliest time [`plan`] may want something done (unix seconds): when to look
    /// again at the latest.
    pub fn next_due(&self) -> i64 {
        let secs = |d: Duration| d.as_secs() as i64;
        let mut due = vec![
            self.cert_not_after - secs(CERT_RENEW_BEFORE),
            self.ca.not_after - secs(CA_SWITCH_BEFORE),
        ];
        if self.next.is_none() {
            due.push(self.ca.not_after - secs(CA_ROLL_BEFORE));
        }
        if let Some(previous) = &self.previous {
            due.push(previous.not_after);
        }
        due.into_iter().min().unwrap_or(i64::MAX)
    }
}

/// Sets `params` valid from a little before `now` (unix seconds) for `lifetime`; returns
/// its end in unix seconds.
fn set_validity(params: &mut rcgen::CertificateParams, now: i64, lifetime: Duration) -> i64 {
    let at = |secs: i64| rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(secs.max(0) as u64);
    let not_after = now.saturating_add(lifetime.as_secs() as i64);
    params.not_before = at(now - BACKDATE);
    params.not_after = at(not_after);
    not_after
}

fn ca_params(name: &str) -> Result<rcgen::CertificateParams, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, name);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(ca)
}

fn make_ca(now: i64) -> Result<Authority, CaError> {
    let key = rcgen::KeyPair::generate()?;
    // The name tells CAs apart (a successor's subject differs from its predecessor's).
    let name = format!("toolgrid controller CA {now}");
    let mut params = ca_params(&name)?;
    let end = set_validity(&mut params, now, CA_VALIDITY);
    let cert = params.self_signed(&key)?;
    Ok(Authority {
        name,
        cert_pem: cert.pem(),
        key_pem: Some(SecretValue::new(key.serialize_pem())),
        not_after: end,
    })
}

fn make_cert(
    ca: &Authority,
    names: &[String],
    now: i64,
) -> Result<(String, SecretValue, i64), CaError> {
    use rcgen::{
        CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key_pem = ca
        .key_pem
        .as_ref()
        .and_then(|k| k.expose_str())
        .ok_or_else(|| CaError::Key {
            name: ca.name.clone(),
            message: "absent".into(),
        })?;
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| CaError::Key {
        name: ca.name.clone(),
        message: e.to_string(),
    })?;
    // The issuer as the CA certificate names it: its subject and key identifier follow
    // from the name and the key.
    let issuer = Issuer::new(ca_params(&ca.name)?, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        names.first().map(String::as_str).unwrap_or("toolgrid"),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Never beyond its CA's end.
    let lifetime = CERT_VALIDITY.min(Duration::from_secs((ca.not_after - now).max(0) as u64));
    let end = set_validity(&mut leaf, now, lifetime);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((cert.pem(), SecretValue::new(key.serialize_pem()), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;
    const D: i64 = DAY;

    fn names() -> Vec<String> {
        vec!["toolgrid.tg.svc".into(), "toolgrid".into()]
    }

    /// The bundle's dates without its keys: enough for [`plan`].
    fn dated(ca_end: i64, next: Option<i64>, previous: Option<i64>, cert_end: i64) -> Bundle {
        let authority = |end: i64, key: bool| Authority {
            name: format!("ca {end}"),
            cert_pem: String::new(),
            key_pem: key.then(|| SecretValue::new("k")),
            not_after: end,
        };
        Bundle {
            ca: authority(ca_end, true),
            next: next.map(|end| authority(end, true)),
            previous: previous.map(|end| authority(end, false)),
            cert_pem: String::new(),
            key_pem: SecretValue::new("k"),
            cert_not_after: cert_end,
            names: names(),
        }
    }

    #[test]
    fn nothing_stored_or_an_ended_ca_starts_over() {
        assert!(plan(None, &names(), NOW).fresh);
        assert!(plan(Some(&dated(NOW, None, None, NOW + 60 * D)), &names(), NOW).fresh);
        let mut keyless = dated(NOW + 1000 * D, None, None, NOW + 60 * D);
        keyless.ca.key_pem = None;
        assert!(plan(Some(&keyless), &names(), NOW).fresh);
    }

    #[test]
    fn a_young_bundle_is_kept() {
        let bundle = dated(NOW + 1000 * D, None, None, NOW + 60 * D);
        assert!(plan(Some(&bundle), &names(), NOW).is_keep());
        assert_eq!(bundle.next_due(), NOW + 30 * D);
    }

    #[test]
    fn the_certificate_is_renewed_a_month_ahead_or_when_the_names_change() {
        let bundle = dated(NOW + 1000 * D, None, None, NOW + 30 * D);
        assert_eq!(
            plan(Some(&bundle), &names(), NOW),
            Plan {
                renew_cert: true,
                ..Plan::default()
            }
        );
        let young = dated(NOW + 1000 * D, None, None, NOW + 80 * D);
        let moved = vec!["cp.example.org".to_string()];
        assert!(plan(Some(&young), &moved, NOW).renew_cert);
    }

    #[test]
    fn the_ca_rolls_over_in_steps_that_workers_can_follow() {
        // A year before its end: a successor, trusted, signing nothing.
        let ageing = dated(NOW + 365 * D, None, None, NOW + 80 * D);
        assert_eq!(
            plan(Some(&ageing), &names(), NOW),
            Plan {
                make_next: true,
                ..Plan::default()
            }
        );
        // Half a year before: the successor signs a new serving certificate.
        let old = dated(NOW + 180 * D, Some(NOW + 1500 * D), None, NOW + 80 * D);
        assert_eq!(
            plan(Some(&old), &names(), NOW),
            Plan {
                switch: true,
                renew_cert: true,
                ..Plan::default()
            }
        );
        // The predecessor is trusted until it ends.
        let after = dated(NOW + 1500 * D, None, Some(NOW + 10 * D), NOW + 80 * D);
        assert!(plan(Some(&after), &names(), NOW).is_keep());
        assert_eq!(after.next_due(), NOW + 10 * D);
        assert_eq!(
            plan(Some(&after), &names(), NOW + 10 * D),
            Plan {
                drop_previous: true,
                ..Plan::default()
            }
        );
    }

    /// Whether `cert_pem` verifies for `name` against the CAs in `trust_pem` at `at`.
    fn verifies(cert_pem: &str, trust_pem: &str, name: &str, at: i64) -> bool {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(trust_pem.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::since_unix_epoch(Duration::from_secs(at as u64)),
            )
            .is_ok()
    }
    use std::sync::Arc;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::client::danger::ServerCertVerifier as _;

    #[test]
    fn every_step_of_a_rollover_verifies_with_the_trust_workers_had_before_it() {
        let names = names();
        let first = Bundle::fresh(&names, NOW).unwrap();
        assert!(verifies(
            &first.cert_pem,
            &first.trust_pem(),
            "toolgrid.tg.svc",
            NOW
        ));
        assert!(!verifies(
            &first.cert_pem,
            &first.trust_pem(),
            "elsewhere",
            NOW
        ));

        // Walk four and a half years on, a month at a time, as the controller's loop would.
        let mut bundle = first.clone();
        let mut trusted_before = bundle.trust_pem();
        let mut switched = 0;
        for month in 1..=66 {
            let now = NOW + month * 30 * D;
            let step = plan(Some(&bundle), &names, now);
            assert!(!step.fresh, "month {month}: {step:?}");
            switched += step.switch as u32;
            bundle = bundle.advance(step, &names, now).unwrap();
            // What workers trusted before this step still verifies what is served after
            // it, and what they are handed now does too.
            assert!(
                verifies(&bundle.cert_pem, &trusted_before, "toolgrid.tg.svc", now),
                "month {month}: workers holding the old trust cannot verify"
            );
            assert!(verifies(
                &bundle.cert_pem,
                &bundle.trust_pem(),
                "toolgrid",
                now
            ));
            trusted_before = bundle.trust_pem();
        }
        assert_eq!(switched, 1, "one rollover in 66 months");
        assert_ne!(bundle.ca.name, first.ca.name);
    }
}

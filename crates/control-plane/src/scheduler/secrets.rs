//! Secret values for an assignment: resolved when a call is assigned, never stored.
//!
//! A call's [`CallAccess`] (fixed at admission, stored with the call) names the config
//! values and secret keys its binding grants. When the scheduler hands the call to a worker,
//! [`delivery`] resolves the secret keys through a [`SecretSource`] (the catalog's view of
//! the agent's Secret) and the assignment carries the values: every granted secret in
//! `Assign.secrets` (for `${secret:NAME}` references, and for redaction), the revealable ones
//! and the config also in `Assign.env`. Every (re-)assignment resolves them again, so a call
//! replayed after a failover gets the values current then. A key that cannot be resolved
//! fails the call (`secret-unavailable`) instead of running it without the secret.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use toolgrid_core::call::CallAccess;
use toolgrid_core::secret::SecretValue;

/// Where the scheduler reads secret values (in `toolgrid up` and the controller: the
/// catalog's snapshot of the agent's Secret).
pub trait SecretSource: Send + Sync {
    /// The values of `keys` in the Secret that `agent` (in `namespace`) names. A key that is
    /// not there is simply absent from the answer; an error means nothing can be said now.
    fn values(
        &self,
        namespace: &str,
        agent: &str,
        keys: &[String],
    ) -> Result<BTreeMap<String, SecretValue>, SecretError>;

    /// What an imported tool's call carries to reach its upstream, by the reference its
    /// declared headers use: its ToolSource's own Secret values, and a signed identity
    /// token minted for this assignment (`auth: {type: identity}`). None by default.
    fn upstream_credentials(
        &self,
        _call: &UpstreamCredentialsFor<'_>,
    ) -> Result<BTreeMap<String, SecretValue>, SecretError> {
        Ok(BTreeMap::new())
    }

    /// The values of ToolSource `namespace/source`'s own Secret keys as they are now (no
    /// identity token): what is scrubbed from what an agent reads of its calls.
    fn source_values(&self, _namespace: &str, _source: &str) -> Vec<SecretValue> {
        Vec::new()
    }
}

/// The call an upstream's credentials are for.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamCredentialsFor<'a> {
    pub namespace: &'a str,
    pub tool: &'a str,
    pub call_id: &'a str,
    pub agent: Option<&'a str>,
    pub upstream: &'a toolgrid_core::source::UpstreamCall,
}

/// A closure is a source: `Arc::new(move |namespace: &str, agent: &str, keys: &[String]| ...)`.
impl<F> SecretSource for F
where
    F: Fn(&str, &str, &[String]) -> Result<BTreeMap<String, SecretValue>, SecretError>
        + Send
        + Sync,
{
    fn values(
        &self,
        namespace: &str,
        agent: &str,
        keys: &[String],
    ) -> Result<BTreeMap<String, SecretValue>, SecretError> {
        self(namespace, agent, keys)
    }
}

/// Why an assignment cannot carry the secrets its call was granted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "the secret keys {} granted to the call are not in agent {agent:?}'s Secret",
        keys.join(", ")
    )]
    Missing { agent: String, keys: Vec<String> },
    #[error("the call is granted secret keys but acts for no agent")]
    NoAgent,
    #[error("this control plane has no source of secret values")]
    NoSource,
    #[error("cannot read agent {agent:?}'s Secret: {reason}")]
    Unavailable { agent: String, reason: String },
    #[error("the credentials of tool source {source_name:?} cannot be given: {reason}")]
    Upstream { source_name: String, reason: String },
}

/// What an assignment carries besides the stored call spec.
#[derive(Default, PartialEq, Eq)]
pub struct Delivery {
    /// Config values and revealable secret values, as environment variables.
    pub env: BTreeMap<String, String>,
    /// Every granted secret's value, by key.
    pub secrets: HashMap<String, String>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The secret keys a call is granted and what its agent's Secret holds of them.
struct Granted<'a> {
    agent: &'a str,
    /// Each key once, sorted.
    keys: Vec<String>,
    values: BTreeMap<String, SecretValue>,
}

/// What `access` grants, read through `source`; `None` when no key is granted (then no
/// source is needed).
fn granted<'a>(
    access: &'a CallAccess,
    namespace: &str,
    source: Option<&dyn SecretSource>,
) -> Result<Option<Granted<'a>>, SecretError> {
    let keys: Vec<String> = access
        .secret_keys()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let agent = access.agent.as_deref().ok_or(SecretError::NoAgent)?;
    let source = source.ok_or(SecretError::NoSource)?;
    let values = source.values(namespace, agent, &keys)?;
    Ok(Some(Granted {
        agent,
        keys,
        values,
    }))
}

/// Resolves what `access` grants into what the assignment carries. A revealable key takes
/// the place of a config key of the same name.
pub fn delivery(
    access: &CallAccess,
    namespace: &str,
    source: Option<&dyn SecretSource>,
) -> Result<Delivery, SecretError> {
    let mut delivery = Delivery {
        env: access.config.clone(),
        secrets: HashMap::new(),
    };
    let Some(Granted {
        agent,
        keys,
        mut values,
    }) = granted(access, namespace, source)?
    else {
        return Ok(delivery);
    };
    let missing: Vec<String> = keys
        .iter()
        .filter(|key| !values.contains_key(*key))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(SecretError::Missing {
            agent: agent.to_string(),
            keys: missing,
        });
    }
    // Values travel as text (headers, URLs and environment variables are text).
    let text = |key: &str, value: &SecretValue| {
        value
            .expose_str()
            .map(str::to_string)
            .ok_or_else(|| SecretError::Unavailable {
                agent: agent.to_string(),
                reason: format!("the value of key {key:?} is not UTF-8 text"),
            })
    };
    for key in &access.secrets_revealable {
        if let Some(value) = values.get(key) {
            delivery.env.insert(key.clone(), text(key, value)?);
        }
    }
    for key in keys {
        if let Some(value) = values.remove(&key) {
            let value = text(&key, &value)?;
            delivery.secrets.insert(key, value);
        }
    }
    Ok(delivery)
}

/// Adds an imported tool call's upstream credentials to its delivery (over any agent key
/// of the same name).
pub fn add_upstream(
    delivery: &mut Delivery,
    record: &toolgrid_core::call::CallRecord,
    source: Option<&dyn SecretSource>,
) -> Result<(), SecretError> {
    let Some(upstream) = &record.spec.upstream else {
        return Ok(());
    };
    let source = source.ok_or(SecretError::NoSource)?;
    let values = source.upstream_credentials(&UpstreamCredentialsFor {
        namespace: &record.namespace,
        tool: &record.tool,
        call_id: &record.id,
        agent: record.spec.access.agent.as_deref(),
        upstream,
    })?;
    for (name, value) in values {
        let text = value
            .expose_str()
            .ok_or_else(|| SecretError::Upstream {
                source_name: upstream.source.clone(),
                reason: format!("the value of {name:?} is not UTF-8 text"),
            })?
            .to_string();
        delivery.secrets.insert(name, text);
    }
    Ok(())
}

/// What scrubs a call's secret values, as they are now, out of what a front door shows a
/// caller of that call (its oplog above all, whose recorded responses are kept raw for
/// replay): [`toolgrid_core::secret::scrub::Scrubber`] over every secret key `access` grants
/// (readable and revealable), resolved through `source` like an assignment's. A call that
/// is granted no secret key gets a scrubber that changes nothing. Values rotated since the
/// call ran are not known here: what was recorded with an old value is not scrubbed of it.
pub fn scrubber(
    access: &CallAccess,
    namespace: &str,
    source: Option<&dyn SecretSource>,
) -> Result<toolgrid_core::secret::scrub::Scrubber, SecretError> {
    scrubber_with(access, namespace, source, None)
}

/// [`scrubber`], and for an imported tool's call (`upstream`: its ToolSource's name) also
/// the source's own credentials, which an echoing upstream may have put in a recorded
/// response. (An identity token is minted per assignment and not kept: one an upstream
/// echoed is not known here, and stays valid for two minutes for that upstream only.)
pub fn scrubber_with(
    access: &CallAccess,
    namespace: &str,
    source: Option<&dyn SecretSource>,
    upstream: Option<&str>,
) -> Result<toolgrid_core::secret::scrub::Scrubber, SecretError> {
    let mut values: Vec<SecretValue> = match granted(access, namespace, source)? {
        Some(granted) => granted.values.into_values().collect(),
        None => Vec::new(),
    };
    if let (Some(name), Some(source)) = (upstream, source) {
        values.extend(source.source_values(namespace, name));
    }
    Ok(if values.is_empty() {
        Default::default()
    } else {
        toolgrid_core::secret::scrub::Scrubber::new(values.iter())
    })
}

/// A fixed set of Secrets, by namespace and agent: for tests, and for a control plane fed
/// by something other than the catalog.
#[derive(Clone, Default)]
pub struct StaticSecrets {
    values: BTreeMap<(String, String), BTreeMap<String, SecretValue>>,
}

impl StaticSecrets {
    /// Gives `agent` (in `namespace`) the secret `key` with `value`.
    pub fn with(mut self, namespace: &str, agent: &str, key: &str, value: &str) -> Self {
        self.values
            .entry((namespace.to_string(), agent.to_string()))
            .or_default()
            .insert(key.to_string(), SecretValue::new(value));
        self
    }
}

impl SecretSource for StaticSecrets {
    fn values(
        &self,
        namespace: &str,
        agent: &str,
        keys: &[String],
    ) -> Result<BTreeMap<String, SecretValue>, SecretError> {
        let Some(secret) = self.values.get(&(namespace.to_string(), agent.to_string())) else {
            return Ok(BTreeMap::new());
        };
        Ok(keys
            .iter()
            .filter_map(|key| secret.get(key).map(|v| (key.clone(), v.clone())))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(readable: &[&str], revealable: &[&str]) -> CallAccess {
        CallAccess {
            agent: Some("reporter".into()),
            config: [("region".to_string(), "eu-west-1".to_string())].into(),
            secrets_readable: readable.iter().map(|s| s.to_string()).collect(),
            secrets_revealable: revealable.iter().map(|s| s.to_string()).collect(),
            ..CallAccess::default()
        }
    }

    fn source() -> StaticSecrets {
        StaticSecrets::default()
            .with("default", "reporter", "api-token", "s3cr3t-value")
            .with("default", "reporter", "signing-key", "k3y")
            .with("default", "other", "api-token", "not-yours")
    }

    #[test]
    fn readable_secrets_go_by_reference_revealable_ones_also_as_env() {
        let source = source();
        let got = delivery(
            &access(&["api-token"], &["signing-key"]),
            "default",
            Some(&source),
        )
        .unwrap();
        assert_eq!(got.env.get("region").map(String::as_str), Some("eu-west-1"));
        assert_eq!(got.env.get("signing-key").map(String::as_str), Some("k3y"));
        assert!(
            !got.env.contains_key("api-token"),
            "readable is never in env"
        );
        assert_eq!(got.secrets.len(), 2);
        assert_eq!(got.secrets["api-token"], "s3cr3t-value");
        let debug = format!("{got:?}");
        assert!(
            !debug.contains("s3cr3t") && !debug.contains("k3y"),
            "{debug}"
        );
    }

    #[test]
    fn a_closure_is_a_source_and_its_errors_pass_through() {
        let unreadable = |_: &str, agent: &str, _: &[String]| {
            Err(SecretError::Unavailable {
                agent: agent.to_string(),
                reason: "the catalog has not synced".into(),
            })
        };
        let error =
            delivery(&access(&["api-token"], &[]), "default", Some(&unreadable)).unwrap_err();
        assert!(error.to_string().contains("has not synced"), "{error}");
        let fixed = |_: &str, _: &str, keys: &[String]| {
            Ok(keys
                .iter()
                .map(|k| (k.clone(), SecretValue::new("v")))
                .collect())
        };
        let got = delivery(&access(&["api-token"], &[]), "default", Some(&fixed)).unwrap();
        assert_eq!(got.secrets["api-token"], "v");
    }

    #[test]
    fn a_calls_scrubber_knows_every_value_it_was_granted_and_no_other() {
        let source = source().with("default", "reporter", "unrelated", "unrelated-value");
        let scrub = scrubber(
            &access(&["api-token"], &["signing-key"]),
            "default",
            Some(&source),
        )
        .unwrap();
        // `s3cr3t-value` and its base64; `k3y` is too short to scrub.
        assert_eq!(
            scrub.scrub_text("s3cr3t-value czNjcjN0LXZhbHVl k3y unrelated-value"),
            "[secret] [secret] k3y unrelated-value"
        );
        let none = scrubber(&access(&[], &[]), "default", None).unwrap();
        assert!(!none.is_armed());
        assert_eq!(
            scrubber(&access(&["api-token"], &[]), "default", None).unwrap_err(),
            SecretError::NoSource
        );
    }

    #[test]
    fn no_secret_keys_need_no_source() {
        let got = delivery(&access(&[], &[]), "default", None).unwrap();
        assert_eq!(got.env.len(), 1);
        assert!(got.secrets.is_empty());
    }

    #[test]
    fn a_secret_that_cannot_be_resolved_is_an_error_naming_the_key() {
        let source = source();
        assert_eq!(
            delivery(
                &access(&["api-token", "gone"], &[]),
                "default",
                Some(&source)
            ),
            Err(SecretError::Missing {
                agent: "reporter".into(),
                keys: vec!["gone".into()]
            })
        );
        assert_eq!(
            delivery(&access(&["api-token"], &[]), "default", None),
            Err(SecretError::NoSource)
        );
        let mut anonymous = access(&["api-token"], &[]);
        anonymous.agent = None;
        assert_eq!(
            delivery(&anonymous, "default", Some(&source)),
            Err(SecretError::NoAgent)
        );
        // Another namespace's agent of the same name has none of them.
        assert!(matches!(
            delivery(&access(&["api-token"], &[]), "elsewhere", Some(&source)),
            Err(SecretError::Missing { .. })
        ));
    }
}

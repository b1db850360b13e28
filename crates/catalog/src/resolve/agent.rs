//! Agents: checked, their references (ServiceAccount, Secrets, ConfigMap) looked up, and,
//! once the bindings are known, the tools each may call.

use super::{Identities, Resolver};
use crate::snapshot::{ResolvedAgent, ResourceId};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{Agent, Kind, KindStatus};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::FieldError;
use toolgrid_core::secret::SecretValue;

impl<'a> Resolver<'a> {
    pub(super) fn agents(&mut self) -> BTreeMap<ObjectKey, &'a Agent> {
        let declared = self.declared(Kind::Agent, &self.input.set.agents);
        let checked: Vec<_> = declared
            .into_iter()
            .map(|d| {
                let verdict = check_agent(d.object).map(|()| {
                    self.input
                        .identities
                        .and_then(|ids| missing_reference(d.object, ids))
                });
                (d, verdict)
            })
            .collect();
        let later = later_oauth_claims(
            checked
                .iter()
                .filter(|(_, verdict)| matches!(verdict, Ok(None)))
                .map(|(d, _)| (&d.id.key, d.object)),
        );
        let mut valid = BTreeMap::new();
        for (d, verdict) in checked {
            match verdict {
                Err(e) => self.invalid(&d, e),
                Ok(Some((reason, message))) => {
                    self.record_declared(
                        &d,
                        Desired::not_ready(reason, message),
                        KindStatus::empty(Kind::Agent),
                        Vec::new(),
                    );
                }
                Ok(None) if later.contains_key(&d.id.key) => {
                    let (subject, owner) = &later[&d.id.key];
                    self.record_declared(
                        &d,
                        Desired::not_ready(
                            Reason::DuplicateOAuthSubject,
                            format!(
                                "spec.oauthSubjects: {subject:?} is already Agent {}'s; \
                                 an OAuth subject is one Agent of a namespace",
                                owner.name
                            ),
                        ),
                        KindStatus::empty(Kind::Agent),
                        Vec::new(),
                    );
                }
                Ok(None) => {
                    let identity = d
                        .object
                        .spec
                        .service_account
                        .as_ref()
                        .map(|sa| format!("serviceAccount {sa}"))
                        .or_else(|| {
                            d.object
                                .spec
                                .token_secret_ref
                                .as_ref()
                                .map(|_| "token".into())
                        })
                        .unwrap_or_else(|| "OAuth subjects".into());
                    self.record_declared(
                        &d,
                        Desired::ready(Reason::Resolved, format!("identity: {identity}")),
                        KindStatus::empty(Kind::Agent),
                        vec![("Identity".into(), identity)],
                    );
                    self.snapshot.agents.insert(
                        d.id.key.clone(),
                        Arc::new(resolved_agent(d.object, &d.id.key, self.input.identities)),
                    );
                    valid.insert(d.id.key.clone(), d.object);
                }
            }
        }
        valid
    }

    /// Each Ready Agent's `status.tools` (and `Tools` column): the tools it may call now.
    pub(super) fn agent_tools(&mut self) {
        let agents: Vec<ObjectKey> = self.snapshot.agents.keys().cloned().collect();
        for key in agents {
            let tools: Vec<String> = crate::access::explain(&self.snapshot, &key, None)
                .into_iter()
                .filter(|a| a.verdict.is_ok())
                .map(|a| a.tool)
                .collect();
            let id = ResourceId {
                kind: Kind::Agent,
                key,
            };
            if let Some(state) = self.snapshot.resources.get_mut(&id) {
                let column = if tools.is_empty() {
                    "<none>".to_string()
                } else {
                    tools.join(",")
                };
                if !tools.is_empty() {
                    state.status["tools"] = serde_json::json!(tools);
                }
                state.columns.push(("Tools".into(), column));
            }
        }
    }
}

/// The Agents that list an OAuth subject an older Agent of the same namespace lists, each
/// with that subject and the older Agent. Older: the earlier `creationTimestamp`, then (a
/// manifest directory has none) the name. The older keeps the user: a later Agent cannot
/// take over a subject, and a duplicate is the later Agent's fault, not a failed login.
pub(crate) fn later_oauth_claims<'x>(
    agents: impl Iterator<Item = (&'x ObjectKey, &'x Agent)>,
) -> BTreeMap<ObjectKey, (String, ObjectKey)> {
    let mut ordered: Vec<_> = agents.collect();
    ordered.sort_by(|(a_key, a), (b_key, b)| {
        let created = |agent: &Agent| agent.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (
            &a_key.namespace,
            created(a).is_none(),
            created(a),
            &a_key.name,
        )
            .cmp(&(
                &b_key.namespace,
                created(b).is_none(),
                created(b),
                &b_key.name,
            ))
    });
    let mut owners: BTreeMap<(&str, &str), &ObjectKey> = BTreeMap::new();
    let mut later = BTreeMap::new();
    for (key, agent) in ordered {
        let subjects = &agent.spec.oauth_subjects;
        let taken = subjects.iter().find_map(|subject| {
            owners
                .get(&(key.namespace.as_str(), subject.as_str()))
                .filter(|owner| **owner != key)
                .map(|owner| (subject.clone(), (*owner).clone()))
        });
        match taken {
            Some(duplicate) => {
                later.insert(key.clone(), duplicate);
            }
            None => {
                for subject in subjects {
                    owners.insert((key.namespace.as_str(), subject.as_str()), key);
                }
            }
        }
    }
    later
}

/// The first reference of an Agent to something missing (a ServiceAccount, Secret,
/// ConfigMap, or the token's key), as a condition reason and message.
fn missing_reference(agent: &Agent, identities: &Identities) -> Option<(Reason, String)> {
    let ns = agent.metadata.namespace.clone().unwrap_or_default();
    let key = |name: &str| ObjectKey::new(ns.clone(), name);
    let spec = &agent.spec;
    if let (Some(sa), Some(known)) = (&spec.service_account, &identities.service_accounts)
        && !known.contains(&key(sa))
    {
        return Some((
            Reason::MissingServiceAccount,
            format!("spec.serviceAccount: there is no ServiceAccount {ns}/{sa}"),
        ));
    }
    if let Some(secret) = &spec.token_secret_ref {
        match identities.secrets.get(&key(&secret.name)) {
            None => {
                return Some((
                    Reason::MissingSecret,
                    format!(
                        "spec.tokenSecretRef: there is no Secret {ns}/{}",
                        secret.name
                    ),
                ));
            }
            Some(data) if data.get(&secret.key).is_none_or(SecretValue::is_empty) => {
                return Some((
                    Reason::MissingSecretKey,
                    format!(
                        "spec.tokenSecretRef: Secret {ns}/{} has no (non-empty) key {:?}",
                        secret.name, secret.key
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(secret) = &spec.secret_ref
        && !identities.secrets.contains_key(&key(&secret.name))
    {
        return Some((
            Reason::MissingSecret,
            format!("spec.secretRef: there is no Secret {ns}/{}", secret.name),
        ));
    }
    if let Some(config) = &spec.config_map_ref
        && !identities.config_maps.contains_key(&key(&config.name))
    {
        return Some((
            Reason::MissingConfigMap,
            format!(
                "spec.configMapRef: there is no ConfigMap {ns}/{}",
                config.name
            ),
        ));
    }
    None
}

/// An Agent that passed its checks, with what it refers to resolved.
fn resolved_agent(
    agent: &Agent,
    key: &ObjectKey,
    identities: Option<&Identities>,
) -> ResolvedAgent {
    let spec = &agent.spec;
    let at = |name: &str| ObjectKey::new(key.namespace.clone(), name);
    let token_digest = identities.and_then(|ids| {
        let reference = spec.token_secret_ref.as_ref()?;
        let value = ids.secrets.get(&at(&reference.name))?.get(&reference.key)?;
        Some(value.digest())
    });
    let config = identities
        .zip(spec.config_map_ref.as_ref())
        .and_then(|(ids, r)| ids.config_maps.get(&at(&r.name)).cloned())
        .unwrap_or_default();
    let secrets = identities
        .zip(spec.secret_ref.as_ref())
        .and_then(|(ids, r)| ids.secrets.get(&at(&r.name)).cloned())
        .unwrap_or_default();
    ResolvedAgent {
        key: key.clone(),
        spec: spec.clone(),
        token_digest,
        config,
        secrets,
    }
}

fn check_agent(agent: &Agent) -> Result<(), FieldError> {
    let spec = &agent.spec;
    if spec.service_account.is_none()
        && spec.token_secret_ref.is_none()
        && spec.oauth_subjects.is_empty()
    {
        return Err(FieldError::new(
            "spec",
            "name an identity: serviceAccount, tokenSecretRef or oauthSubjects",
        ));
    }
    if let Some(i) = spec.oauth_subjects.iter().position(String::is_empty) {
        return Err(FieldError::new(
            format!("spec.oauthSubjects[{i}]"),
            "an OAuth subject is not empty",
        ));
    }
    for (i, p) in spec.permissions.iter().enumerate() {
        if p.tools.is_empty() {
            return Err(FieldError::new(
                format!("spec.permissions[{i}].tools"),
                "list at least one tool (or \"*\")",
            ));
        }
    }
    Ok(())
}

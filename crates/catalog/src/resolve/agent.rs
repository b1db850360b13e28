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
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Agent, &self.input.set.agents) {
            let missing = self
                .input
                .identities
                .and_then(|ids| missing_reference(d.object, ids));
            match (check_agent(d.object), missing) {
                (Err(e), _) => self.invalid(&d, e),
                (Ok(()), Some((reason, message))) => {
                    self.record_declared(
                        &d,
                        Desired::not_ready(reason, message),
                        KindStatus::empty(Kind::Agent),
                        Vec::new(),
                    );
                }
                (Ok(()), None) => {
                    let identity = d
                        .object
                        .spec
                        .service_account
                        .as_ref()
                        .map(|sa| format!("serviceAccount {sa}"))
                        .unwrap_or_else(|| "token".into());
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
    if spec.service_account.is_none() && spec.token_secret_ref.is_none() {
        return Err(FieldError::new(
            "spec",
            "name an identity: serviceAccount or tokenSecretRef",
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

//! ToolBindings: last, as they name agents, a tool, its releases and middleware; each is
//! kept, Ready or not, for authorization and `why`.

use super::Resolver;
use super::declared::Declared;
use crate::snapshot::{
    ResolvedAgent, ResolvedBinding, ResolvedRelease, ResolvedRollout, ResourceId,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{
    Agent, Kind, KindStatus, Middleware, RolloutStatus, ToolBinding, ToolBindingStatus,
};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::FieldError;
use toolgrid_core::rollout::{Phase, Plan, Progress};

impl<'a> Resolver<'a> {
    pub(super) fn bindings(
        &mut self,
        agents: &BTreeMap<ObjectKey, &Agent>,
        middleware: &BTreeMap<ObjectKey, &Middleware>,
    ) {
        for d in self.declared(Kind::ToolBinding, &self.input.set.bindings) {
            let spec = &d.object.spec;
            let ns = d.id.key.namespace.clone();
            if let Err(e) = check_binding(d.object) {
                self.invalid(&d, e);
                self.keep_binding(&d, None, None);
                continue;
            }
            let mut columns = vec![
                ("Tool".into(), spec.tool.clone()),
                ("Agents".into(), spec.agents.join(",")),
                (
                    "Middleware".into(),
                    self.chain_column(&ns, &spec.middleware),
                ),
            ];
            let problem = spec
                .agents
                .iter()
                .find(|a| !agents.contains_key(&ObjectKey::new(ns.clone(), (*a).clone())))
                .map(|a| (Reason::UnknownAgent, format!("spec.agents: there is no valid Agent {a:?} in namespace {ns:?}")))
                .or_else(|| {
                    spec.middleware
                        .iter()
                        .find(|m| !middleware.contains_key(&ObjectKey::new(ns.clone(), (*m).clone())))
                        .map(|m| (Reason::UnknownMiddleware, format!("spec.middleware: there is no valid Middleware {m:?} in namespace {ns:?}")))
                })
                .or_else(|| self.middleware_not_ready(&ns, &spec.middleware))
                .or_else(|| {
                    (!self.snapshot.tools.contains_key(&ObjectKey::new(ns.clone(), spec.tool.clone())))
                        .then(|| (Reason::UnknownTool, format!("spec.tool: there is no valid Tool {:?} in namespace {ns:?}", spec.tool)))
                })
                .or_else(|| {
                    self.input
                        .identities
                        .and_then(|_| missing_binding_key(spec, &ns, &self.snapshot.agents))
                });
            let resolved = resolve_binding_release(d.object, &self.snapshot.releases).and_then(
                |key| match self.snapshot.releases.get(key) {
                    Some(release) => ungranted_secret_reference(spec, release).map_or(Ok(key), Err),
                    None => Ok(key),
                },
            );
            let mut status = ToolBindingStatus::default();
            let mut release = None;
            let mut rollout = None;
            let mut degraded = None;
            let ready = match (problem, resolved) {
                (Some((reason, message)), _) => Desired::not_ready(reason, message),
                (None, Err((reason, message))) => Desired::not_ready(reason, message),
                (None, Ok(key)) => {
                    status.resolved_release = Some(key.name.clone());
                    columns.push(("Release".into(), key.name.clone()));
                    release = Some(key.clone());
                    let mut message = format!("calls run release {}", key.name);
                    match self.rollout_of(&d, key) {
                        Ok(None) => {}
                        Ok(Some(canary)) => {
                            let weight = canary.weight();
                            message = format!(
                                "calls run release {} and, {weight}% of them, canary {} ({})",
                                key.name, canary.canary.name, canary.progress.phase
                            );
                            columns.push((
                                "Canary".into(),
                                format!("{} {weight}%", canary.canary.name),
                            ));
                            status.rollout = Some(rollout_status(&key.name, &canary));
                            degraded = Some(degraded_of(&canary));
                            rollout = Some(canary);
                        }
                        Err(why) => message = format!("{message}; {why}"),
                    }
                    Desired::ready(Reason::Resolved, message)
                }
            };
            self.record_declared_degraded(
                &d,
                ready,
                degraded,
                KindStatus::ToolBinding(status),
                columns,
            );
            self.keep_binding(&d, release, rollout);
        }
    }

    /// The binding's canary, when `spec.rollout` names one: `Err` says why a declared
    /// canary takes no calls (every call runs `stable`).
    fn rollout_of(
        &self,
        d: &Declared<'_, ToolBinding>,
        stable: &ObjectKey,
    ) -> Result<Option<ResolvedRollout>, String> {
        let spec = &d.object.spec;
        let Some(declared) = &spec.rollout else {
            return Ok(None);
        };
        // Checked by check_binding.
        let plan = plan_of(declared).map_err(|e| e.to_string())?;
        let key = ObjectKey::new(d.id.key.namespace.clone(), declared.canary.clone());
        let canary = self
            .snapshot
            .releases
            .get(&key)
            .filter(|r| r.tool == spec.tool)
            .ok_or_else(|| {
                format!(
                    "canary {} is not a Ready release of tool {}, so it takes no calls",
                    declared.canary, spec.tool
                )
            })?;
        if let Some((_, why)) = ungranted_secret_reference(spec, canary) {
            return Err(format!("canary {} takes no calls: {why}", declared.canary));
        }
        if &key == stable {
            return Err(format!("canary {} is the stable release", declared.canary));
        }
        let progress = self
            .input
            .rollouts
            .get(&d.id.key)
            .filter(|r| r.canary == declared.canary)
            .map(|r| r.progress.clone())
            .unwrap_or_else(|| Progress::start(self.input.now.as_millisecond()));
        Ok(Some(ResolvedRollout {
            canary: key,
            plan,
            progress,
        }))
    }

    /// Why a binding in `ns` naming `listed` cannot run its chain: a Middleware it names
    /// is not Ready, or an `enforce: true` one of its namespace is not (fail closed).
    fn middleware_not_ready(&self, ns: &str, listed: &[String]) -> Option<(Reason, String)> {
        let not_ready = |name: &str| -> Option<String> {
            let key = ObjectKey::new(ns.to_string(), name.to_string());
            if self.snapshot.middleware.contains_key(&key) {
                return None;
            }
            let id = ResourceId {
                kind: Kind::Middleware,
                key,
            };
            Some(match self.snapshot.resources.get(&id) {
                Some(state) => {
                    format!("{} ({}: {})", name, state.ready.reason, state.ready.message)
                }
                None => format!("{name} (it is not Ready)"),
            })
        };
        let enforced = self
            .input
            .set
            .middleware
            .iter()
            .filter(|m| {
                m.object.spec.enforce
                    && m.object.metadata.namespace.as_deref().unwrap_or_default() == ns
            })
            .filter_map(|m| m.object.metadata.name.as_deref());
        for name in enforced {
            if let Some(why) = not_ready(name) {
                return Some((
                    Reason::MiddlewareNotReady,
                    format!(
                        "enforced Middleware {why} is not Ready, so no call through a binding of namespace {ns:?} may run"
                    ),
                ));
            }
        }
        listed.iter().find_map(|name| {
            not_ready(name).map(|why| {
                (
                    Reason::MiddlewareNotReady,
                    format!("spec.middleware: Middleware {why} is not Ready"),
                )
            })
        })
    }

    /// The binding's chain in order (the `Middleware` column): enforced Middleware of `ns`
    /// by name, then `listed`, each once.
    fn chain_column(&self, ns: &str, listed: &[String]) -> String {
        let names = match crate::middleware::chain_in(&self.snapshot, ns, listed) {
            Ok(chain) => chain.links.iter().map(|l| l.name().to_string()).collect(),
            // Not Ready: what the chain would be, from the declarations.
            Err(_) => {
                let mut names: Vec<String> = self
                    .input
                    .set
                    .middleware
                    .iter()
                    .filter(|m| {
                        m.object.spec.enforce
                            && m.object.metadata.namespace.as_deref().unwrap_or_default() == ns
                    })
                    .filter_map(|m| m.object.metadata.name.clone())
                    .collect();
                names.sort();
                names.dedup();
                for name in listed {
                    if !names.contains(name) {
                        names.push(name.clone());
                    }
                }
                names
            }
        };
        if names.is_empty() {
            "<none>".to_string()
        } else {
            names.join(",")
        }
    }

    /// Keeps a binding, Ready or not, with its condition, for authorization and `why`.
    fn keep_binding(
        &mut self,
        d: &Declared<'_, ToolBinding>,
        release: Option<ObjectKey>,
        rollout: Option<ResolvedRollout>,
    ) {
        let Some(state) = self.snapshot.resources.get(&d.id) else {
            return;
        };
        let binding = ResolvedBinding {
            key: d.id.key.clone(),
            spec: d.object.spec.clone(),
            release: release.filter(|_| state.ready.status),
            rollout: rollout.filter(|_| state.ready.status),
            ready: state.ready.clone(),
        };
        self.snapshot
            .bindings
            .insert(d.id.key.clone(), Arc::new(binding));
    }
}

/// A secret key the release's declared egress headers refer to that the binding makes
/// neither readable nor revealable: its calls could not send those headers, and the
/// release could use no other key.
fn ungranted_secret_reference(
    spec: &toolgrid_api::ToolBindingSpec,
    release: &ResolvedRelease,
) -> Option<(Reason, String)> {
    // An imported tool's headers refer to its source's own credentials, never to keys of
    // an agent's Secret.
    if release.upstream.is_some() {
        return None;
    }
    let key = super::release::declared_secret_keys(&release.network)
        .into_iter()
        .find(|key| {
            !spec.secret_keys_readable.contains(key) && !spec.secret_keys_revealable.contains(key)
        })?;
    Some((
        Reason::UngrantedSecretReference,
        format!(
            "release {} declares egress headers that refer to ${{secret:{key}}}, which neither \
             spec.secretKeysReadable nor spec.secretKeysRevealable lists (a release uses a secret only as its \
             binding grants it)",
            release.key.name
        ),
    ))
}

/// The first config or secret key a binding lists that one of its agents does not have:
/// a binding can only narrow what its agents have.
fn missing_binding_key(
    spec: &toolgrid_api::ToolBindingSpec,
    ns: &str,
    agents: &BTreeMap<ObjectKey, Arc<ResolvedAgent>>,
) -> Option<(Reason, String)> {
    for name in &spec.agents {
        let agent = agents.get(&ObjectKey::new(ns, name.clone()))?;
        if let Some(key) = spec
            .config_keys_readable
            .iter()
            .find(|k| !agent.config.contains_key(*k))
        {
            let config_map = agent
                .spec
                .config_map_ref
                .as_ref()
                .map(|r| format!("its ConfigMap {ns}/{}", r.name))
                .unwrap_or_else(|| "no configMapRef".into());
            return Some((
                Reason::MissingConfigKey,
                format!(
                    "spec.configKeysReadable: agent {name:?} has no config key {key:?} ({config_map}); a binding can only narrow what the agent has"
                ),
            ));
        }
        if let Some((field, key)) = spec
            .secret_keys_readable
            .iter()
            .map(|k| ("secretKeysReadable", k))
            .chain(
                spec.secret_keys_revealable
                    .iter()
                    .map(|k| ("secretKeysRevealable", k)),
            )
            .find(|(_, k)| !agent.secrets.contains_key(*k))
        {
            let secret = agent
                .spec
                .secret_ref
                .as_ref()
                .map(|r| format!("its Secret {ns}/{}", r.name))
                .unwrap_or_else(|| "no secretRef".into());
            return Some((
                Reason::MissingSecretKey,
                format!(
                    "spec.{field}: agent {name:?} has no secret key {key:?} ({secret}); a binding can only narrow what the agent has"
                ),
            ));
        }
    }
    None
}

/// The release a binding resolves to: the one it names, or the newest Ready release in its
/// version range (all releases when it gives none).
pub fn resolve_binding_release<'r>(
    binding: &ToolBinding,
    releases: &'r BTreeMap<ObjectKey, Arc<ResolvedRelease>>,
) -> Result<&'r ObjectKey, (Reason, String)> {
    let ns = binding.metadata.namespace.clone().unwrap_or_default();
    let spec = &binding.spec;
    // With a rollout, the stable release is never the canary.
    let canary = spec.rollout.as_ref().map(|r| r.canary.as_str());
    let candidates = releases.values().filter(|r| {
        r.key.namespace == ns && r.tool == spec.tool && Some(r.key.name.as_str()) != canary
    });
    let selector = spec
        .release
        .clone()
        .unwrap_or(toolgrid_api::ReleaseSelector {
            version: None,
            name: None,
        });
    if let Some(name) = &selector.name {
        return candidates
            .into_iter()
            .find(|r| &r.key.name == name)
            .map(|r| &r.key)
            .ok_or_else(|| {
                (
                    Reason::NoMatchingRelease,
                    format!(
                        "spec.release.name: no Ready ToolRelease {name:?} of tool {:?}",
                        spec.tool
                    ),
                )
            });
    }
    let range = match &selector.version {
        Some(v) => Some(semver::VersionReq::parse(v).map_err(|e| {
            (
                Reason::InvalidSpec,
                format!("spec.release.version: {v:?} is not a version range: {e}"),
            )
        })?),
        None => None,
    };
    candidates
        .filter(|r| range.as_ref().is_none_or(|req| req.matches(&r.version)))
        .max_by(|a, b| a.version.cmp(&b.version))
        .map(|r| &r.key)
        .ok_or_else(|| {
            (
                Reason::NoMatchingRelease,
                format!(
                    "no Ready ToolRelease of tool {:?} matches {}",
                    spec.tool,
                    selector.version.as_deref().unwrap_or("any version")
                ),
            )
        })
}

/// The plan a binding's `rollout` declares.
fn plan_of(rollout: &toolgrid_api::Rollout) -> Result<Plan, FieldError> {
    Plan::new(
        &rollout.steps,
        rollout
            .interval
            .map(|i| i64::try_from(i.get().as_millis()).unwrap_or(i64::MAX)),
        rollout.max_error_rate_increase,
        rollout.min_calls,
    )
    .map_err(|e| FieldError::new("spec.rollout", e.to_string()))
}

/// The rollout columns of a binding's status.
fn rollout_status(stable: &str, rollout: &ResolvedRollout) -> RolloutStatus {
    let p = &rollout.progress;
    RolloutStatus {
        stable: stable.to_string(),
        canary: rollout.canary.name.clone(),
        weight: u32::from(rollout.weight()),
        phase: p.phase.to_string(),
        step: p.step_number(&rollout.plan),
        steps: rollout.plan.steps.iter().map(|&w| u32::from(w)).collect(),
        message: p.message.clone(),
        stable_calls: p.stable.calls,
        stable_errors: p.stable.errors,
        canary_calls: p.canary.calls,
        canary_errors: p.canary.errors,
    }
}

/// `Degraded`: true once the canary was rolled back.
fn degraded_of(rollout: &ResolvedRollout) -> Desired {
    let p = &rollout.progress;
    match p.phase {
        Phase::Aborted => Desired::degraded(true, Reason::CanaryRolledBack, p.message.clone()),
        Phase::Progressing | Phase::Promoted => {
            Desired::degraded(false, Reason::CanaryHealthy, p.message.clone())
        }
    }
}

fn check_binding(binding: &ToolBinding) -> Result<(), FieldError> {
    let spec = &binding.spec;
    if spec.agents.is_empty() {
        return Err(FieldError::new("spec.agents", "bind at least one agent"));
    }
    if let Some(rollout) = &spec.rollout {
        plan_of(rollout)?;
        if spec.release.as_ref().and_then(|r| r.name.as_ref()) == Some(&rollout.canary) {
            return Err(FieldError::new(
                "spec.rollout.canary",
                "the canary is the release spec.release names; name another",
            ));
        }
    }
    if let Some(selector) = &spec.release {
        if selector.name.is_some() && selector.version.is_some() {
            return Err(FieldError::new(
                "spec.release",
                "give a version range or a name, not both",
            ));
        }
        if let Some(v) = &selector.version {
            semver::VersionReq::parse(v).map_err(|e| {
                FieldError::new(
                    "spec.release.version",
                    format!("{v:?} is not a version range: {e}"),
                )
            })?;
        }
    }
    Ok(())
}

//! What every kind shares: a declaration with its generation, the recording of its state
//! and conditions, and the names declared more than once or in documents that did not
//! parse (neither is served).

use super::Resolver;
use crate::manifest::{Source, Sourced};
use crate::snapshot::{ResourceId, ResourceState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::Resource;
use kube::core::object::HasSpec;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use toolgrid_api::conditions::{self, Desired, Reason};
use toolgrid_api::{Kind, KindStatus};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::FieldError;

/// One declaration of a resource, before its checks.
pub(super) struct Declared<'a, T> {
    pub(super) id: ResourceId,
    pub(super) object: &'a T,
    pub(super) source: &'a Source,
    pub(super) spec_hash: String,
    pub(super) generation: i64,
}

pub(super) fn hash_spec<T: serde::Serialize>(spec: &T) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..12])
}

impl<'a> Resolver<'a> {
    pub(super) fn declared<T>(
        &mut self,
        kind: Kind,
        items: &'a [Sourced<T>],
    ) -> Vec<Declared<'a, T>>
    where
        T: Resource + HasSpec,
        T::Spec: serde::Serialize,
    {
        let mut out = Vec::new();
        for item in items {
            let meta = item.object.meta();
            let id = ResourceId {
                kind,
                key: ObjectKey::new(
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
            };
            if self.duplicates.contains_key(&id) {
                continue;
            }
            let spec_hash = hash_spec(item.object.spec());
            let generation =
                meta.generation
                    .unwrap_or_else(|| match self.input.previous.get(&id) {
                        Some(previous) if previous.spec_hash == spec_hash => previous.generation,
                        Some(previous) => previous.generation + 1,
                        None => 1,
                    });
            out.push(Declared {
                id,
                object: &item.object,
                source: &item.source,
                spec_hash,
                generation,
            });
        }
        out
    }

    /// Records a resource's state; `status` holds the kind's own status fields (the
    /// conditions and observedGeneration are filled in here).
    fn record(
        &mut self,
        declared: (&ResourceId, &Source, i64, &str),
        ready: Desired,
        degraded: Option<Option<Desired>>,
        mut status: KindStatus,
        columns: Vec<(String, String)>,
    ) {
        let (id, source, generation, spec_hash) = declared;
        let previous = self.input.previous.get(id);
        let mut conditions: Vec<Condition> = previous
            .and_then(|p| p.status.get("conditions"))
            // Read in place: the previous status is not copied to be parsed.
            .and_then(|c| Vec::<Condition>::deserialize(c).ok())
            .unwrap_or_default();
        conditions::apply_ready(&mut conditions, &ready, Some(generation), self.input.now);
        match degraded {
            Some(Some(degraded)) => {
                conditions::apply(&mut conditions, &degraded, Some(generation), self.input.now)
            }
            Some(None) => conditions.retain(|c| c.type_ != conditions::DEGRADED),
            None => {}
        }
        status.set_conditions(conditions, generation);
        self.snapshot.resources.insert(
            id.clone(),
            ResourceState {
                id: id.clone(),
                source: source.to_string(),
                generation,
                spec_hash: spec_hash.to_string(),
                ready,
                status: status.to_value(),
                columns,
            },
        );
    }

    pub(super) fn record_declared<T>(
        &mut self,
        d: &Declared<'_, T>,
        ready: Desired,
        status: KindStatus,
        columns: Vec<(String, String)>,
    ) {
        self.record(
            (&d.id, d.source, d.generation, &d.spec_hash),
            ready,
            None,
            status,
            columns,
        );
    }

    /// As [`Self::record_declared`], with a `Degraded` condition beside Ready (a binding
    /// with a rollout); `None` removes one left from before.
    pub(super) fn record_declared_degraded<T>(
        &mut self,
        d: &Declared<'_, T>,
        ready: Desired,
        degraded: Option<Desired>,
        status: KindStatus,
        columns: Vec<(String, String)>,
    ) {
        self.record(
            (&d.id, d.source, d.generation, &d.spec_hash),
            ready,
            Some(degraded),
            status,
            columns,
        );
    }

    pub(super) fn invalid<T>(&mut self, d: &Declared<'_, T>, error: FieldError) {
        let message = format!("{error}{}", d.source.suffix());
        tracing::warn!(kind = %d.id.kind, resource = %d.id.key, "{message}");
        self.record_declared(
            d,
            Desired::not_ready(Reason::InvalidSpec, message),
            KindStatus::empty(d.id.kind),
            Vec::new(),
        );
    }

    pub(super) fn find_duplicates(&mut self) {
        let set = self.input.set;
        let mut places: BTreeMap<ResourceId, Vec<String>> = BTreeMap::new();
        let mut note = |kind: Kind, meta: &ObjectMeta, source: &Source| {
            let id = ResourceId {
                kind,
                key: ObjectKey::new(
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
            };
            places.entry(id).or_default().push(source.to_string());
        };
        for s in &set.tools {
            note(Kind::Tool, &s.object.metadata, &s.source);
        }
        for s in &set.releases {
            note(Kind::ToolRelease, &s.object.metadata, &s.source);
        }
        for s in &set.bindings {
            note(Kind::ToolBinding, &s.object.metadata, &s.source);
        }
        for s in &set.middleware {
            note(Kind::Middleware, &s.object.metadata, &s.source);
        }
        for s in &set.agents {
            note(Kind::Agent, &s.object.metadata, &s.source);
        }
        for s in &set.pools {
            note(Kind::WorkerPool, &s.object.metadata, &s.source);
        }
        for doc in &set.invalid {
            if let (Some(kind), Some(name)) = (doc.kind, &doc.name) {
                places
                    .entry(ResourceId {
                        kind,
                        key: ObjectKey::new(doc.namespace.clone(), name.clone()),
                    })
                    .or_default()
                    .push(doc.source.to_string());
            }
        }
        self.duplicates = places.into_iter().filter(|(_, p)| p.len() > 1).collect();
    }

    pub(super) fn record_duplicates_and_invalid_documents(&mut self) {
        for (id, places) in self.duplicates.clone() {
            let message = format!(
                "{} {} is declared more than once: {}",
                id.kind,
                id.key,
                places.join(", ")
            );
            tracing::warn!("{message}");
            let previous_generation = self
                .input
                .previous
                .get(&id)
                .map(|p| p.generation)
                .unwrap_or(1);
            let source = Source {
                file: places[0].clone().into(),
                document: 0,
            };
            self.record(
                (&id, &source, previous_generation, ""),
                Desired::not_ready(Reason::DuplicateName, message),
                None,
                KindStatus::empty(id.kind),
                Vec::new(),
            );
            if let Some(state) = self.snapshot.resources.get_mut(&id) {
                state.source = places.join(", ");
            }
        }
        for doc in &self.input.set.invalid {
            match (doc.kind, &doc.name) {
                (Some(kind), Some(name)) => {
                    let id = ResourceId {
                        kind,
                        key: ObjectKey::new(doc.namespace.clone(), name.clone()),
                    };
                    if self.duplicates.contains_key(&id) {
                        continue;
                    }
                    tracing::warn!("{doc}");
                    let generation = self
                        .input
                        .previous
                        .get(&id)
                        .map(|p| p.generation)
                        .unwrap_or(1);
                    let message = if doc.field.is_empty() {
                        format!("{}{}", doc.message, doc.source.suffix())
                    } else {
                        format!("{}: {}{}", doc.field, doc.message, doc.source.suffix())
                    };
                    self.record(
                        (&id, &doc.source, generation, ""),
                        Desired::not_ready(Reason::InvalidSpec, message),
                        None,
                        KindStatus::empty(id.kind),
                        Vec::new(),
                    );
                }
                _ => {
                    tracing::warn!("{doc}");
                    self.snapshot.problems.push(doc.to_string());
                }
            }
        }
    }
}

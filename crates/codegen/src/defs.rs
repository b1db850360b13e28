//! The definition of one tool as the generators see it, from what `ListTools` answers.

use std::collections::BTreeSet;
use toolgrid_api::Command;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;

/// One tool as the generators see it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub namespace: String,
    pub name: String,
    pub description: String,
    pub effect: String,
    pub commands: Vec<Command>,
}

impl ToolDef {
    /// From a `ListTools` answer (its commands' `definition_json`).
    pub fn from_info(info: &proto::ToolInfo) -> Result<Self, ApiError> {
        let commands = info
            .commands
            .iter()
            .map(|c| {
                serde_json::from_str::<Command>(&c.definition_json).map_err(|e| {
                    ApiError::new(
                        ErrorKind::Internal,
                        format!(
                            "the definition of {}/{} is not readable ({e}); is the control plane older than this CLI?",
                            info.name, c.name
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ToolDef {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            description: info.description.clone(),
            effect: info.effect.clone(),
            commands,
        })
    }

    /// Every declared error of every command, once by name (the first description wins).
    pub fn errors(&self) -> Vec<&toolgrid_api::DeclaredError> {
        let mut seen = BTreeSet::new();
        self.commands
            .iter()
            .flat_map(|c| &c.errors)
            .filter(|e| seen.insert(e.name.clone()))
            .collect()
    }
}

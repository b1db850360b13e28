//! The caller's callable commands as a model API's tool definitions
//! (`GET /v1/tools?format=`, gRPC `ListTools` with a `format`, `toolgrid schema`).
//!
//! Only what [`Gateway::model_tools`] shows the caller (an agent: its bound commands) is
//! ever rendered; a tool asked for by name that the caller cannot see is `unknown-tool`,
//! the same answer as for a tool that does not exist.

use super::Gateway;
use serde_json::Value;
use toolgrid_catalog::model_formats::{self, ModelFormat};
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};

impl Gateway {
    /// `{format, tools, names, notes}` for the caller's commands in `namespace`, of
    /// `tools` only when it names some.
    pub fn model_schemas(
        &self,
        caller: &Principal,
        namespace: &str,
        format: &str,
        tools: &[String],
    ) -> Result<Value, ApiError> {
        let format: ModelFormat = format.parse()?;
        let mut visible = self.model_tools(caller, namespace);
        if !tools.is_empty() {
            for name in tools {
                if !visible.iter().any(|t| &t.tool == name) {
                    return Err(ApiError::new(
                        ErrorKind::UnknownTool,
                        format!("no tool {name:?} that you may call in this namespace"),
                    ));
                }
            }
            visible.retain(|t| tools.contains(&t.tool));
        }
        Ok(model_formats::render(&visible, format))
    }
}

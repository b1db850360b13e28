//! A running call's program calls a tool (code mode): the child call goes through
//! admission as the parent's own caller (its bindings, permissions, middleware, approval,
//! rate limits and audit), under the idempotency key `<parent id>/<n>`, and the answer is
//! the child's end. A request sent again (a reconnect, a replay after failover) finds the
//! same child.

use super::Gateway;
use super::admission::Invocation;
use crate::scheduler::NestedCaller;
use toolgrid_catalog::ResolvedTool;
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{
    CallRecord, CallState, ErrorKind, NestedAnswer, NestedOutcome, NestedRequest, nested,
};
use toolgrid_core::ids::ObjectKey;

/// The typed stubs of what a program may call: each tool's allowed commands (all for
/// `None`), sorted by name.
pub fn stubs_of(tools: &[(std::sync::Arc<ResolvedTool>, Option<Vec<String>>)]) -> String {
    use toolgrid_codegen::typescript::{StubCommand, StubTool, stubs};
    let schemas: Vec<(&ResolvedTool, Vec<_>)> = tools
        .iter()
        .map(|(tool, allowed)| {
            let commands = tool
                .commands
                .iter()
                .filter(|c| allowed.as_ref().is_none_or(|a| a.contains(&c.name)))
                .map(|c| (c.clone(), c.args_schema(), c.result_schema().cloned()))
                .collect();
            (&**tool, commands)
        })
        .collect();
    let mut stub_tools: Vec<StubTool> = schemas
        .iter()
        .map(|(tool, commands)| StubTool {
            name: &tool.key.name,
            description: &tool.spec.description,
            commands: commands
                .iter()
                .map(|(c, args, result)| StubCommand {
                    name: &c.name,
                    description: &c.description,
                    args,
                    result: result.as_ref(),
                })
                .collect(),
        })
        .collect();
    stub_tools.sort_by(|a, b| a.name.cmp(b.name));
    stubs(&stub_tools)
}

/// Ranks the tools a program may call against `query`: a command scores one point for each
/// word of the query in its tool's or its own name and description (names count twice); an
/// empty query matches everything. Best first, then by name; at most `limit`.
pub fn rank(
    tools: &[(std::sync::Arc<ResolvedTool>, Option<Vec<String>>)],
    query: &str,
    limit: usize,
) -> Vec<serde_json::Value> {
    use toolgrid_codegen::typescript::{StubCommand, signature};
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut scored = Vec::new();
    for (tool, allowed) in tools {
        for command in &tool.commands {
            if allowed.as_ref().is_some_and(|a| !a.contains(&command.name)) {
                continue;
            }
            let names = format!("{} {}", tool.key.name, command.name).to_lowercase();
            let text = format!("{} {}", tool.spec.description, command.description).to_lowercase();
            let score: usize = words
                .iter()
                .map(|w| {
                    2 * usize::from(names.contains(w.as_str()))
                        + usize::from(text.contains(w.as_str()))
                })
                .sum();
            if words.is_empty() || score > 0 {
                scored.push((score, tool.clone(), command.clone()));
            }
        }
    }
    scored.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.key.name.cmp(&b.1.key.name))
            .then_with(|| a.2.name.cmp(&b.2.name))
    });
    scored
        .into_iter()
        .take(limit)
        .map(|(_, tool, command)| {
            let args = command.args_schema();
            let stub = StubCommand {
                name: &command.name,
                description: &command.description,
                args,
                result: command.result_schema(),
            };
            serde_json::json!({
                "tool": tool.key.name,
                "command": command.name,
                "description": if command.description.is_empty() { &tool.spec.description } else { &command.description },
                "signature": signature(&tool.key.name, &stub),
            })
        })
        .collect()
}

/// The `code` tool's description for one agent: its own, then the tools its programs may
/// call.
pub fn describe_code(description: &str, stubs: &str) -> String {
    format!(
        "{description}\n\nThe tools a program can call (TypeScript declarations; \
         `await tools.<tool>.<command>({{...}})`):\n```ts\n{stubs}```"
    )
}

/// Times a program's wait for one child is renewed (each as long as the child's own
/// deadline, approval included) before it gives up with `timeout`.
const MAX_WAITS: usize = 4;

/// The caller a call was admitted for: its agent, or the operator who made it.
pub fn caller_of(record: &CallRecord) -> Principal {
    match &record.spec.access.agent {
        Some(agent) => Principal::Agent {
            agent: ObjectKey::new(record.namespace.clone(), agent.clone()),
        },
        None => Principal::Operator {
            subject: record
                .spec
                .caller
                .strip_prefix("operator:")
                .unwrap_or(&record.spec.caller)
                .to_string(),
        },
    }
}

/// What a child call's end tells its program.
pub fn answer_of(record: &CallRecord) -> NestedOutcome {
    match (record.state, &record.error) {
        (CallState::Succeeded, _) => {
            NestedOutcome::Value(record.result.clone().unwrap_or(serde_json::Value::Null))
        }
        (_, Some(error)) => NestedOutcome::error(error.kind, error.message.clone()),
        (state, None) => NestedOutcome::error(
            ErrorKind::Timeout,
            format!(
                "the tool call did not end in time (it is {})",
                state.as_str()
            ),
        ),
    }
}

#[async_trait::async_trait]
impl NestedCaller for Gateway {
    async fn call_nested(
        &self,
        parent: &CallRecord,
        seq: u64,
        request: NestedRequest,
    ) -> NestedAnswer {
        // In the scheduler's `tool_call` span.
        self.child_call(parent, seq, request).await
    }
}

impl Gateway {
    /// A program's request with its tool's, command's and arguments' names as the tool
    /// spells them, where the program spelled them otherwise (Python's `web_fetch` and
    /// `max_chars`, JavaScript's `maxChars`, for `web-fetch` and `max-chars`;
    /// [`nested::spelled_as`]), among the tools it may call. A name it does not match is
    /// left as it is, for admission to refuse.
    fn respelled(
        &self,
        caller: &Principal,
        namespace: &str,
        mut request: NestedRequest,
    ) -> NestedRequest {
        let tools = self.programmable_tools(caller, namespace);
        if let Some(name) = nested::spelled_as(
            &request.tool,
            tools.iter().map(|(t, _)| t.key.name.as_str()),
        ) {
            request.tool = name.to_string();
        }
        let Some((tool, allowed)) = tools.iter().find(|(t, _)| t.key.name == request.tool) else {
            return request;
        };
        let commands = tool
            .commands
            .iter()
            .map(|c| c.name.as_str())
            .filter(|c| allowed.as_ref().is_none_or(|a| a.iter().any(|n| n == c)));
        if let Some(name) = nested::spelled_as(&request.command, commands) {
            request.command = name.to_string();
        }
        let Some(command) = tool.command(&request.command) else {
            return request;
        };
        let properties = command
            .args_schema()
            .get("properties")
            .and_then(|p| p.as_object());
        if let (Some(properties), serde_json::Value::Object(args)) = (properties, &mut request.args)
        {
            *args = std::mem::take(args)
                .into_iter()
                .map(|(name, value)| {
                    let own = nested::spelled_as(&name, properties.keys().map(String::as_str));
                    (own.map(str::to_string).unwrap_or(name), value)
                })
                .collect();
        }
        request
    }

    async fn child_call(
        &self,
        parent: &CallRecord,
        seq: u64,
        request: NestedRequest,
    ) -> NestedAnswer {
        let caller = caller_of(parent);
        if request.tool == nested::SEARCH_TOOL {
            let query = request
                .args
                .get("query")
                .and_then(|q| q.as_str())
                .unwrap_or("");
            let limit = request
                .args
                .get("limit")
                .and_then(|l| l.as_u64())
                .map_or(10, |l| (l as usize).clamp(1, nested::MAX_SEARCH_RESULTS));
            let found = self.search_programmable(&caller, &parent.namespace, query, limit);
            return NestedAnswer {
                call: None,
                outcome: NestedOutcome::Value(serde_json::Value::Array(found)),
            };
        }
        let request = self.respelled(&caller, &parent.namespace, request);
        let invocation = Invocation {
            namespace: parent.namespace.clone(),
            tool: request.tool,
            command: Some(request.command),
            argv: Vec::new(),
            args: Some(request.args),
            stdin: None,
            idempotency_key: Some(nested::child_key(&parent.id, seq)),
            dry_run: parent.spec.dry_run,
            from_program: true,
            // Under the current span: the worker's host call's, adopted by the scheduler.
            traceparent: None,
        };
        let admitted = match self.admit(&caller, invocation).await {
            Ok(admitted) => admitted,
            Err(refused) => {
                return NestedAnswer {
                    call: None,
                    outcome: NestedOutcome::error(refused.kind, refused.message),
                };
            }
        };
        let id = admitted.record.id.clone();
        let mut record = admitted.record;
        for _ in 0..MAX_WAITS {
            if record.state.is_terminal() {
                break;
            }
            let limit = self.wait_limit(&record);
            record = match self.wait(&id, limit).await {
                Ok(record) => record,
                Err(error) => {
                    return NestedAnswer {
                        call: Some(id),
                        outcome: NestedOutcome::error(error.kind, error.message),
                    };
                }
            };
        }
        NestedAnswer {
            outcome: answer_of(&record),
            call: Some(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::call::{CallAccess, CallError, CallSpec};

    fn record(agent: Option<&str>, caller: &str) -> CallRecord {
        CallRecord {
            id: "c".into(),
            namespace: "team".into(),
            tool: "code".into(),
            command: "run".into(),
            release: "r".into(),
            release_digest: "sha256:00".into(),
            state: CallState::Running,
            args: serde_json::json!({}),
            spec: CallSpec {
                access: CallAccess {
                    agent: agent.map(String::from),
                    ..CallAccess::default()
                },
                caller: caller.into(),
                ..CallSpec::default()
            },
            stdin: vec![],
            idempotency_key: None,
            request_hash: String::new(),
            epoch: 1,
            worker: None,
            result: None,
            error: None,
            created_at_ms: 0,
            finished_at_ms: None,
        }
    }

    #[test]
    fn a_child_calls_as_its_parents_caller() {
        assert_eq!(
            caller_of(&record(Some("planner"), "agent:team/planner")),
            Principal::Agent {
                agent: ObjectKey::new("team", "planner")
            }
        );
        assert_eq!(
            caller_of(&record(None, "operator:admin")),
            Principal::Operator {
                subject: "admin".into()
            }
        );
    }

    #[test]
    fn a_childs_end_is_its_programs_answer() {
        let mut done = record(None, "operator:admin");
        done.state = CallState::Succeeded;
        done.result = Some(serde_json::json!({"n": 1}));
        assert_eq!(
            answer_of(&done),
            NestedOutcome::Value(serde_json::json!({"n": 1}))
        );
        done.state = CallState::Failed;
        done.error = Some(CallError::new(ErrorKind::Denied, "no"));
        assert_eq!(
            answer_of(&done),
            NestedOutcome::error(ErrorKind::Denied, "no")
        );
        let waiting = record(None, "operator:admin");
        assert!(matches!(
            answer_of(&waiting),
            NestedOutcome::Error(e) if e.kind == ErrorKind::Timeout
        ));
    }
}

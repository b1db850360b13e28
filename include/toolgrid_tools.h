/*
 * toolgrid_tools.h: the tool door of WASI preview 1 programs run by toolgrid's `code`
 * tool (code mode): a program calls the tools of the agent it runs for.
 *
 * Import module "toolgrid", next to toolgrid_http.h's http_send/http_take. The full ABI is
 * in docs/host-abi.md, what models and operators see in docs/code-mode.md.
 *
 * Each request is a JSON document {"tool": NAME, "command": NAME, "args": {...}} (at most
 * 1 MiB). It is numbered in issue order from 1, committed to the call's oplog before it
 * leaves, and admitted as a child call of the running one, as the same agent, through its
 * bindings, middleware, approval, rate limits and audit. Requests run concurrently. A call
 * makes at most 256; the 257th ends the call with `tool-call-limit`. A replay after a
 * failover answers recorded requests from the oplog, in the order they were first told,
 * and sends an unanswered one again: it finds the same child call.
 *
 * The answer document of a request: {"ok": true, "value": RESULT, "call": CHILD_ID} or
 * {"ok": false, "error": {"kind": KIND, "message": TEXT}, "call": CHILD_ID or null}.
 */
#ifndef TOOLGRID_TOOLS_H
#define TOOLGRID_TOOLS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TOOLGRID_TOOLS_OK = 0,        /* started (tool_call), one ended (tool_wait), taken */
    TOOLGRID_TOOLS_NONE = 1,      /* tool_wait: no request is outstanding */
    TOOLGRID_TOOLS_INVALID = 2,   /* tool_call: not a request document */
    TOOLGRID_TOOLS_NO_ANSWER = 4, /* tool_take: no such answer, or the buffer is too small */
};

/* Starts a request; writes its number (from 1) to *seq_out. */
__attribute__((import_module("toolgrid"), import_name("tool_call")))
int32_t toolgrid_tool_call(const uint8_t *request, uint32_t request_len, uint32_t *seq_out);

/* Waits for the next request that ended; writes its number and its answer's length. */
__attribute__((import_module("toolgrid"), import_name("tool_wait")))
int32_t toolgrid_tool_wait(uint32_t *seq_out, uint32_t *answer_len_out);

/* Copies request `seq`'s answer into buf (at least its answer_len bytes) and frees it. */
__attribute__((import_module("toolgrid"), import_name("tool_take")))
int32_t toolgrid_tool_take(uint32_t seq, uint8_t *buf, uint32_t len);

#ifdef __cplusplus
}
#endif

#endif /* TOOLGRID_TOOLS_H */

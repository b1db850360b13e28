/*
 * toolgrid_progress.h: progress reports for WASI preview 1 tools run by toolgrid.
 *
 * A preview 1 module imports this function from the module "toolgrid" (next to
 * toolgrid_http.h's http_send/http_take); a preview 2 component imports the WIT interface
 * toolgrid:tool/progress@0.1.0 (wit/tool.wit) instead. The full ABI is in docs/host-abi.md,
 * what callers see in docs/progress.md.
 *
 * Each report:
 *   - restarts the call's idle deadline (the Tool's `timeout`), never past its `maxTimeout`
 *     from the start of the call;
 *   - is recorded in the call's oplog (kind "progress") and streamed to callers (gRPC
 *     InvokeStream, HTTP text/event-stream, MCP notifications/progress);
 *   - keeps at most 1024 bytes of the message (cut at a character boundary; bytes that are
 *     not UTF-8 become U+FFFD); secret values in it are replaced by their references.
 * A call reports at most 1000 times; later reports are dropped (code 1) and extend
 * nothing. Like every host call, a report is replayed from the oplog when the call moves
 * to another worker: report the same messages in the same order.
 */
#ifndef TOOLGRID_PROGRESS_H
#define TOOLGRID_PROGRESS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TOOLGRID_PROGRESS_OK = 0,      /* reported */
    TOOLGRID_PROGRESS_DROPPED = 1  /* over the call's 1000 reports: dropped */
};

/*
 * Reports progress: `message` (UTF-8, `message_len` bytes) is what callers see. A pointer
 * outside the module's memory traps.
 */
__attribute__((import_module("toolgrid"), import_name("progress")))
int32_t toolgrid_progress(const uint8_t *message, uint32_t message_len);

#ifdef __cplusplus
}
#endif

#endif /* TOOLGRID_PROGRESS_H */

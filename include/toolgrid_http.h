/*
 * toolgrid_http.h: outgoing HTTP for WASI preview 1 tools run by toolgrid.
 *
 * Preview 2 components use wasi:http/outgoing-handler; preview 1 modules, which have no
 * HTTP in WASI, import these two functions from the module "toolgrid". The full ABI is in
 * docs/host-abi.md.
 *
 * Secrets are used by reference only in headers the release declares on an egress rule
 * (network.egress[].headers): the host sets them as the request leaves, and the tool never
 * sees the values. ${secret:NAME} that the tool writes is sent as written (docs/host-abi.md).
 *
 * Every request goes through the release's egress policy and the call's oplog: its start is
 * committed before it leaves the sandbox, it carries an Idempotency-Key header derived from
 * the call and the request's number, and its response is recorded, so a call moved to
 * another worker replays it instead of sending it again.
 */
#ifndef TOOLGRID_HTTP_H
#define TOOLGRID_HTTP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes of toolgrid_http_send and toolgrid_http_take. */
enum {
    TOOLGRID_HTTP_OK = 0,        /* a response (any HTTP status) is ready to take */
    TOOLGRID_HTTP_DENIED = 1,    /* refused before it left: the egress policy refused the
                                    destination (kind "egress-denied"), or a header the
                                    release declares refers to a secret the call may not
                                    use (kind "unknown-secret") */
    TOOLGRID_HTTP_INVALID = 2,   /* the request JSON is malformed, or sets Host,
                                    Content-Length or a hop-by-hop header */
    TOOLGRID_HTTP_FAILED = 3,    /* DNS, connection, TLS or protocol failure */
    TOOLGRID_HTTP_BAD_HANDLE = 4 /* no such handle, or the buffer is too small */
};

/*
 * Sends one request, described as JSON:
 *   {"method": "POST", "url": "http://host:port/path",
 *    "headers": [["content-type", "application/json"], ...],
 *    "body": "text"}                 (or "bodyBase64": "..." for binary bodies)
 * Blocks until the response (or failure) is known. A request or response larger than the
 * release's limits.requestBytes / limits.responseBytes ends the call (request-limit,
 * response-limit); so do untaken responses beyond the release's memory (memory-limit).
 * Whatever the code, *handle and
 * *response_len describe a JSON document to take with toolgrid_http_take:
 *   on TOOLGRID_HTTP_OK: {"status": 200, "headers": [[name, value], ...],
 *                         "body": "text"}   (or "bodyBase64" when the body is not UTF-8)
 *   otherwise:           {"error": {"kind": "egress-denied" | "invalid-request" | "failed",
 *                                   "message": "..."}}
 */
__attribute__((import_module("toolgrid"), import_name("http_send")))
int32_t toolgrid_http_send(const uint8_t *request, uint32_t request_len,
                           uint32_t *handle, uint32_t *response_len);

/*
 * Copies the JSON document of `handle` into buf (len must be at least its response_len) and
 * frees the handle. Returns TOOLGRID_HTTP_OK, or TOOLGRID_HTTP_BAD_HANDLE.
 */
__attribute__((import_module("toolgrid"), import_name("http_take")))
int32_t toolgrid_http_take(uint32_t handle, uint8_t *buf, uint32_t len);

#ifdef __cplusplus
}
#endif

#endif /* TOOLGRID_HTTP_H */

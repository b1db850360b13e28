/*
 * The HTTP GET of the fetch example and the web-fetch built-in through wasi:http (the
 * wit-bindgen bindings in bindings/): a growable buffer, UTF-8 and JSON output, URL
 * parsing and resolution, one GET with its response, argument helpers. Included by one C
 * file, which defines before it: TOOL_NAME (the stderr prefix), exit_names[] and the
 * EXIT_REQUEST_FAILED, EXIT_INVALID_ARGUMENT and EXIT_EGRESS_DENIED codes, READ_CHUNK and
 * USER_AGENT, and includes <stdarg.h>, <stdint.h>, <stdio.h>, <stdlib.h>, <string.h> and
 * the bindings' header.
 */
/* Ends the program with status `code`. exit() would go through the preview 1
 * adapter, which reports any non-zero status as 1; exit-with-code reports
 * `code` itself. It does not run atexit handlers, so stdio is flushed here. */
static _Noreturn void exit_with(int code) {
    fflush(stdout);
    fflush(stderr);
    wasi_cli_exit_exit_with_code((uint8_t)code);
    abort(); /* not reached: exit-with-code does not return */
}

/* Prints "fetch: <error name>: <message>" on stderr and exits with `code`. */
static _Noreturn void fail(int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7F) *p = ' ';
    fprintf(stderr, TOOL_NAME ": %s: %s\n", exit_names[code], msg);
    exit_with(code);
}

/* ------------------------------------------------------------------ buffer */

typedef struct {
    char *data;
    size_t len, cap;
} buf;

static void b_addn(buf *b, const void *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) fail(EXIT_REQUEST_FAILED, "out of memory");
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void b_add(buf *b, const char *s) { b_addn(b, s, strlen(s)); }

static void b_free(buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* --------------------------------------------------------------------- UTF-8 */

/* Length of the longest prefix of s[0..n) that starts a valid UTF-8
 * sequence (the Unicode "maximal subpart"), and in *complete whether it is a
 * whole character. A byte that cannot start a sequence gives 1, !complete. */
static size_t utf8_prefix(const unsigned char *s, size_t n, int *complete) {
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* range of the second byte */
    *complete = 0;
    if (c < 0x80) { *complete = 1; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    while (k < need && k < n) {
        unsigned d = s[k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) break;
        k++;
    }
    *complete = k == need;
    return k;
}

/* Writes s[0..n) to f as a JSON string: escaped, invalid UTF-8 replaced by
 * U+FFFD (one per maximal invalid subpart, like most decoders). If
 * drop_cut_tail, an incomplete character at the very end is dropped instead
 * (it was cut by the byte limit). */
static void json_str(FILE *f, const char *s, size_t n, int drop_cut_tail) {
    const unsigned char *p = (const unsigned char *)s;
    putc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            putc('\\', f);
            putc((int)c, f);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            switch (c) {
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default: fprintf(f, "\\u%04x", c); break;
            }
            i++;
        } else if (c < 0x80) {
            putc((int)c, f);
            i++;
        } else {
            int complete;
            size_t k = utf8_prefix(p + i, n - i, &complete);
            if (complete) fwrite(p + i, 1, k, f);
            else if (drop_cut_tail && i + k == n && (k > 1 || (c >= 0xC2 && c <= 0xF4))) break;
            else fputs("\xEF\xBF\xBD", f);
            i += k;
        }
    }
    putc('"', f);
}

/* --------------------------------------------------------------------- URLs */

typedef struct {
    wasi_http_types_scheme_t scheme; /* http or https */
    buf origin;                      /* "https://host:port" as written */
    buf authority;                   /* "host:port" */
    buf path;                        /* path-with-query, starting with '/' */
} url_parts;

static void url_free(url_parts *u) {
    b_free(&u->origin);
    b_free(&u->authority);
    b_free(&u->path);
}

static int scheme_len(const char *s) {
    int i = 0;
    if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) return 0;
    while ((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
           (s[i] >= '0' && s[i] <= '9') || s[i] == '+' || s[i] == '-' || s[i] == '.')
        i++;
    return s[i] == ':' ? i : 0;
}

static int ieq_prefix(const char *s, const char *prefix) {
    for (; *prefix; s++, prefix++) {
        char c = *s;
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != *prefix) return 0;
    }
    return 1;
}

/* Splits an absolute http(s) URL. Returns NULL or what is wrong. */
static const char *url_parse(const char *url, url_parts *u) {
    const char *rest;
    memset(u, 0, sizeof *u);
    if (ieq_prefix(url, "http://")) {
        u->scheme.tag = WASI_HTTP_TYPES_SCHEME_HTTP;
        rest = url + 7;
        b_add(&u->origin, "http://");
    } else if (ieq_prefix(url, "https://")) {
        u->scheme.tag = WASI_HTTP_TYPES_SCHEME_HTTPS;
        rest = url + 8;
        b_add(&u->origin, "https://");
    } else {
        return "not an http:// or https:// URL";
    }
    size_t n = strcspn(rest, "/?#");
    if (n == 0) return "the URL has no host";
    if (memchr(rest, '@', n)) return "user information in URLs is not supported";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)rest[i] <= 0x20 || rest[i] == 0x7F) return "invalid character in the host";
    b_addn(&u->authority, rest, n);
    b_addn(&u->origin, rest, n);
    rest += n;
    size_t p = strcspn(rest, "#");
    if (rest[0] != '/') b_add(&u->path, "/");
    b_addn(&u->path, rest, p);
    return NULL;
}

/* RFC 3986 5.2.4 remove_dot_segments, on a path that starts with '/'. */
static void remove_dot_segments(buf *out, const char *in, size_t n) {
    out->len = 0;
    b_addn(out, "", 0);
    size_t i = 0;
    while (i < n) {
        if (n - i >= 3 && memcmp(in + i, "/./", 3) == 0) { i += 2; continue; }
        if (n - i == 2 && memcmp(in + i, "/.", 2) == 0) { b_add(out, "/"); break; }
        if ((n - i >= 4 && memcmp(in + i, "/../", 4) == 0) ||
            (n - i == 3 && memcmp(in + i, "/..", 3) == 0)) {
            while (out->len > 0 && out->data[out->len - 1] != '/') out->len--;
            if (out->len > 0) out->len--;
            out->data[out->len] = '\0';
            if (n - i == 3) { b_add(out, "/"); break; }
            i += 3;
            continue;
        }
        size_t k = i + 1;
        while (k < n && in[k] != '/') k++;
        b_addn(out, in + i, k - i);
        i = k;
    }
}

/* Resolves a location header against the current URL (RFC 3986 5.2, without
 * fragments). */
static void url_resolve(const url_parts *base, const char *ref, buf *out) {
    out->len = 0;
    b_addn(out, "", 0);
    if (scheme_len(ref) > 0) { b_add(out, ref); return; }
    if (ref[0] == '/' && ref[1] == '/') {
        b_addn(out, base->origin.data, strcspn(base->origin.data, ":"));
        b_add(out, ":");
        b_add(out, ref);
        return;
    }
    b_add(out, base->origin.data);
    size_t qpos = strcspn(base->path.data, "?");
    buf merged = {0};
    const char *query;
    if (ref[0] == '\0' || ref[0] == '#') {
        b_add(out, base->path.data);
        return;
    } else if (ref[0] == '?') {
        b_addn(&merged, base->path.data, qpos);
        query = ref;
    } else {
        size_t rp = strcspn(ref, "?#");
        if (ref[0] == '/') {
            b_addn(&merged, ref, rp);
        } else {
            size_t dir = qpos;
            while (dir > 0 && base->path.data[dir - 1] != '/') dir--;
            b_addn(&merged, base->path.data, dir);
            b_addn(&merged, ref, rp);
        }
        query = ref + rp;
    }
    buf clean = {0};
    remove_dot_segments(&clean, merged.data, merged.len);
    b_add(out, clean.len ? clean.data : "/");
    b_addn(out, query, strcspn(query, "#"));
    b_free(&merged);
    b_free(&clean);
}

/* ------------------------------------------------------------------- wasi:http */

static const char *const error_names[] = {
    "DNS-timeout", "DNS-error", "destination-not-found", "destination-unavailable",
    "destination-IP-prohibited", "destination-IP-unroutable", "connection-refused",
    "connection-terminated", "connection-timeout", "connection-read-timeout",
    "connection-write-timeout", "connection-limit-reached", "TLS-protocol-error",
    "TLS-certificate-error", "TLS-alert-received", "HTTP-request-denied",
    "HTTP-request-length-required", "HTTP-request-body-size", "HTTP-request-method-invalid",
    "HTTP-request-URI-invalid", "HTTP-request-URI-too-long", "HTTP-request-header-section-size",
    "HTTP-request-header-size", "HTTP-request-trailer-section-size", "HTTP-request-trailer-size",
    "HTTP-response-incomplete", "HTTP-response-header-section-size", "HTTP-response-header-size",
    "HTTP-response-body-size", "HTTP-response-trailer-section-size", "HTTP-response-trailer-size",
    "HTTP-response-transfer-coding", "HTTP-response-content-coding", "HTTP-response-timeout",
    "HTTP-upgrade-failed", "HTTP-protocol-error", "loop-detected", "configuration-error",
    "internal-error",
};

/* Describes an error code in m; returns the exit code it maps to. */
static int describe_error(wasi_http_types_error_code_t *e, buf *m) {
    const fetch_imports_option_string_t *detail = NULL;
    if (e->tag < sizeof error_names / sizeof error_names[0]) b_add(m, error_names[e->tag]);
    else b_add(m, "unknown error");
    switch (e->tag) {
    case WASI_HTTP_TYPES_ERROR_CODE_DNS_ERROR: detail = &e->val.dns_error.rcode; break;
    case WASI_HTTP_TYPES_ERROR_CODE_TLS_ALERT_RECEIVED:
        detail = &e->val.tls_alert_received.alert_message;
        break;
    case WASI_HTTP_TYPES_ERROR_CODE_HTTP_RESPONSE_TRANSFER_CODING:
        detail = &e->val.http_response_transfer_coding;
        break;
    case WASI_HTTP_TYPES_ERROR_CODE_HTTP_RESPONSE_CONTENT_CODING:
        detail = &e->val.http_response_content_coding;
        break;
    case WASI_HTTP_TYPES_ERROR_CODE_INTERNAL_ERROR: detail = &e->val.internal_error; break;
    default: break;
    }
    if (detail && detail->is_some) {
        b_add(m, ": ");
        b_addn(m, detail->val.ptr, detail->val.len);
    }
    int code = EXIT_REQUEST_FAILED;
    if (e->tag == WASI_HTTP_TYPES_ERROR_CODE_HTTP_REQUEST_DENIED ||
        e->tag == WASI_HTTP_TYPES_ERROR_CODE_DESTINATION_IP_PROHIBITED) {
        b_add(m, " (the destination is not allowed by the tool's network policy)");
        code = EXIT_EGRESS_DENIED;
    }
    wasi_http_types_error_code_free(e);
    return code;
}

static int describe_stream_error(wasi_io_streams_stream_error_t *e, buf *m) {
    if (e->tag == WASI_IO_STREAMS_STREAM_ERROR_CLOSED) {
        b_add(m, "stream closed");
        return EXIT_REQUEST_FAILED;
    }
    int rc = EXIT_REQUEST_FAILED;
    wasi_io_error_own_error_t err = e->val.last_operation_failed;
    wasi_http_types_error_code_t code;
    if (wasi_http_types_http_error_code(wasi_io_error_borrow_error(err), &code)) {
        rc = describe_error(&code, m);
    } else {
        fetch_imports_string_t s;
        wasi_io_error_method_error_to_debug_string(wasi_io_error_borrow_error(err), &s);
        b_addn(m, s.ptr, s.len);
        fetch_imports_string_free(&s);
    }
    wasi_io_error_error_drop_own(err);
    return rc;
}

typedef struct {
    const char *name; /* lower-cased by parse_header */
    const char *value;
} header;

typedef struct {
    int status;
    buf names[MAX_HEADERS * 2]; /* response header names, lower-cased, unique */
    buf values[MAX_HEADERS * 2];
    size_t nheaders;
    buf body;
    int truncated;
} response;

static void response_free(response *r) {
    for (size_t i = 0; i < r->nheaders; i++) {
        b_free(&r->names[i]);
        b_free(&r->values[i]);
    }
    r->nheaders = 0;
    b_free(&r->body);
}

/* The value of response header `name`, or NULL. */
static const char *response_header(const response *r, const char *name) {
    for (size_t i = 0; i < r->nheaders; i++)
        if (strcmp(r->names[i].data, name) == 0) return r->values[i].data;
    return NULL;
}

static void collect_headers(wasi_http_types_own_incoming_response_t resp, response *r) {
    wasi_http_types_own_headers_t h =
        wasi_http_types_method_incoming_response_headers(wasi_http_types_borrow_incoming_response(resp));
    fetch_imports_list_tuple2_field_name_field_value_t entries;
    wasi_http_types_method_fields_entries(wasi_http_types_borrow_fields(h), &entries);
    for (size_t i = 0; i < entries.len; i++) {
        buf name = {0};
        b_addn(&name, entries.ptr[i].f0.ptr, entries.ptr[i].f0.len);
        for (char *p = name.data; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        size_t k = 0;
        while (k < r->nheaders && strcmp(r->names[k].data, name.data) != 0) k++;
        if (k == r->nheaders) {
            if (r->nheaders == sizeof r->names / sizeof r->names[0]) { /* ignore the rest */
                b_free(&name);
                continue;
            }
            r->names[k] = name;
            memset(&r->values[k], 0, sizeof r->values[k]);
            b_addn(&r->values[k], "", 0);
            r->nheaders++;
        } else {
            b_free(&name);
            b_add(&r->values[k], ", ");
        }
        b_addn(&r->values[k], entries.ptr[i].f1.ptr, entries.ptr[i].f1.len);
    }
    fetch_imports_list_tuple2_field_name_field_value_free(&entries);
    wasi_http_types_fields_drop_own(h);
}

/* Reads up to max_bytes of the body (and one byte more to know whether it
 * was truncated), then drops it. Returns 0, or an exit code with a message. */
static int read_body(wasi_http_types_own_incoming_response_t resp, size_t max_bytes, response *r,
                     buf *msg) {
    wasi_http_types_own_incoming_body_t ib;
    if (!wasi_http_types_method_incoming_response_consume(
            wasi_http_types_borrow_incoming_response(resp), &ib)) {
        b_add(msg, "cannot consume the response body");
        return EXIT_REQUEST_FAILED;
    }
    wasi_http_types_own_input_stream_t is;
    if (!wasi_http_types_method_incoming_body_stream(wasi_http_types_borrow_incoming_body(ib), &is)) {
        b_add(msg, "cannot read the response body");
        wasi_http_types_incoming_body_drop_own(ib);
        return EXIT_REQUEST_FAILED;
    }
    int rc = 0;
    b_addn(&r->body, "", 0);
    while (r->body.len <= max_bytes) {
        size_t want = max_bytes + 1 - r->body.len;
        if (want > READ_CHUNK) want = READ_CHUNK;
        fetch_imports_list_u8_t data;
        wasi_io_streams_stream_error_t err;
        if (!wasi_io_streams_method_input_stream_blocking_read(
                wasi_io_streams_borrow_input_stream(is), want, &data, &err)) {
            if (err.tag != WASI_IO_STREAMS_STREAM_ERROR_CLOSED) {
                b_add(msg, "reading the response body: ");
                rc = describe_stream_error(&err, msg);
            }
            break;
        }
        b_addn(&r->body, data.ptr, data.len);
        fetch_imports_list_u8_free(&data);
    }
    if (r->body.len > max_bytes) {
        r->truncated = 1;
        r->body.len = max_bytes;
        r->body.data[max_bytes] = '\0';
    }
    wasi_io_streams_input_stream_drop_own(is);
    if (r->truncated) {
        wasi_http_types_incoming_body_drop_own(ib);
    } else {
        wasi_http_types_future_trailers_drop_own(wasi_http_types_static_incoming_body_finish(ib));
    }
    return rc;
}

static int add_field(wasi_http_types_own_fields_t fields, const char *name, const char *value,
                     buf *msg) {
    fetch_imports_string_t n;
    fetch_imports_string_set(&n, name);
    wasi_http_types_field_value_t v = {(uint8_t *)value, strlen(value)};
    wasi_http_types_header_error_t err;
    if (wasi_http_types_method_fields_append(wasi_http_types_borrow_fields(fields), &n, &v, &err))
        return 0;
    b_add(msg, "header ");
    b_add(msg, name);
    b_add(msg, err.tag == WASI_HTTP_TYPES_HEADER_ERROR_FORBIDDEN
                   ? " is not allowed"
                   : " is not a valid header name or value");
    return EXIT_INVALID_ARGUMENT;
}

/* One GET. Returns 0 with the response, or an exit code with a message. */
static int http_get(const url_parts *u, const header *headers, size_t nheaders,
                    int with_user_headers, size_t max_bytes, response *r, buf *msg) {
    wasi_http_types_own_fields_t fields = wasi_http_types_constructor_fields();
    int user_agent = 0;
    if (with_user_headers) {
        for (size_t i = 0; i < nheaders; i++) {
            if (add_field(fields, headers[i].name, headers[i].value, msg) != 0) {
                wasi_http_types_fields_drop_own(fields);
                return EXIT_INVALID_ARGUMENT;
            }
            if (strcmp(headers[i].name, "user-agent") == 0) user_agent = 1;
        }
    }
    if (!user_agent && add_field(fields, "user-agent", USER_AGENT, msg) != 0) {
        wasi_http_types_fields_drop_own(fields);
        return EXIT_REQUEST_FAILED;
    }

    wasi_http_types_own_outgoing_request_t req = wasi_http_types_constructor_outgoing_request(fields);
    wasi_http_types_borrow_outgoing_request_t breq = wasi_http_types_borrow_outgoing_request(req);
    wasi_http_types_method_t get = {0};
    get.tag = WASI_HTTP_TYPES_METHOD_GET;
    wasi_http_types_scheme_t scheme = u->scheme;
    fetch_imports_string_t authority = {(uint8_t *)u->authority.data, u->authority.len};
    fetch_imports_string_t path = {(uint8_t *)u->path.data, u->path.len};
    if (!wasi_http_types_method_outgoing_request_set_method(breq, &get) ||
        !wasi_http_types_method_outgoing_request_set_scheme(breq, &scheme)) {
        b_add(msg, "cannot set the method or scheme");
        wasi_http_types_outgoing_request_drop_own(req);
        return EXIT_REQUEST_FAILED;
    }
    if (!wasi_http_types_method_outgoing_request_set_authority(breq, &authority)) {
        b_add(msg, "invalid host or port");
        wasi_http_types_outgoing_request_drop_own(req);
        return EXIT_INVALID_ARGUMENT;
    }
    if (!wasi_http_types_method_outgoing_request_set_path_with_query(breq, &path)) {
        b_add(msg, "invalid path or query (characters outside URLs must be percent-encoded)");
        wasi_http_types_outgoing_request_drop_own(req);
        return EXIT_INVALID_ARGUMENT;
    }

    wasi_http_types_own_future_incoming_response_t fut;
    wasi_http_types_error_code_t code;
    if (!wasi_http_outgoing_handler_handle(req, NULL, &fut, &code)) return describe_error(&code, msg);
    wasi_http_types_borrow_future_incoming_response_t bfut =
        wasi_http_types_borrow_future_incoming_response(fut);
    wasi_http_types_own_pollable_t ready = wasi_http_types_method_future_incoming_response_subscribe(bfut);
    wasi_http_types_result_result_own_incoming_response_error_code_void_t got;
    while (!wasi_http_types_method_future_incoming_response_get(bfut, &got)) {
        wasi_io_poll_borrow_pollable_t one = wasi_io_poll_borrow_pollable(ready);
        wasi_io_poll_list_borrow_pollable_t list = {&one, 1};
        fetch_imports_list_u32_t which;
        wasi_io_poll_poll(&list, &which);
        fetch_imports_list_u32_free(&which);
    }
    wasi_io_poll_pollable_drop_own(ready);
    wasi_http_types_future_incoming_response_drop_own(fut);
    if (got.is_err) {
        b_add(msg, "the response was already taken");
        return EXIT_REQUEST_FAILED;
    }
    if (got.val.ok.is_err) return describe_error(&got.val.ok.val.err, msg);
    wasi_http_types_own_incoming_response_t resp = got.val.ok.val.ok;
    r->status = wasi_http_types_method_incoming_response_status(
        wasi_http_types_borrow_incoming_response(resp));
    collect_headers(resp, r);
    int rc = read_body(resp, max_bytes, r, msg);
    wasi_http_types_incoming_response_drop_own(resp);
    return rc;
}

/* ---------------------------------------------------------------- arguments */

static int parse_long(const char *s, long lo, long hi, long *out) {
    if (*s == '\0') return -1;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
        if (v > hi) return -1;
    }
    if (v < lo) return -1;
    *out = v;
    return 0;
}

static int is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Splits "Name: value" in place (the name is lower-cased, the value trimmed). */
__attribute__((unused)) static const char *parse_header(char *s, header *h) {
    char *colon = strchr(s, ':');
    if (!colon || colon == s) return "must be \"Name: value\"";
    for (char *p = s; p < colon; p++) {
        if (!is_tchar((unsigned char)*p)) return "has an invalid character in its name";
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    }
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) v[--n] = '\0';
    for (char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t') return "has a control character in its value";
    h->name = s;
    h->value = v;
    return NULL;
}

static int is_redirect(int status) {
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}


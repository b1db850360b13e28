/*
 * guard: a toolgrid wasm middleware (world toolgrid:middleware/middleware, see
 * wit/middleware.wit) written in plain C, with the canonical ABI by hand: no libc, no
 * imports, no generated bindings.
 *
 * It looks at the call's top-level arguments:
 *   - `force: true`             -> deny ("force is not allowed through this binding")
 *   - `count` above 50          -> deny ("asks for N items; at most 50 per call")
 *   - `count` from 11 to 50     -> rewrite the call with `count: 10` (other args kept)
 *   - anything else             -> allow
 *
 * Build: examples/middleware/build.sh (zig cc to a core module, then
 * `toolgrid componentize --middleware` to a component).
 */

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- memory
 * A bump allocator over a static heap: every decision runs in a fresh instance,
 * so nothing is ever freed. */
static unsigned char heap[256 * 1024];
static size_t heap_used;

__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    if (align == 0) align = 1;
    size_t start = (heap_used + align - 1) & ~(align - 1);
    if (start + new_size > sizeof heap) __builtin_trap();
    unsigned char *p = heap + start;
    heap_used = start + new_size;
    if (old) {
        size_t n = old_size < new_size ? old_size : new_size;
        for (size_t i = 0; i < n; i++) p[i] = ((unsigned char *)old)[i];
    }
    return p;
}

/* ---------------------------------------------------------------- output */
static char out[64 * 1024];
static size_t out_len;

static void put(const char *s, size_t n) {
    if (out_len + n > sizeof out) __builtin_trap();
    for (size_t i = 0; i < n; i++) out[out_len++] = s[i];
}
static void puts_(const char *s) { size_t n = 0; while (s[n]) n++; put(s, n); }
static void put_num(long v) {
    char b[24]; int n = 0;
    if (v < 0) { put("-", 1); v = -v; }
    do { b[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) put(&b[--n], 1);
}

/* ---------------------------------------------------------------- JSON scanning
 * The input is compact, valid JSON written by the gateway. These helpers skip one
 * value and compare keys; they never need to unescape. */
typedef struct { const char *p, *end; } cursor;

static void ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\t' || *c->p == '\r')) c->p++;
}
static int skip_string(cursor *c) {           /* at '"' */
    c->p++;
    while (c->p < c->end) {
        if (*c->p == '\\') { c->p += 2; continue; }
        if (*c->p++ == '"') return 1;
    }
    return 0;
}
static int skip_value(cursor *c) {
    ws(c);
    if (c->p >= c->end) return 0;
    if (*c->p == '"') return skip_string(c);
    if (*c->p == '{' || *c->p == '[') {
        int depth = 0;
        while (c->p < c->end) {
            char ch = *c->p;
            if (ch == '"') { if (!skip_string(c)) return 0; continue; }
            if (ch == '{' || ch == '[') depth++;
            if (ch == '}' || ch == ']') { depth--; c->p++; if (depth == 0) return 1; continue; }
            c->p++;
        }
        return 0;
    }
    while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ']') c->p++;
    return 1;
}
/* Is the string token [s, e) (quotes included) the key `name`? */
static int key_is(const char *s, const char *e, const char *name) {
    s++; e--;
    while (s < e && *name) { if (*s++ != *name++) return 0; }
    return s == e && !*name;
}

/* Finds key `name` in the object at c (at '{'); sets [*v, *ve) to its value. */
static int find(cursor c, const char *name, const char **v, const char **ve) {
    ws(&c);
    if (c.p >= c.end || *c.p != '{') return 0;
    c.p++;
    for (;;) {
        ws(&c);
        if (c.p >= c.end || *c.p == '}') return 0;
        const char *k = c.p;
        if (*c.p != '"' || !skip_string(&c)) return 0;
        const char *ke = c.p;
        ws(&c);
        if (c.p >= c.end || *c.p != ':') return 0;
        c.p++;
        ws(&c);
        const char *start = c.p;
        if (!skip_value(&c)) return 0;
        if (key_is(k, ke, name)) { *v = start; *ve = c.p; return 1; }
        ws(&c);
        if (c.p < c.end && *c.p == ',') c.p++;
    }
}
static int is_literal(const char *v, const char *ve, const char *lit) {
    while (v < ve && *lit) { if (*v++ != *lit++) return 0; }
    return v == ve && !*lit;
}
/* A non-negative integer value, or -1. */
static long integer(const char *v, const char *ve) {
    if (v >= ve) return -1;
    long n = 0;
    for (; v < ve; v++) {
        if (*v < '0' || *v > '9') return -1;
        if (n > 1000000000L) return n;
        n = n * 10 + (*v - '0');
    }
    return n;
}

/* ---------------------------------------------------------------- the export
 * decide: func(call: string) -> verdict, lowered: (ptr, len) -> pointer to
 * { u8 tag; (align 4) char *ptr; size_t len } with tag 0 allow, 1 deny, 2 rewrite. */
static struct { uint8_t tag; const char *ptr; size_t len; } ret;

static void *answer(uint8_t tag) {
    ret.tag = tag;
    ret.ptr = out;
    ret.len = out_len;
    return &ret;
}

__attribute__((export_name("toolgrid:middleware/decide@0.1.0#decide")))
void *decide(const char *call, size_t len) {
    cursor c = {call, call + len};
    const char *args, *args_end, *v, *ve;
    out_len = 0;
    if (!find(c, "args", &args, &args_end)) return answer(0);
    cursor a = {args, args_end};
    if (find(a, "force", &v, &ve) && is_literal(v, ve, "true")) {
        puts_("force is not allowed through this binding");
        return answer(1);
    }
    if (find(a, "count", &v, &ve)) {
        long count = integer(v, ve);
        if (count > 50) {
            puts_("asks for ");
            put_num(count);
            puts_(" items; at most 50 per call");
            return answer(1);
        }
        if (count > 10) {
            /* The same args with the count's value replaced. */
            puts_("{\"args\":");
            put(args, (size_t)(v - args));
            puts_("10");
            put(ve, (size_t)(args_end - ve));
            puts_("}");
            return answer(2);
        }
    }
    return answer(0);
}

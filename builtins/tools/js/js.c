/* js: the built-in tool that runs JavaScript with QuickJS-NG (its C sources, from the
 * rquickjs-sys crate, compiled to WASI preview 1 by builtins/build.sh).
 *
 *   js run (--code SOURCE | --file PATH)
 *
 * The program runs as a global script; its completion value (awaited when it is a promise)
 * is the result, as JSON. `console.log`/`console.error`/`print` write to the output that
 * is returned beside it (64 KiB kept). The agent's workspace is at /workspace, reached with
 * `fs.readFile(path)`, `fs.writeFile(path, text)`, `fs.readdir(path)` and `fs.exists(path)`
 * (paths relative to the workspace). No network. Exit codes are the Tool's declared errors
 * (builtins/manifests/js.yaml).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "quickjs.h"

enum { EXIT_BAD_ARGUMENTS = 2, EXIT_JS_ERROR = 3, EXIT_NOT_FOUND = 4, EXIT_RESULT = 5 };
#define OUTPUT_CAP (64u << 10)
#define MEMORY_LIMIT (48u << 20)
#define STACK_LIMIT (256u << 10)
#define FILE_CAP (8u << 20)

static void fail(int code, const char *kind, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "js: %s: ", kind);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

/* --- output ------------------------------------------------------------------------ */

static char output[OUTPUT_CAP];
static size_t output_len;
static int output_truncated;

static void out(const char *s, size_t n) {
    if (output_len + n > OUTPUT_CAP) {
        n = OUTPUT_CAP - output_len;
        output_truncated = 1;
    }
    memcpy(output + output_len, s, n);
    output_len += n;
}

static JSValue js_log(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    for (int i = 0; i < argc; i++) {
        size_t len;
        const char *s = NULL;
        JSValue json = JS_UNDEFINED;
        if (JS_IsObject(argv[i]) && !JS_IsFunction(ctx, argv[i]) && !JS_IsError(argv[i])) {
            json = JS_JSONStringify(ctx, argv[i], JS_UNDEFINED, JS_UNDEFINED);
            if (!JS_IsException(json) && !JS_IsUndefined(json)) s = JS_ToCStringLen(ctx, &len, json);
        }
        if (!s) {
            JS_FreeValue(ctx, JS_GetException(ctx));
            s = JS_ToCStringLen(ctx, &len, argv[i]);
        }
        if (i) out(" ", 1);
        if (s) {
            out(s, len);
            JS_FreeCString(ctx, s);
        }
        JS_FreeValue(ctx, json);
    }
    out("\n", 1);
    return JS_UNDEFINED;
}

/* --- the workspace ----------------------------------------------------------------- */

/* The absolute path of a workspace path, or an exception. */
static int workspace_path(JSContext *ctx, JSValueConst arg, char *abs, size_t cap) {
    const char *p = JS_ToCString(ctx, arg);
    if (!p) return -1;
    const char *rel = p;
    if (strncmp(rel, "/workspace", 10) == 0 && (rel[10] == '/' || rel[10] == 0)) rel += 10;
    while (*rel == '/') rel++;
    int bad = 0;
    for (const char *c = rel; *c;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.') bad = 1;
        c = slash ? slash + 1 : c + len;
    }
    int n = snprintf(abs, cap, "/workspace/%s", rel);
    JS_FreeCString(ctx, p);
    if (bad || n < 0 || (size_t)n >= cap) {
        JS_ThrowTypeError(ctx, "not a workspace path (no \"..\" parts, at most 1023 bytes)");
        return -1;
    }
    return 0;
}

static JSValue fs_read(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    char abs[1100];
    if (argc < 1 || workspace_path(ctx, argv[0], abs, sizeof abs)) return JS_EXCEPTION;
    FILE *f = fopen(abs, "rb");
    if (!f) return JS_ThrowReferenceError(ctx, "cannot read %s: %s", abs + 11, strerror(errno));
    char *data = malloc(FILE_CAP + 1);
    size_t n = data ? fread(data, 1, FILE_CAP + 1, f) : 0;
    fclose(f);
    if (!data) return JS_ThrowOutOfMemory(ctx);
    if (n > FILE_CAP) {
        free(data);
        return JS_ThrowRangeError(ctx, "%s is larger than 8 MiB", abs + 11);
    }
    JSValue s = JS_NewStringLen(ctx, data, n);
    free(data);
    return s;
}

static JSValue fs_write(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    char abs[1100];
    if (argc < 2 || workspace_path(ctx, argv[0], abs, sizeof abs)) return JS_EXCEPTION;
    size_t len;
    const char *s = JS_ToCStringLen(ctx, &len, argv[1]);
    if (!s) return JS_EXCEPTION;
    /* missing parent directories are made */
    for (char *slash = strchr(abs + 11, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        mkdir(abs, 0755);
        *slash = '/';
    }
    FILE *f = fopen(abs, "wb");
    int ok = f && fwrite(s, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    JS_FreeCString(ctx, s);
    if (!ok) return JS_ThrowReferenceError(ctx, "cannot write %s: %s", abs + 11, strerror(errno));
    return JS_NewInt64(ctx, (int64_t)len);
}

static JSValue fs_readdir(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    char abs[1100];
    if (workspace_path(ctx, argc ? argv[0] : JS_NewString(ctx, ""), abs, sizeof abs)) return JS_EXCEPTION;
    DIR *d = opendir(abs);
    if (!d) return JS_ThrowReferenceError(ctx, "cannot list %s: %s", abs + 11, strerror(errno));
    JSValue list = JS_NewArray(ctx);
    uint32_t i = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            JS_SetPropertyUint32(ctx, list, i++, JS_NewString(ctx, e->d_name));
    closedir(d);
    return list;
}

static JSValue fs_exists(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    char abs[1100];
    if (argc < 1 || workspace_path(ctx, argv[0], abs, sizeof abs)) return JS_EXCEPTION;
    struct stat st;
    return JS_NewBool(ctx, stat(abs, &st) == 0);
}

/* --- code mode: the agent's tools ------------------------------------------------- */

#ifdef TOOLGRID_CODE
/* Built as the `code` tool (builtins/build.sh): `tools.<tool>.<command>(args)` returns a
 * promise of the tool's result, through the host's tool door (docs/host-abi.md). Requests
 * run concurrently; the event loop below waits for the next one to end whenever no job is
 * left to run. A failed call rejects with a ToolError whose `kind` names why. */
#include <stdint.h>

__attribute__((import_module("toolgrid"), import_name("tool_call")))
int32_t tg_tool_call(const char *request, uint32_t len, uint32_t *seq_out);
__attribute__((import_module("toolgrid"), import_name("tool_wait")))
int32_t tg_tool_wait(uint32_t *seq_out, uint32_t *len_out);
__attribute__((import_module("toolgrid"), import_name("tool_take")))
int32_t tg_tool_take(uint32_t seq, char *buf, uint32_t len);

static void die_with_exception(JSContext *ctx);

#define MAX_TOOL_CALLS 256
static JSValue settle[MAX_TOOL_CALLS + 1][2]; /* resolve, reject by request number */
static int outstanding;

static JSValue js_tool_call(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv) {
    (void)this_val;
    if (argc < 3) return JS_ThrowTypeError(ctx, "tool call: tool, command, args");
    JSValue request = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, request, "tool", JS_DupValue(ctx, argv[0]));
    JS_SetPropertyStr(ctx, request, "command", JS_DupValue(ctx, argv[1]));
    JS_SetPropertyStr(ctx, request, "args", JS_DupValue(ctx, argv[2]));
    JSValue json = JS_JSONStringify(ctx, request, JS_UNDEFINED, JS_UNDEFINED);
    JS_FreeValue(ctx, request);
    if (JS_IsException(json)) return json;
    size_t len;
    const char *text = JS_ToCStringLen(ctx, &len, json);
    JS_FreeValue(ctx, json);
    if (!text) return JS_EXCEPTION;
    uint32_t seq = 0;
    int32_t rc = tg_tool_call(text, (uint32_t)len, &seq);
    JS_FreeCString(ctx, text);
    if (rc != 0 || seq == 0 || seq > MAX_TOOL_CALLS)
        return JS_ThrowTypeError(ctx, "a tool call takes its arguments as one plain object, "
                                      "e.g. tools.fetch.get({url: \"...\"})");
    JSValue funcs[2];
    JSValue promise = JS_NewPromiseCapability(ctx, funcs);
    if (JS_IsException(promise)) return promise;
    settle[seq][0] = funcs[0];
    settle[seq][1] = funcs[1];
    outstanding++;
    return promise;
}

/* Waits for the next tool call to end and settles its promise; 0 when none is left. */
static int settle_next(JSContext *ctx) {
    if (!outstanding) return 0;
    uint32_t seq = 0, len = 0;
    if (tg_tool_wait(&seq, &len) != 0) return 0;
    char *buf = malloc(len + 1);
    if (!buf || seq == 0 || seq > MAX_TOOL_CALLS || tg_tool_take(seq, buf, len) != 0)
        fail(EXIT_JS_ERROR, "js-error", "a tool call's answer could not be read");
    buf[len] = 0; /* QuickJS parses up to a NUL */
    JSValue doc = JS_ParseJSON(ctx, buf, len, "<tool answer>");
    free(buf);
    if (JS_IsException(doc)) die_with_exception(ctx);
    JSValue ok = JS_GetPropertyStr(ctx, doc, "ok");
    JSValue arg;
    int which;
    if (JS_ToBool(ctx, ok)) {
        arg = JS_GetPropertyStr(ctx, doc, "value");
        which = 0;
    } else {
        JSValue error = JS_GetPropertyStr(ctx, doc, "error");
        JSValue message = JS_GetPropertyStr(ctx, error, "message");
        JSValue kind = JS_GetPropertyStr(ctx, error, "kind");
        const char *m = JS_ToCString(ctx, message);
        const char *k = JS_ToCString(ctx, kind);
        arg = JS_NewError(ctx);
        char text[1200];
        snprintf(text, sizeof text, "%s: %s", k ? k : "error", m ? m : "");
        JS_SetPropertyStr(ctx, arg, "message", JS_NewString(ctx, text));
        JS_SetPropertyStr(ctx, arg, "name", JS_NewString(ctx, "ToolError"));
        JS_SetPropertyStr(ctx, arg, "kind", JS_DupValue(ctx, kind));
        JS_SetPropertyStr(ctx, arg, "call", JS_GetPropertyStr(ctx, doc, "call"));
        if (m) JS_FreeCString(ctx, m);
        if (k) JS_FreeCString(ctx, k);
        JS_FreeValue(ctx, message);
        JS_FreeValue(ctx, kind);
        JS_FreeValue(ctx, error);
        which = 1;
    }
    JS_FreeValue(ctx, ok);
    JS_FreeValue(ctx, doc);
    JSValue r = JS_Call(ctx, settle[seq][which], JS_UNDEFINED, 1, &arg);
    JS_FreeValue(ctx, r);
    JS_FreeValue(ctx, arg);
    JS_FreeValue(ctx, settle[seq][0]);
    JS_FreeValue(ctx, settle[seq][1]);
    settle[seq][0] = settle[seq][1] = JS_UNDEFINED;
    outstanding--;
    return 1;
}

/* `tools.<tool>.<command>(args)`; camelCase names are the tools' kebab-case ones
 * (`tools.webFetch.run` is `web-fetch run`), and `tools["web-fetch"].run` works too.
 * `tools.search(query, limit)` finds the tools a program may call (best first, each with
 * its signature); `tools.tool(name)` reaches a tool by its exact name (for tools named
 * `search` or `tool`). */
static const char TOOLS_PRELUDE[] =
    "(() => {\n"
    "  const call = globalThis.__toolgrid_call;\n"
    "  delete globalThis.__toolgrid_call;\n"
    "  const kebab = (s) => s.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase());\n"
    "  const named = (f) => new Proxy({}, {get(_, name) {\n"
    "    if (typeof name !== 'string' || name === 'then') return undefined;\n"
    "    return f(kebab(name));\n"
    "  }});\n"
    "  const tool = (name) => named((command) =>\n"
    "    (args) => call(name, command, args === undefined ? {} : args));\n"
    "  const own = {\n"
    "    search: (query, limit) => call('$search', 'search',\n"
    "      limit === undefined ? {query: String(query ?? '')} : {query: String(query ?? ''), limit}),\n"
    "    tool: (name) => tool(String(name)),\n"
    "  };\n"
    "  globalThis.tools = new Proxy({}, {get(_, name) {\n"
    "    if (typeof name !== 'string' || name === 'then') return undefined;\n"
    "    if (Object.hasOwn(own, name)) return own[name];\n"
    "    return tool(kebab(name));\n"
    "  }});\n"
    "})();\n";

static void install_tools(JSContext *ctx, JSValue global) {
    JS_SetPropertyStr(ctx, global, "__toolgrid_call", JS_NewCFunction(ctx, js_tool_call, "call", 3));
    JSValue r = JS_Eval(ctx, TOOLS_PRELUDE, sizeof TOOLS_PRELUDE - 1, "<tools>", JS_EVAL_TYPE_GLOBAL);
    if (JS_IsException(r)) fail(EXIT_JS_ERROR, "js-error", "cannot install tools");
    JS_FreeValue(ctx, r);
}
#else
static int settle_next(JSContext *ctx) { (void)ctx; return 0; }
static void install_tools(JSContext *ctx, JSValue global) { (void)ctx; (void)global; }
#endif

/* --- running ----------------------------------------------------------------------- */

static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { putchar('\\'); putchar(c); }
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* Reports the pending exception and exits. */
static void die_with_exception(JSContext *ctx) {
    JSValue e = JS_GetException(ctx);
    const char *msg = JS_ToCString(ctx, e);
    const char *stack = NULL;
    JSValue st = JS_UNDEFINED;
    if (JS_IsError(e)) {
        st = JS_GetPropertyStr(ctx, e, "stack");
        if (JS_IsString(st)) stack = JS_ToCString(ctx, st);
    }
    /* what the program printed goes first, so the model sees where it got to */
    if (output_len) fprintf(stderr, "%.*s", (int)(output_len > 4000 ? 4000 : output_len),
                            output + (output_len > 4000 ? output_len - 4000 : 0));
    /* the stack, then the message on the last line (the one a caller is shown) */
    if (stack && *stack) fprintf(stderr, "%s\n", stack);
    char line[1024];
    snprintf(line, sizeof line, "%s", msg ? msg : "an exception");
    for (char *c = line; *c; c++) if (*c == '\n') *c = ' ';
    fail(EXIT_JS_ERROR, "js-error", "%s", line);
}

int main(int argc, char **argv) {
    const char *code = NULL, *file = NULL;
    if (argc < 2 || strcmp(argv[1], "run") != 0)
        fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "usage: js run (--code SOURCE | --file PATH)");
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--code")) code = argv[i + 1];
        else if (!strcmp(argv[i], "--file")) file = argv[i + 1];
        else fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "unexpected argument %s", argv[i]);
    }
    if (!code == !file) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "give one of --code and --file");

    JSRuntime *rt = JS_NewRuntime();
    JS_SetMemoryLimit(rt, MEMORY_LIMIT);
    JS_SetMaxStackSize(rt, STACK_LIMIT);
    JSContext *ctx = JS_NewContext(rt);
    if (!rt || !ctx) fail(EXIT_JS_ERROR, "js-error", "cannot start the JavaScript engine");

    JSValue global = JS_GetGlobalObject(ctx);
    JSValue console = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, console, "log", JS_NewCFunction(ctx, js_log, "log", 1));
    JS_SetPropertyStr(ctx, console, "error", JS_NewCFunction(ctx, js_log, "error", 1));
    JS_SetPropertyStr(ctx, console, "info", JS_NewCFunction(ctx, js_log, "info", 1));
    JS_SetPropertyStr(ctx, global, "console", console);
    JS_SetPropertyStr(ctx, global, "print", JS_NewCFunction(ctx, js_log, "print", 1));
    JSValue fs = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, fs, "readFile", JS_NewCFunction(ctx, fs_read, "readFile", 1));
    JS_SetPropertyStr(ctx, fs, "writeFile", JS_NewCFunction(ctx, fs_write, "writeFile", 2));
    JS_SetPropertyStr(ctx, fs, "readdir", JS_NewCFunction(ctx, fs_readdir, "readdir", 1));
    JS_SetPropertyStr(ctx, fs, "exists", JS_NewCFunction(ctx, fs_exists, "exists", 1));
    JS_SetPropertyStr(ctx, global, "fs", fs);
    install_tools(ctx, global);

    const char *name = "<code>";
    char *source = NULL;
    size_t len = 0;
    if (file) {
        JSValue path = JS_NewString(ctx, file);
        JSValue text = fs_read(ctx, JS_UNDEFINED, 1, &path);
        JS_FreeValue(ctx, path);
        if (JS_IsException(text)) {
            JSValue e = JS_GetException(ctx);
            const char *m = JS_ToCString(ctx, e);
            fail(EXIT_NOT_FOUND, "not-found", "%s", m ? m : file);
        }
        const char *s = JS_ToCStringLen(ctx, &len, text);
        source = strndup(s, len);
        JS_FreeCString(ctx, s);
        JS_FreeValue(ctx, text);
        name = file;
    } else {
        len = strlen(code);
        source = strndup(code, len);
    }

    JSValue value = JS_Eval(ctx, source, len, name, JS_EVAL_TYPE_GLOBAL);
    if (JS_IsException(value)) die_with_exception(ctx);
    /* run the jobs promises queued, and when none is left settle the next tool call
     * that ended (code mode), until neither is left; a promise result is its settled value */
    do {
        for (;;) {
            JSContext *job_ctx;
            int r = JS_ExecutePendingJob(rt, &job_ctx);
            if (r < 0) die_with_exception(job_ctx);
            if (r == 0) break;
        }
    } while (settle_next(ctx));
    if (JS_IsPromise(value)) {
        JSPromiseStateEnum state = JS_PromiseState(ctx, value);
        JSValue settled = JS_PromiseResult(ctx, value);
        JS_FreeValue(ctx, value);
        if (state == JS_PROMISE_REJECTED) {
            JS_Throw(ctx, settled);
            die_with_exception(ctx);
        }
        if (state == JS_PROMISE_PENDING)
            fail(EXIT_JS_ERROR, "js-error", "the program's promise never settled (nothing left to run)");
        value = settled;
    }
    JSValue json = JS_JSONStringify(ctx, value, JS_UNDEFINED, JS_UNDEFINED);
    if (JS_IsException(json)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        fail(EXIT_RESULT, "invalid-result-value", "the program's value cannot be JSON (a cycle, or a BigInt)");
    }
    size_t jlen = 0;
    const char *js = JS_IsUndefined(json) ? NULL : JS_ToCStringLen(ctx, &jlen, json);
    fputs("{\"result\":", stdout);
    if (js) fwrite(js, 1, jlen, stdout);
    else fputs("null", stdout);
    fputs(",\"output\":", stdout);
    print_json_string(output, output_len);
    printf(",\"outputTruncated\":%s}\n", output_truncated ? "true" : "false");
    fflush(stdout);
    return 0;
}

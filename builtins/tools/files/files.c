/* files: the built-in tool over an agent's workspace, mounted at /workspace.
 *
 *   files ls [PATH] [--recursive] [--max-entries N]
 *   files read PATH [--offset LINE] [--limit LINES] [--max-bytes N]
 *   files write PATH --content TEXT
 *   files edit PATH --old TEXT --new TEXT [--all]
 *   files grep PATTERN [PATH] [--glob GLOB] [--ignore-case] [--max-matches N]
 *   files glob PATTERN [--max-results N]
 *   files rm PATH [--recursive]
 *   files mv FROM TO
 *
 * Every PATH is relative to the workspace (a leading "/workspace/" or "/" is accepted and
 * dropped); "..", "." and empty components are refused (invalid-path). Each command prints
 * one JSON object on stdout; a failure is one line on stderr and the exit code of the error
 * the manifest declares (builtins/manifests/files.yaml). Writes land in the call's private
 * copy of the workspace, which toolgrid commits as the next version only when the call
 * succeeds.
 */
#define _GNU_SOURCE /* memmem */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROOT "/workspace"
#define PATH_MAX_LEN 1024
#define MAX_DEPTH 32
#define READ_CAP (8u << 20) /* the largest file read or edited in memory */

enum {
    EXIT_BAD_ARGUMENTS = 2,
    EXIT_NOT_FOUND = 3,
    EXIT_INVALID_PATH = 4,
    EXIT_NOT_UNIQUE = 5,
    EXIT_NO_MATCH = 6,
    EXIT_IS_A_DIRECTORY = 7,
    EXIT_NOT_A_DIRECTORY = 8,
    EXIT_TOO_LARGE = 9,
    EXIT_INVALID_PATTERN = 10,
    EXIT_READ_ONLY = 11,
    EXIT_EXISTS = 12,
    EXIT_IO = 13,
};

static void fail(int code, const char *kind, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "files: %s: ", kind);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

/* The error an errno from a workspace operation on `path` is. */
static void fail_errno(int err, const char *what, const char *path) {
    switch (err) {
    case ENOENT: fail(EXIT_NOT_FOUND, "not-found", "%s: no such file or directory", path);
    case EISDIR: fail(EXIT_IS_A_DIRECTORY, "is-a-directory", "%s is a directory", path);
    case ENOTDIR: fail(EXIT_NOT_A_DIRECTORY, "not-a-directory", "%s: a parent is not a directory", path);
    case EEXIST:
    case ENOTEMPTY: fail(EXIT_EXISTS, "exists", "%s: %s", path, strerror(err));
    case EROFS:
    case EPERM:
    case EACCES:
    case ENOTCAPABLE:
        fail(EXIT_READ_ONLY, "read-only",
             "cannot %s %s: the workspace is read-only for this call (the binding's filesystemAccess)",
             what, path);
    default: fail(EXIT_IO, "io", "cannot %s %s: %s", what, path, strerror(err));
    }
}

/* --- JSON output ------------------------------------------------------------------- */

/* Writes `s` (n bytes) as a JSON string: UTF-8 kept, control characters escaped, an
 * invalid byte as U+FFFD. */
static void json_str_n(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    putchar('"');
    while (p < end) {
        unsigned c = *p;
        if (c == '"') { fputs("\\\"", stdout); p++; continue; }
        if (c == '\\') { fputs("\\\\", stdout); p++; continue; }
        if (c == '\n') { fputs("\\n", stdout); p++; continue; }
        if (c == '\t') { fputs("\\t", stdout); p++; continue; }
        if (c == '\r') { fputs("\\r", stdout); p++; continue; }
        if (c < 0x20 || c == 0x7f) { printf("\\u%04x", c); p++; continue; }
        if (c < 0x80) { putchar((int)c); p++; continue; }
        size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
        int ok = len > 0 && (size_t)(end - p) >= len;
        for (size_t k = 1; ok && k < len; k++) ok = (p[k] & 0xc0) == 0x80;
        if (ok && len == 3 && c == 0xe0 && p[1] < 0xa0) ok = 0;  /* overlong */
        if (ok && len == 3 && c == 0xed && p[1] >= 0xa0) ok = 0; /* surrogate */
        if (ok && len == 4 && c == 0xf0 && p[1] < 0x90) ok = 0;  /* overlong */
        if (ok && len == 4 && c == 0xf4 && p[1] >= 0x90) ok = 0; /* > U+10FFFF */
        if (ok) { fwrite(p, 1, len, stdout); p += len; }
        else { fputs("\\ufffd", stdout); p++; }
    }
    putchar('"');
}

static void json_str(const char *s) { json_str_n(s, strlen(s)); }

static void finish(void) {
    putchar('\n');
    if (fflush(stdout) != 0 || ferror(stdout)) fail(EXIT_IO, "io", "cannot write stdout");
    exit(0);
}

/* --- arguments --------------------------------------------------------------------- */

/* The guest's argv is [tool, command, positionals..., --option value..., --flag...]: the
 * required positionals come first whatever they hold, an optional one unless it is one of
 * the command's option or flag names, then the options and flags the command declares. */
#define MAX_OPTS 8

struct args {
    const char *pos[2];
    int npos;
    const char *names[MAX_OPTS], *values[MAX_OPTS];
    int nopts;
};

static int is_option_name(const char *arg, const char *const *options, const char *const *flags) {
    if (strncmp(arg, "--", 2) != 0) return 0;
    for (const char *const *o = options; *o; o++) if (!strcmp(arg + 2, *o)) return 1;
    for (const char *const *f = flags; *f; f++) if (!strcmp(arg + 2, *f)) return 2;
    return 0;
}

static struct args parse(int argc, char **argv, int required, int max_pos, const char *const *options,
                         const char *const *flags) {
    struct args a;
    memset(&a, 0, sizeof a);
    int i = 2;
    for (; i < argc && a.npos < max_pos; i++) {
        if (a.npos >= required && is_option_name(argv[i], options, flags)) break;
        a.pos[a.npos++] = argv[i];
    }
    if (a.npos < required) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "%s needs %d argument(s)", argv[1], required);
    for (; i < argc; i++) {
        int kind = is_option_name(argv[i], options, flags);
        if (!kind || a.nopts == MAX_OPTS) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "unexpected argument %s", argv[i]);
        if (kind == 1 && i + 1 >= argc) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "%s needs a value", argv[i]);
        a.names[a.nopts] = argv[i] + 2;
        a.values[a.nopts++] = kind == 1 ? argv[++i] : "";
    }
    return a;
}

static const char *opt(const struct args *a, const char *name) {
    for (int i = 0; i < a->nopts; i++) if (!strcmp(a->names[i], name)) return a->values[i];
    return NULL;
}

static int flag(const struct args *a, const char *name) { return opt(a, name) != NULL; }

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NONE ((const char *const[]){NULL})

static long num(const struct args *a, const char *name, long dflt, long min, long max) {
    const char *v = opt(a, name);
    if (!v) return dflt;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || end == v || n < min || n > max)
        fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "--%s must be an integer from %ld to %ld", name, min, max);
    return n;
}

/* --- paths ------------------------------------------------------------------------- */

/* The workspace-relative form of `path` ("" for the workspace itself) in `rel`. */
static void relative(const char *path, char rel[PATH_MAX_LEN]) {
    const char *p = path;
    if (strncmp(p, ROOT, strlen(ROOT)) == 0 && (p[strlen(ROOT)] == '/' || p[strlen(ROOT)] == 0))
        p += strlen(ROOT);
    /* "/", ".", "./x" and "x/" name what they seem to */
    for (;;) {
        while (*p == '/') p++;
        if (p[0] == '.' && (p[1] == '/' || p[1] == 0)) p++;
        else break;
    }
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == '/') n--;
    if (n >= PATH_MAX_LEN) fail(EXIT_INVALID_PATH, "invalid-path", "the path is longer than %d bytes", PATH_MAX_LEN - 1);
    memcpy(rel, p, n);
    rel[n] = 0;
    /* every component must be a name: no "", ".", "..", no control characters */
    const char *c = rel;
    while (n > 0 && *c) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            fail(EXIT_INVALID_PATH, "invalid-path",
                 "%s: a path is relative to the workspace, made of names (no empty, \".\" or \"..\" parts)", path);
        for (size_t k = 0; k < len; k++)
            if ((unsigned char)c[k] < 0x20)
                fail(EXIT_INVALID_PATH, "invalid-path", "a path may not hold control characters");
        c = slash ? slash + 1 : c + len;
    }
}

/* The absolute path of workspace-relative `rel`. */
static void absolute(const char *rel, char abs[PATH_MAX_LEN + 16]) {
    if (*rel) snprintf(abs, PATH_MAX_LEN + 16, "%s/%s", ROOT, rel);
    else snprintf(abs, PATH_MAX_LEN + 16, "%s", ROOT);
}

/* A workspace path given as an argument, refused when it names the workspace itself. */
static void file_arg(const char *given, char rel[PATH_MAX_LEN], char abs[PATH_MAX_LEN + 16]) {
    relative(given, rel);
    if (!*rel) fail(EXIT_INVALID_PATH, "invalid-path", "%s names the workspace itself, not a file in it", given);
    absolute(rel, abs);
}

/* --- files in memory --------------------------------------------------------------- */

struct buf {
    char *data;
    size_t len;
};

static struct buf slurp(const char *abs, const char *rel) {
    struct stat st;
    if (stat(abs, &st) != 0) fail_errno(errno, "read", rel);
    if (S_ISDIR(st.st_mode)) fail(EXIT_IS_A_DIRECTORY, "is-a-directory", "%s is a directory (list it with ls)", rel);
    if ((uint64_t)st.st_size > READ_CAP)
        fail(EXIT_TOO_LARGE, "too-large", "%s is %lld bytes; files larger than %u bytes are not read whole", rel,
             (long long)st.st_size, READ_CAP);
    FILE *f = fopen(abs, "rb");
    if (!f) fail_errno(errno, "read", rel);
    struct buf b = {malloc((size_t)st.st_size + 1), 0};
    if (!b.data) fail(EXIT_TOO_LARGE, "too-large", "out of memory reading %s", rel);
    b.len = fread(b.data, 1, (size_t)st.st_size, f);
    if (ferror(f)) fail_errno(errno, "read", rel);
    fclose(f);
    b.data[b.len] = 0;
    return b;
}

/* Creates the parent directories of workspace-relative `rel`. */
static void make_parents(const char *rel) {
    char part[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    for (const char *s = strchr(rel, '/'); s; s = strchr(s + 1, '/')) {
        memcpy(part, rel, (size_t)(s - rel));
        part[s - rel] = 0;
        absolute(part, abs);
        if (mkdir(abs, 0755) != 0 && errno != EEXIST) fail_errno(errno, "create the directory", part);
    }
}

static void spill(const char *abs, const char *rel, const char *data, size_t len) {
    FILE *f = fopen(abs, "wb");
    if (!f) fail_errno(errno, "write", rel);
    if (fwrite(data, 1, len, f) != len || fclose(f) != 0) fail_errno(errno, "write", rel);
}

/* --- walking ----------------------------------------------------------------------- */

typedef int (*visit_fn)(const char *rel, const struct stat *st, void *ctx);

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Calls `visit` for every entry under workspace-relative directory `rel`, in name order,
 * depth first; stops when `visit` returns non-zero (and returns that). */
static int walk(const char *rel, int depth, int recursive, visit_fn visit, void *ctx) {
    char abs[PATH_MAX_LEN + 16];
    absolute(rel, abs);
    DIR *d = opendir(abs);
    if (!d) fail_errno(errno, "list", *rel ? rel : "/");
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names) fail(EXIT_TOO_LARGE, "too-large", "out of memory listing %s", rel);
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int stop = 0;
    for (size_t i = 0; i < n && !stop; i++) {
        char child[PATH_MAX_LEN], cabs[PATH_MAX_LEN + 16];
        int w = *rel ? snprintf(child, sizeof child, "%s/%s", rel, names[i])
                     : snprintf(child, sizeof child, "%s", names[i]);
        if (w < 0 || (size_t)w >= sizeof child) continue;
        absolute(child, cabs);
        struct stat st;
        if (lstat(cabs, &st) != 0) continue;
        stop = visit(child, &st, ctx);
        if (!stop && recursive && S_ISDIR(st.st_mode) && depth < MAX_DEPTH)
            stop = walk(child, depth + 1, recursive, visit, ctx);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return stop;
}

/* --- glob matching ----------------------------------------------------------------- */

/* Whether workspace-relative `path` matches `pattern`: `*`, `?` and `[...]` within one
 * path component, `**` for any number of components. */
static int glob_match(const char *pattern, const char *path) {
    if (strncmp(pattern, "**", 2) == 0 && (pattern[2] == '/' || pattern[2] == 0)) {
        const char *rest = pattern[2] == '/' ? pattern + 3 : pattern + 2;
        if (!*rest) return 1;
        for (const char *p = path;; ) {
            if (glob_match(rest, p)) return 1;
            const char *slash = strchr(p, '/');
            if (!slash) return 0;
            p = slash + 1;
        }
    }
    const char *pslash = strchr(pattern, '/');
    const char *slash = strchr(path, '/');
    char pc[PATH_MAX_LEN], sc[PATH_MAX_LEN];
    size_t pl = pslash ? (size_t)(pslash - pattern) : strlen(pattern);
    size_t sl = slash ? (size_t)(slash - path) : strlen(path);
    if (pl >= sizeof pc || sl >= sizeof sc) return 0;
    memcpy(pc, pattern, pl);
    pc[pl] = 0;
    memcpy(sc, path, sl);
    sc[sl] = 0;
    if (fnmatch(pc, sc, FNM_PERIOD) != 0) return 0;
    if (!pslash && !slash) return 1;
    if (!pslash || !slash) return 0;
    return glob_match(pslash + 1, slash + 1);
}

/* A glob matches the path, or (without a `/`) the path's file name. */
static int glob_hit(const char *pattern, const char *rel) {
    if (strchr(pattern, '/')) return glob_match(pattern, rel);
    const char *base = strrchr(rel, '/');
    return glob_match(pattern, base ? base + 1 : rel);
}

/* --- commands ---------------------------------------------------------------------- */

struct ls_ctx {
    long max, count;
    int truncated;
};

static int ls_visit(const char *rel, const struct stat *st, void *p) {
    struct ls_ctx *c = p;
    if (c->count >= c->max) { c->truncated = 1; return 1; }
    fputs(c->count ? "," : "", stdout);
    fputs("{\"path\":", stdout);
    json_str(rel);
    printf(",\"type\":\"%s\"", S_ISDIR(st->st_mode) ? "dir" : S_ISREG(st->st_mode) ? "file" : "other");
    if (S_ISREG(st->st_mode)) printf(",\"size\":%lld", (long long)st->st_size);
    putchar('}');
    c->count++;
    return 0;
}

static int cmd_ls(int argc, char **argv) {
    struct args a = parse(argc, argv, 0, 1, LIST("max-entries"), LIST("recursive"));
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    relative(a.npos ? a.pos[0] : "", rel);
    absolute(rel, abs);
    struct stat st;
    if (stat(abs, &st) != 0) fail_errno(errno, "list", *rel ? rel : "/");
    if (!S_ISDIR(st.st_mode)) fail(EXIT_NOT_A_DIRECTORY, "not-a-directory", "%s is a file (read it with read)", rel);
    struct ls_ctx c = {num(&a, "max-entries", 1000, 1, 10000), 0, 0};
    fputs("{\"path\":", stdout);
    json_str(rel);
    fputs(",\"entries\":[", stdout);
    walk(rel, 0, flag(&a, "recursive"), ls_visit, &c);
    printf("],\"truncated\":%s}", c.truncated ? "true" : "false");
    finish();
    return 0;
}

static int cmd_read(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 1, LIST("offset", "limit", "max-bytes"), NONE);
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    file_arg(a.pos[0], rel, abs);
    long offset = num(&a, "offset", 1, 1, 100000000);
    long limit = num(&a, "limit", 2000, 1, 100000);
    long max_bytes = num(&a, "max-bytes", 100000, 1, 1000000);
    struct buf b = slurp(abs, rel);
    long total = 0;
    for (size_t i = 0; i < b.len; i++) if (b.data[i] == '\n') total++;
    if (b.len > 0 && b.data[b.len - 1] != '\n') total++;
    /* find the start of line `offset` */
    size_t start = 0;
    long line = 1;
    while (line < offset && start < b.len) {
        char *nl = memchr(b.data + start, '\n', b.len - start);
        if (!nl) { start = b.len; break; }
        start = (size_t)(nl - b.data) + 1;
        line++;
    }
    if (line < offset) start = b.len;
    size_t end = start;
    long lines = 0;
    int truncated = 0;
    while (end < b.len && lines < limit) {
        char *nl = memchr(b.data + end, '\n', b.len - end);
        size_t next = nl ? (size_t)(nl - b.data) + 1 : b.len;
        if ((long)(next - start) > max_bytes) { truncated = 1; break; }
        end = next;
        lines++;
    }
    if (end < b.len) truncated = 1;
    fputs("{\"path\":", stdout);
    json_str(rel);
    fputs(",\"content\":", stdout);
    json_str_n(b.data + start, end - start);
    printf(",\"startLine\":%ld,\"lines\":%ld,\"totalLines\":%ld,\"bytes\":%zu,\"truncated\":%s", offset, lines,
           total, b.len, truncated ? "true" : "false");
    if (truncated) printf(",\"nextOffset\":%ld", offset + lines);
    putchar('}');
    finish();
    return 0;
}

static int cmd_write(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 1, LIST("content"), NONE);
    const char *content = opt(&a, "content");
    if (!content) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "write needs PATH and --content");
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    file_arg(a.pos[0], rel, abs);
    struct stat st;
    int existed = stat(abs, &st) == 0;
    if (existed && S_ISDIR(st.st_mode)) fail(EXIT_IS_A_DIRECTORY, "is-a-directory", "%s is a directory", rel);
    make_parents(rel);
    spill(abs, rel, content, strlen(content));
    fputs("{\"path\":", stdout);
    json_str(rel);
    printf(",\"bytes\":%zu,\"created\":%s}", strlen(content), existed ? "false" : "true");
    finish();
    return 0;
}

static int cmd_edit(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 1, LIST("old", "new"), LIST("all"));
    const char *old = opt(&a, "old"), *new = opt(&a, "new");
    if (!old || !new) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "edit needs PATH, --old and --new");
    if (!*old) fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "--old may not be empty");
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    file_arg(a.pos[0], rel, abs);
    struct buf b = slurp(abs, rel);
    size_t ol = strlen(old), nl = strlen(new), count = 0;
    for (const char *p = b.data; (p = memmem(p, b.len - (size_t)(p - b.data), old, ol)); p += ol) count++;
    if (count == 0) fail(EXIT_NO_MATCH, "no-match", "--old does not occur in %s (it must match exactly, whitespace included)", rel);
    if (count > 1 && !flag(&a, "all"))
        fail(EXIT_NOT_UNIQUE, "not-unique",
             "--old occurs %zu times in %s; give more surrounding text so it occurs once, or --all to replace every one",
             count, rel);
    size_t len = b.len - count * ol + count * nl;
    if (len > READ_CAP) fail(EXIT_TOO_LARGE, "too-large", "the edited file would be larger than %u bytes", READ_CAP);
    char *out = malloc(len + 1), *w = out;
    if (!out) fail(EXIT_TOO_LARGE, "too-large", "out of memory editing %s", rel);
    const char *p = b.data, *hit;
    while ((hit = memmem(p, b.len - (size_t)(p - b.data), old, ol))) {
        memcpy(w, p, (size_t)(hit - p));
        w += hit - p;
        memcpy(w, new, nl);
        w += nl;
        p = hit + ol;
    }
    memcpy(w, p, b.len - (size_t)(p - b.data));
    spill(abs, rel, out, len);
    fputs("{\"path\":", stdout);
    json_str(rel);
    printf(",\"replacements\":%zu,\"bytes\":%zu}", count, len);
    finish();
    return 0;
}

struct grep_ctx {
    regex_t re;
    const char *glob;
    long max, count;
    int truncated;
    long files;
};

static void grep_file(const char *rel, struct grep_ctx *c) {
    char abs[PATH_MAX_LEN + 16];
    absolute(rel, abs);
    FILE *f = fopen(abs, "rb");
    if (!f) return;
    char line[4096];
    long n = 0;
    /* a file with a NUL byte in its first 4 KiB is binary: skipped */
    size_t head = fread(line, 1, sizeof line, f);
    if (memchr(line, 0, head) || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    c->files++;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        int whole = len > 0 && line[len - 1] == '\n';
        n++;
        if (whole) line[--len] = 0;
        if (regexec(&c->re, line, 0, NULL, 0) == 0) {
            if (c->count >= c->max) { c->truncated = 1; break; }
            fputs(c->count ? "," : "", stdout);
            fputs("{\"path\":", stdout);
            json_str(rel);
            printf(",\"line\":%ld,\"text\":", n);
            json_str_n(line, len > 500 ? 500 : len);
            putchar('}');
            c->count++;
        }
        /* a line longer than the buffer: skip its rest */
        while (!whole && len == sizeof line - 1) {
            if (!fgets(line, sizeof line, f)) break;
            len = strlen(line);
            whole = len > 0 && line[len - 1] == '\n';
        }
    }
    fclose(f);
}

static int grep_visit(const char *rel, const struct stat *st, void *p) {
    struct grep_ctx *c = p;
    if (!S_ISREG(st->st_mode)) return 0;
    if (c->glob && !glob_hit(c->glob, rel)) return 0;
    if (st->st_size > (off_t)READ_CAP) return 0;
    grep_file(rel, c);
    return c->truncated;
}

static int cmd_grep(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 2, LIST("glob", "max-matches"), LIST("ignore-case"));
    struct grep_ctx c = {0};
    c.glob = opt(&a, "glob");
    c.max = num(&a, "max-matches", 200, 1, 5000);
    int err = regcomp(&c.re, a.pos[0], REG_EXTENDED | REG_NOSUB | (flag(&a, "ignore-case") ? REG_ICASE : 0));
    if (err) {
        char msg[256];
        regerror(err, &c.re, msg, sizeof msg);
        fail(EXIT_INVALID_PATTERN, "invalid-pattern", "%s (POSIX extended regular expressions)", msg);
    }
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    relative(a.npos > 1 ? a.pos[1] : "", rel);
    absolute(rel, abs);
    struct stat st;
    if (stat(abs, &st) != 0) fail_errno(errno, "search", *rel ? rel : "/");
    fputs("{\"matches\":[", stdout);
    if (S_ISDIR(st.st_mode)) walk(rel, 0, 1, grep_visit, &c);
    else grep_file(rel, &c);
    printf("],\"filesSearched\":%ld,\"truncated\":%s}", c.files, c.truncated ? "true" : "false");
    finish();
    return 0;
}

struct glob_ctx {
    const char *pattern;
    long max, count;
    int truncated;
};

static int glob_visit(const char *rel, const struct stat *st, void *p) {
    struct glob_ctx *c = p;
    (void)st;
    if (!glob_match(c->pattern, rel)) return 0;
    if (c->count >= c->max) { c->truncated = 1; return 1; }
    fputs(c->count ? "," : "", stdout);
    json_str(rel);
    c->count++;
    return 0;
}

static int cmd_glob(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 1, LIST("max-results"), NONE);
    const char *pattern = a.pos[0];
    while (*pattern == '/') pattern++;
    struct glob_ctx c = {pattern, num(&a, "max-results", 1000, 1, 10000), 0, 0};
    fputs("{\"paths\":[", stdout);
    walk("", 0, 1, glob_visit, &c);
    printf("],\"truncated\":%s}", c.truncated ? "true" : "false");
    finish();
    return 0;
}

static long removed;

static void remove_tree(const char *rel) {
    char abs[PATH_MAX_LEN + 16];
    absolute(rel, abs);
    struct stat st;
    if (lstat(abs, &st) != 0) fail_errno(errno, "remove", rel);
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(abs);
        if (!d) fail_errno(errno, "remove", rel);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0, cap = 0;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                names = realloc(names, cap * sizeof *names);
                if (!names) fail(EXIT_TOO_LARGE, "too-large", "out of memory removing %s", rel);
            }
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        for (size_t i = 0; i < n; i++) {
            char child[PATH_MAX_LEN];
            int w = snprintf(child, sizeof child, "%s/%s", rel, names[i]);
            if (w > 0 && (size_t)w < sizeof child) remove_tree(child);
            free(names[i]);
        }
        free(names);
        if (rmdir(abs) != 0) fail_errno(errno, "remove", rel);
    } else if (unlink(abs) != 0) {
        fail_errno(errno, "remove", rel);
    }
    removed++;
}

static int cmd_rm(int argc, char **argv) {
    struct args a = parse(argc, argv, 1, 1, NONE, LIST("recursive"));
    char rel[PATH_MAX_LEN], abs[PATH_MAX_LEN + 16];
    file_arg(a.pos[0], rel, abs);
    struct stat st;
    if (lstat(abs, &st) != 0) fail_errno(errno, "remove", rel);
    if (S_ISDIR(st.st_mode) && !flag(&a, "recursive"))
        fail(EXIT_IS_A_DIRECTORY, "is-a-directory", "%s is a directory; pass --recursive to remove it and all it holds", rel);
    remove_tree(rel);
    fputs("{\"path\":", stdout);
    json_str(rel);
    printf(",\"removed\":%ld}", removed);
    finish();
    return 0;
}

static int cmd_mv(int argc, char **argv) {
    struct args a = parse(argc, argv, 2, 2, NONE, NONE);
    char from[PATH_MAX_LEN], fabs[PATH_MAX_LEN + 16], to[PATH_MAX_LEN], tabs[PATH_MAX_LEN + 16];
    file_arg(a.pos[0], from, fabs);
    file_arg(a.pos[1], to, tabs);
    struct stat st;
    if (lstat(fabs, &st) != 0) fail_errno(errno, "move", from);
    if (lstat(tabs, &st) == 0) fail(EXIT_EXISTS, "exists", "%s exists already; remove it first", to);
    size_t fl = strlen(from);
    if (strncmp(to, from, fl) == 0 && to[fl] == '/')
        fail(EXIT_INVALID_PATH, "invalid-path", "cannot move %s into itself", from);
    make_parents(to);
    if (rename(fabs, tabs) != 0) fail_errno(errno, "move", from);
    fputs("{\"from\":", stdout);
    json_str(from);
    fputs(",\"to\":", stdout);
    json_str(to);
    putchar('}');
    finish();
    return 0;
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {
        {"ls", cmd_ls},     {"read", cmd_read}, {"write", cmd_write}, {"edit", cmd_edit},
        {"grep", cmd_grep}, {"glob", cmd_glob}, {"rm", cmd_rm},       {"mv", cmd_mv},
    };
    if (argc >= 2)
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc, argv);
    fail(EXIT_BAD_ARGUMENTS, "bad-arguments", "usage: files ls|read|write|edit|grep|glob|rm|mv ...");
    return EXIT_BAD_ARGUMENTS;
}

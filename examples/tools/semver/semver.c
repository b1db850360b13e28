/*
 * semver -- toolgrid example tool (WASI preview 1 command module).
 *
 * Commands:
 *   semver compare A B
 *       {"order":-1|0|1,"a":"A","b":"B"}  order < 0 means A has lower
 *       precedence than B (Semantic Versioning 2.0.0, section 11; build
 *       metadata is ignored, so 1.0.0+a and 1.0.0+b compare equal).
 *   semver bump VERSION [--part major|minor|patch]   (default: patch)
 *       {"version":"X.Y.Z"}  increments the part, resets the lower parts to
 *       0 and drops pre-release and build metadata (1.2.3-rc.1 -> 1.2.4).
 *
 * Versions must be strict semver 2.0.0 (no leading "v", no leading zeros,
 * no surrounding whitespace). Numbers may be arbitrarily large: they are
 * compared and incremented as decimal strings, never as machine integers.
 *
 * Exit codes: 0 ok, 1 I/O error, 2 bad arguments (toolgrid validates
 * arguments, so this only happens when run by hand), 3 invalid-version.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_IO 1
#define EXIT_USAGE 2
#define EXIT_INVALID_VERSION 3

#define TOOL "semver"
static const char usage[] =
    "usage: semver compare A B | semver bump VERSION [--part major|minor|patch]";

static _Noreturn void die(int code, const char *msg) {
    fprintf(stderr, "semver: %s\n", msg);
    exit(code);
}

typedef struct {
    const char *p;
    size_t n;
} span;

typedef struct {
    span num[3];  /* major, minor, patch (digits, no leading zeros) */
    span pre;     /* pre-release without the '-'; n == 0 when absent */
} version;

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_ident_char(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '-';
}

static const char *const part_names[3] = {"major", "minor", "patch"};

/* Parses s as a semantic version. Returns NULL on success, otherwise a
 * short reason (written into errbuf when it needs details). */
static const char *parse_version(const char *s, version *v, char *errbuf,
                                 size_t errlen) {
    size_t i = 0;
    memset(v, 0, sizeof *v);
    if (s[0] == '\0') return "empty string";
    if ((s[0] == 'v' || s[0] == 'V') && is_digit(s[1]))
        return "a leading 'v' is not part of a semantic version (use 1.2.3, not v1.2.3)";
    for (int k = 0; k < 3; k++) {
        size_t start = i;
        while (is_digit(s[i])) i++;
        if (i == start) {
            snprintf(errbuf, errlen, "expected MAJOR.MINOR.PATCH: %s is missing or not a number",
                     part_names[k]);
            return errbuf;
        }
        if (i - start > 1 && s[start] == '0') {
            snprintf(errbuf, errlen, "%s has a leading zero", part_names[k]);
            return errbuf;
        }
        v->num[k].p = s + start;
        v->num[k].n = i - start;
        if (k < 2) {
            if (s[i] != '.') {
                snprintf(errbuf, errlen, "expected MAJOR.MINOR.PATCH: '.' missing after %s",
                         part_names[k]);
                return errbuf;
            }
            i++;
        }
    }
    if (s[i] == '-') {
        i++;
        size_t pre_start = i;
        for (;;) {
            size_t start = i;
            int all_digits = 1;
            while (is_ident_char(s[i])) {
                if (!is_digit(s[i])) all_digits = 0;
                i++;
            }
            if (i == start) return "empty pre-release identifier";
            if (all_digits && i - start > 1 && s[start] == '0')
                return "numeric pre-release identifier has a leading zero";
            if (s[i] != '.') break;
            i++;
        }
        v->pre.p = s + pre_start;
        v->pre.n = i - pre_start;
    }
    if (s[i] == '+') {
        i++;
        for (;;) {
            size_t start = i;
            while (is_ident_char(s[i])) i++;
            if (i == start) return "empty build metadata identifier";
            if (s[i] != '.') break;
            i++;
        }
    }
    if (s[i] != '\0') {
        unsigned char c = (unsigned char)s[i];
        if (c > 0x20 && c < 0x7F)
            snprintf(errbuf, errlen, "unexpected character '%c' at position %zu", c, i + 1);
        else
            snprintf(errbuf, errlen, "unexpected byte 0x%02x at position %zu", c, i + 1);
        return errbuf;
    }
    return NULL;
}

/* Compares two non-negative decimal numbers without leading zeros. */
static int cmp_num(const char *a, size_t an, const char *b, size_t bn) {
    if (an != bn) return an < bn ? -1 : 1;
    int c = memcmp(a, b, an);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
}

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn) {
    size_t n = an < bn ? an : bn;
    int c = memcmp(a, b, n);
    if (c != 0) return c < 0 ? -1 : 1;
    if (an != bn) return an < bn ? -1 : 1;
    return 0;
}

static int all_digits(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_digit(p[i])) return 0;
    return 1;
}

/* Semver 2.0.0 precedence (section 11). */
static int cmp_version(const version *a, const version *b) {
    for (int k = 0; k < 3; k++) {
        int c = cmp_num(a->num[k].p, a->num[k].n, b->num[k].p, b->num[k].n);
        if (c) return c;
    }
    /* a version without pre-release has higher precedence */
    if (a->pre.n == 0 || b->pre.n == 0) {
        if (a->pre.n == b->pre.n) return 0;
        return a->pre.n == 0 ? 1 : -1;
    }
    size_t i = 0, j = 0;
    for (;;) {
        int a_end = i >= a->pre.n, b_end = j >= b->pre.n;
        if (a_end || b_end) {
            /* a larger set of fields has higher precedence */
            if (a_end && b_end) return 0;
            return a_end ? -1 : 1;
        }
        size_t is = i, js = j;
        while (i < a->pre.n && a->pre.p[i] != '.') i++;
        while (j < b->pre.n && b->pre.p[j] != '.') j++;
        const char *x = a->pre.p + is, *y = b->pre.p + js;
        size_t xn = i - is, yn = j - js;
        int xd = all_digits(x, xn), yd = all_digits(y, yn);
        int c;
        if (xd && yd) c = cmp_num(x, xn, y, yn);
        else if (xd != yd) c = xd ? -1 : 1; /* numeric < alphanumeric */
        else c = cmp_bytes(x, xn, y, yn);  /* ASCII order */
        if (c) return c;
        if (i < a->pre.n) i++; /* skip '.' */
        if (j < b->pre.n) j++;
    }
}

/* Writes s as a JSON string. Valid versions are printable ASCII, but this
 * stays safe for anything: non-ASCII bytes are escaped as \u00XX. */
static void json_ascii(FILE *f, const char *s) {
    putc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { putc('\\', f); putc(*p, f); }
        else if (*p < 0x20 || *p >= 0x7F) fprintf(f, "\\u%04x", (unsigned)*p);
        else putc(*p, f);
    }
    putc('"', f);
}

/* Prints a user-supplied string for an error message: quoted, printable
 * ASCII only, truncated. */
static void print_quoted(FILE *f, const char *s) {
    size_t n = 0;
    putc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        if (n == 64) { fputs("...", f); break; }
        if (*p == '"' || *p == '\\') { putc('\\', f); putc(*p, f); }
        else if (*p < 0x20 || *p >= 0x7F) fprintf(f, "\\x%02x", (unsigned)*p);
        else putc(*p, f);
    }
    putc('"', f);
}

/* Reports a usage error on one line and exits. */
static _Noreturn void usage_error(const char *what, const char *arg) {
    fprintf(stderr, "%s: %s", TOOL, what);
    if (arg) { putc(' ', stderr); print_quoted(stderr, arg); }
    fprintf(stderr, "; %s\n", usage);
    exit(EXIT_USAGE);
}

static void parse_or_die(const char *name, const char *s, version *v) {
    char errbuf[160];
    const char *err = parse_version(s, v, errbuf, sizeof errbuf);
    if (!err) return;
    fprintf(stderr, "semver: invalid-version: %s ", name);
    print_quoted(stderr, s);
    fprintf(stderr, " is not a semantic version: %s\n", err);
    exit(EXIT_INVALID_VERSION);
}

static void finish(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) die(EXIT_IO, "cannot write stdout");
    exit(0);
}

/* Returns n+1 as a new NUL-terminated decimal string (n: digits without
 * leading zeros), or exits if out of memory. */
static char *incremented(span n) {
    char *buf = malloc(n.n + 2);
    if (!buf) die(EXIT_IO, "out of memory");
    buf[0] = '0';
    memcpy(buf + 1, n.p, n.n);
    buf[n.n + 1] = '\0';
    size_t k = n.n + 1;
    for (;;) {
        k--;
        if (buf[k] == '9') { buf[k] = '0'; continue; }
        buf[k]++;
        break; /* stops at buf[0] == '0' at the latest */
    }
    if (buf[0] == '0') memmove(buf, buf + 1, n.n + 1);
    return buf;
}

static int cmd_compare(int argc, char **argv) {
    if (argc != 4) usage_error("compare takes exactly two arguments", NULL);
    version a, b;
    parse_or_die("a", argv[2], &a);
    parse_or_die("b", argv[3], &b);
    printf("{\"order\":%d,\"a\":", cmp_version(&a, &b));
    json_ascii(stdout, argv[2]);
    fputs(",\"b\":", stdout);
    json_ascii(stdout, argv[3]);
    fputs("}\n", stdout);
    finish();
    return 0;
}

static int cmd_bump(int argc, char **argv) {
    if (argc < 3) usage_error("bump needs a VERSION argument", NULL);
    int part = 2; /* patch */
    /* argv[2] is the positional VERSION (even if it starts with '-');
     * options follow it. */
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "--part") == 0) {
            if (i + 1 >= argc) usage_error("--part needs a value", NULL);
            val = argv[++i];
        } else if (strncmp(a, "--part=", 7) == 0) {
            val = a + 7;
        } else {
            usage_error("unexpected argument", a);
        }
        part = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(val, part_names[k]) == 0) part = k;
        if (part < 0) usage_error("--part must be major, minor or patch, got", val);
    }
    version v;
    parse_or_die("version", argv[2], &v);
    char *inc = incremented(v.num[part]); /* before any output */
    fputs("{\"version\":\"", stdout);
    for (int k = 0; k < 3; k++) {
        if (k) putchar('.');
        if (k == part) fputs(inc, stdout);
        else if (k > part) putchar('0');
        else fwrite(v.num[k].p, 1, v.num[k].n, stdout);
    }
    fputs("\"}\n", stdout);
    free(inc);
    finish();
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "compare") == 0) return cmd_compare(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "bump") == 0) return cmd_bump(argc, argv);
    usage_error(argc < 2 ? "missing command" : "unknown command", argc < 2 ? NULL : argv[1]);
}

/*
 * uuid -- toolgrid example tool. Compiled as a WASI preview 1 command module
 * and shipped as a WASI preview 2 component (wasi:cli/run) made with
 * `toolgrid componentize`.
 *
 * Command:
 *   uuid generate [--count N (1..100, default 1)] [--uppercase]
 *       {"uuids":["xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx",...],
 *        "generatedAt":"YYYY-MM-DDTHH:MM:SS.mmmZ"}
 *
 * Random version 4 UUIDs (RFC 9562) built from the WASI random source
 * (getentropy -> random_get, read once per call in chunks of up to 256
 * bytes); generatedAt is the wall clock (CLOCK_REALTIME), read once, in UTC
 * with millisecond precision. Both reads are recorded by toolgrid, so a
 * replayed call reproduces the same output.
 *
 * Exit codes: 0 ok, 1 failure (bad arguments -- toolgrid validates them, so
 * this only happens when run by hand --, random source or clock unavailable,
 * or stdout not writable); the one-line reason is on stderr.
 */
#define _DEFAULT_SOURCE 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Through the wasi_snapshot_preview1 adapter a component reports exit status
 * 0 or 1 (a non-zero proc_exit becomes wasi:cli/exit's exit(err)), so every
 * failure is exit code 1; stderr says which. (fetch imports wasi:cli/exit
 * and calls exit-with-code to report several codes.) */
#define EXIT_IO 1
#define EXIT_USAGE 1
#define EXIT_SYSTEM 1

#define COUNT_MAX 100
#define COUNT_DEFAULT 1
#define ENTROPY_CHUNK 256 /* getentropy() limit */

#define TOOL "uuid"
static const char usage[] =
    "usage: uuid generate [--count N (1..100, default 1)] [--uppercase]";

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

static _Noreturn void die(int code, const char *msg) {
    fprintf(stderr, "uuid: %s\n", msg);
    exit(code);
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    if (*s == '\0') return -1;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
        if (v > hi) return -1; /* also stops before any overflow */
    }
    if (v < lo) return -1;
    *out = v;
    return 0;
}

static void fill_random(unsigned char *buf, size_t n) {
    while (n > 0) {
        size_t k = n < ENTROPY_CHUNK ? n : ENTROPY_CHUNK;
        if (getentropy(buf, k) != 0) die(EXIT_SYSTEM, "random source unavailable");
        buf += k;
        n -= k;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) usage_error("missing command", NULL);
    if (strcmp(argv[1], "generate") != 0) usage_error("unknown command", argv[1]);
    long count = COUNT_DEFAULT;
    int upper = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--uppercase") == 0) {
            upper = 1;
        } else if (strcmp(a, "--count") == 0 || strncmp(a, "--count=", 8) == 0) {
            const char *v;
            if (a[7] == '=') v = a + 8;
            else if (i + 1 < argc) v = argv[++i];
            else usage_error("--count needs a value", NULL);
            if (parse_int(v, 1, COUNT_MAX, &count) != 0)
                usage_error("--count must be an integer between 1 and 100, got", v);
        } else {
            usage_error("unexpected argument", a);
        }
    }

    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) die(EXIT_SYSTEM, "clock unavailable");
    struct tm tm;
    if (ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec > 999999999 ||
        gmtime_r(&ts.tv_sec, &tm) == NULL || tm.tm_year + 1900 > 9999)
        die(EXIT_SYSTEM, "clock out of range");
    char stamp[32];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
             tm.tm_sec, (int)(ts.tv_nsec / 1000000));

    static unsigned char rnd[COUNT_MAX * 16];
    fill_random(rnd, (size_t)count * 16);

    const char *hex = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    fputs("{\"uuids\":[", stdout);
    for (long u = 0; u < count; u++) {
        unsigned char *b = rnd + u * 16;
        b[6] = (unsigned char)((b[6] & 0x0F) | 0x40); /* version 4 */
        b[8] = (unsigned char)((b[8] & 0x3F) | 0x80); /* RFC 9562 variant */
        char s[37];
        size_t k = 0;
        for (int i = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10) s[k++] = '-';
            s[k++] = hex[b[i] >> 4];
            s[k++] = hex[b[i] & 0x0F];
        }
        s[k] = '\0';
        printf("%s\"%s\"", u ? "," : "", s);
    }
    printf("],\"generatedAt\":\"%s\"}\n", stamp);
    if (fflush(stdout) != 0 || ferror(stdout)) die(EXIT_IO, "cannot write stdout");
    return 0;
}

/*
 * textstats -- toolgrid example tool (WASI preview 1 command module).
 *
 * Command:
 *   textstats count [--top N] [--ignore-case]
 *
 * Reads stdin as (UTF-8) text, streaming it in 64 KiB chunks (memory use
 * grows with the number of distinct words, not with the size of the text),
 * and prints one JSON object:
 *   {"lines":L,"words":W,"chars":C,"bytes":B,"top":[{"word":"..","count":N},..]}
 *
 * Definitions (also in examples/manifests/textstats.yaml):
 *   lines  number of '\n' bytes, plus one if the text is non-empty and does
 *          not end with '\n' (so "a\nb" and "a\nb\n" both have 2 lines).
 *   chars  Unicode code points; every byte that is not part of a valid UTF-8
 *          sequence counts as one character.
 *   bytes  size of the input in bytes.
 *   words  maximal runs of word characters: ASCII letters and digits, the
 *          apostrophe (' or U+2019, the latter normalised to '), and any
 *          non-ASCII character outside the common Unicode space, punctuation,
 *          symbol and emoji blocks. Leading and trailing apostrophes are not
 *          part of a word. Invalid UTF-8 bytes separate words.
 *   top    the N most frequent words, by count (descending), ties broken by
 *          the word's bytes (ascending, i.e. code point order).
 *   --ignore-case folds ASCII, Latin-1, basic Greek and basic Cyrillic capital
 *          letters to lower case before counting (top words are reported in
 *          lower case).
 *
 * Exit codes: 0 ok, 1 I/O error, 2 bad arguments (toolgrid validates
 * arguments, so this only happens when run by hand), 3 the distinct words
 * do not fit in the memory limit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_IO 1
#define EXIT_USAGE 2
#define EXIT_TOO_LARGE 3

#define TOP_MAX 100
#define TOP_DEFAULT 5

static _Noreturn void die(int code, const char *msg) {
    fprintf(stderr, "textstats: %s\n", msg);
    exit(code);
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die(EXIT_TOO_LARGE, "input too large: out of memory");
    return q;
}

/* ---------------------------------------------------------------- UTF-8 */

/* Decodes one UTF-8 sequence at s[0..n). Returns its length (1..4) and
 * stores the code point, or returns 0 if s[0] does not start a valid,
 * shortest-form sequence of a Unicode scalar value. n must be >= 1. */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1Fu; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0Fu; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07u; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

static size_t utf8_encode(uint32_t cp, unsigned char out[4]) {
    if (cp < 0x80) { out[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

#define APOSTROPHE_RIGHT_QUOTE 0x2019u

/* Is code point cp part of a word? */
static int is_word_cp(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               (cp >= '0' && cp <= '9') || cp == '\'';
    if (cp <= 0xBF) /* C1 controls, Latin-1 punctuation and symbols */
        return cp == 0xAA || cp == 0xB5 || cp == 0xBA; /* ª µ º */
    if (cp == 0xD7 || cp == 0xF7) return 0; /* × ÷ */
    if (cp == APOSTROPHE_RIGHT_QUOTE) return 1;
    if (cp >= 0x2000 && cp <= 0x206F) return 0; /* general punctuation */
    if (cp >= 0x20A0 && cp <= 0x20CF) return 0; /* currency symbols */
    if (cp >= 0x2190 && cp <= 0x2BFF) return 0; /* arrows .. misc symbols */
    if (cp >= 0x2E00 && cp <= 0x2E7F) return 0; /* supplemental punctuation */
    if (cp >= 0x3000 && cp <= 0x303F) return 0; /* CJK symbols/punctuation */
    if (cp >= 0xFE10 && cp <= 0xFE1F) return 0; /* vertical forms */
    if (cp >= 0xFE30 && cp <= 0xFE6F) return 0; /* CJK compat/small forms */
    if (cp == 0xFEFF) return 0;                 /* BOM / ZWNBSP */
    if ((cp >= 0xFF00 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF20) ||
        (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65))
        return 0;                               /* fullwidth punctuation */
    if (cp >= 0xFFF0 && cp <= 0xFFFF) return 0; /* specials */
    if (cp >= 0x1F000 && cp <= 0x1FAFF) return 0; /* emoji, pictographs */
    return 1;
}

static uint32_t fold_case(uint32_t cp) {
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 0x20;   /* Latin-1 */
    if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 0x20; /* Greek */
    if (cp >= 0x410 && cp <= 0x42F) return cp + 0x20;                /* Cyrillic */
    if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;
    return cp;
}

/* ----------------------------------------------------------- hash table */

typedef struct {
    char *word; /* NULL = empty slot */
    size_t len;
    uint64_t count;
    uint32_t hash;
} entry;

static entry *table;
static size_t table_cap;  /* power of two */
static size_t table_used;

static uint32_t fnv1a(const unsigned char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 16777619u;
    }
    return h;
}

static void table_grow(void) {
    size_t ncap = table_cap ? table_cap * 2 : 1024;
    if (ncap < table_cap || ncap > SIZE_MAX / sizeof(entry))
        die(EXIT_TOO_LARGE, "input too large: too many distinct words");
    entry *nt = calloc(ncap, sizeof(entry));
    if (!nt) die(EXIT_TOO_LARGE, "input too large: out of memory");
    for (size_t i = 0; i < table_cap; i++) {
        if (!table[i].word) continue;
        size_t j = table[i].hash & (ncap - 1);
        while (nt[j].word) j = (j + 1) & (ncap - 1);
        nt[j] = table[i];
    }
    free(table);
    table = nt;
    table_cap = ncap;
}

static void table_add(const unsigned char *w, size_t n) {
    if ((table_used + 1) * 2 > table_cap) table_grow();
    uint32_t h = fnv1a(w, n);
    size_t j = h & (table_cap - 1);
    while (table[j].word) {
        if (table[j].hash == h && table[j].len == n &&
            memcmp(table[j].word, w, n) == 0) {
            table[j].count++;
            return;
        }
        j = (j + 1) & (table_cap - 1);
    }
    char *copy = malloc(n + 1);
    if (!copy) die(EXIT_TOO_LARGE, "input too large: out of memory");
    memcpy(copy, w, n);
    copy[n] = '\0';
    table[j].word = copy;
    table[j].len = n;
    table[j].count = 1;
    table[j].hash = h;
    table_used++;
}

static int cmp_entry(const void *pa, const void *pb) {
    const entry *a = *(const entry *const *)pa;
    const entry *b = *(const entry *const *)pb;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->word, b->word, n);
    if (c != 0) return c < 0 ? -1 : 1;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return 0;
}

/* ----------------------------------------------------------------- JSON */

/* Writes s[0..n) as a JSON string. Valid UTF-8 is copied; invalid bytes
 * become U+FFFD; control characters, U+2028 and U+2029 are escaped. */
static void json_string(FILE *f, const unsigned char *s, size_t n) {
    putc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') { putc('\\', f); putc(c, f); i++; continue; }
        if (c < 0x20 || c == 0x7F) {
            switch (c) {
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default: fprintf(f, "\\u%04x", (unsigned)c); break;
            }
            i++;
            continue;
        }
        if (c < 0x80) { putc(c, f); i++; continue; }
        uint32_t cp;
        size_t len = utf8_decode(s + i, n - i, &cp);
        if (len == 0) { fputs("\\ufffd", f); i++; continue; }
        if (cp == 0x2028 || cp == 0x2029) fprintf(f, "\\u%04x", (unsigned)cp);
        else fwrite(s + i, 1, len, f);
        i += len;
    }
    putc('"', f);
}

/* ------------------------------------------------------------ arguments */

/* Parses a decimal integer in [lo, hi]; returns 0 on success. */
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

#define TOOL "textstats"
static const char usage[] =
    "usage: textstats count [--top N (0..100, default 5)] [--ignore-case] < text";

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

/* ------------------------------------------------------------- counting */

typedef struct {
    int ignore_case;
    int rank; /* collect words in the table (top > 0) */
    uint64_t lines, words, chars, bytes;
    unsigned char *w; /* current run of word characters, UTF-8 */
    size_t wlen, wcap;
} counter;

static void end_run(counter *c) {
    if (c->wlen == 0) return;
    /* trim apostrophes at both ends */
    size_t start = 0, end = c->wlen;
    while (start < end && c->w[start] == '\'') start++;
    while (end > start && c->w[end - 1] == '\'') end--;
    if (end > start) {
        c->words++;
        if (c->rank) table_add(c->w + start, end - start);
    }
    c->wlen = 0;
}

/* Feeds one character: a code point, or an invalid byte (valid == 0). */
static void feed(counter *c, uint32_t cp, int valid) {
    c->chars++;
    if (!valid || !is_word_cp(cp)) {
        if (valid && cp == '\n') c->lines++;
        end_run(c);
        return;
    }
    if (cp == APOSTROPHE_RIGHT_QUOTE) cp = '\'';
    if (c->ignore_case) cp = fold_case(cp);
    if (c->wcap - c->wlen < 4) {
        size_t ncap = c->wcap ? c->wcap * 2 : 256;
        if (ncap < c->wcap) die(EXIT_TOO_LARGE, "input too large: word too long");
        c->w = xrealloc(c->w, ncap);
        c->wcap = ncap;
    }
    c->wlen += utf8_encode(cp, c->w + c->wlen);
}

/* Streams stdin through the counter in fixed-size chunks, so memory use
 * depends on the number of distinct words, not on the size of the text. */
static void count_stream(FILE *f, counter *c) {
    static unsigned char buf[64 * 1024];
    size_t have = 0;
    int eof = 0, last_newline = 1;
    while (!eof) {
        size_t want = sizeof buf - have;
        size_t got = fread(buf + have, 1, want, f);
        if (got < want) {
            if (ferror(f)) die(EXIT_IO, "cannot read stdin");
            eof = 1;
        }
        have += got;
        c->bytes += got;
        /* decode while a whole sequence (at most 4 bytes) is buffered; at
         * EOF decode everything (a truncated sequence is invalid) */
        size_t i = 0;
        while (i < have && (eof || have - i >= 4)) {
            uint32_t cp;
            size_t len = utf8_decode(buf + i, have - i, &cp);
            if (len == 0) { feed(c, 0, 0); i++; }
            else { feed(c, cp, 1); i += len; }
        }
        if (i > 0) last_newline = buf[i - 1] == '\n';
        memmove(buf, buf + i, have - i);
        have -= i;
    }
    end_run(c);
    if (!last_newline) c->lines++; /* a last line without '\n' */
}

int main(int argc, char **argv) {
    if (argc < 2) usage_error("missing command", NULL);
    if (strcmp(argv[1], "count") != 0) usage_error("unknown command", argv[1]);
    long top = TOP_DEFAULT;
    int ignore_case = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ignore-case") == 0) {
            ignore_case = 1;
        } else if (strcmp(a, "--top") == 0 || strncmp(a, "--top=", 6) == 0) {
            const char *v;
            if (a[5] == '=') v = a + 6;
            else if (i + 1 < argc) v = argv[++i];
            else usage_error("--top needs a value", NULL);
            if (parse_int(v, 0, TOP_MAX, &top) != 0)
                usage_error("--top must be an integer between 0 and 100, got", v);
        } else {
            usage_error("unexpected argument", a);
        }
    }

    counter c = {0};
    c.ignore_case = ignore_case;
    c.rank = top > 0;
    count_stream(stdin, &c);

    size_t ntop = 0;
    entry **sorted = NULL;
    if (top > 0 && table_used > 0) {
        sorted = malloc(table_used * sizeof *sorted);
        if (!sorted) die(EXIT_TOO_LARGE, "input too large: out of memory");
        size_t k = 0;
        for (size_t j = 0; j < table_cap; j++)
            if (table[j].word) sorted[k++] = &table[j];
        qsort(sorted, k, sizeof *sorted, cmp_entry);
        ntop = k < (size_t)top ? k : (size_t)top;
    }

    printf("{\"lines\":%llu,\"words\":%llu,\"chars\":%llu,\"bytes\":%llu,\"top\":[",
           (unsigned long long)c.lines, (unsigned long long)c.words,
           (unsigned long long)c.chars, (unsigned long long)c.bytes);
    for (size_t k = 0; k < ntop; k++) {
        fputs(k ? ",{\"word\":" : "{\"word\":", stdout);
        json_string(stdout, (const unsigned char *)sorted[k]->word, sorted[k]->len);
        printf(",\"count\":%llu}", (unsigned long long)sorted[k]->count);
    }
    fputs("]}\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) die(EXIT_IO, "cannot write stdout");
    return 0;
}

#!/usr/bin/env python3
"""Smoke tests for the example tools, run directly on the built .wasm files.

    pip install wasmtime
    python3 examples/tests/smoke.py [--dir DIR]   # DIR as given to build.sh --out

Runs each tool with the argv layout toolgrid uses ([tool, command,
positional..., --option value..., --flag...]) and checks stdout (one JSON
value), exit codes and stderr. textstats and semver are also compared with
small Python reference implementations on generated inputs. fetch is run with
wasmtime's wasi:http against a local HTTP server on 127.0.0.1 (no other
network is used).
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wasirun  # noqa: E402

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = EXAMPLES
if "--dir" in sys.argv:
    ROOT = sys.argv[sys.argv.index("--dir") + 1]
WASM = {t: os.path.join(ROOT, "tools", t, t + ".wasm") for t in ("textstats", "semver", "uuid", "fetch")}

failures = 0
checks = 0

# Result schemas from the manifests; outputs are validated against them when
# PyYAML and jsonschema are installed.
SCHEMAS = {}
try:
    import glob

    import jsonschema
    import yaml
    for path in glob.glob(os.path.join(EXAMPLES, "manifests", "*.yaml")):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc.get("kind") == "Tool":
                    for c in doc["spec"]["commands"]:
                        SCHEMAS[(doc["metadata"]["name"], c["name"])] = jsonschema.Draft202012Validator(
                            c["result"], format_checker=jsonschema.FormatChecker())
except ImportError:
    print("note: PyYAML/jsonschema not installed, results are not validated against the manifests")


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL:", what)


def call(tool, argv, stdin=b"", expect_code=0, memory_limit=32 << 20):
    code, out, err = wasirun.run(WASM[tool], [tool] + argv, stdin, memory_limit, http=tool == "fetch")
    what = "%s %s (stdin %d bytes)" % (tool, argv, len(stdin))
    check(code == expect_code, "%s: exit %d, expected %d; stderr=%r" % (what, code, expect_code, err))
    if code == 0:
        check(err == b"", "%s: unexpected stderr %r" % (what, err))
        try:
            value = json.loads(out.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            check(False, "%s: stdout is not one JSON value: %s: %r" % (what, e, out[:200]))
            return None
        validator = SCHEMAS.get((tool, argv[0] if argv else ""))
        if validator is not None:
            errors = [e.message for e in validator.iter_errors(value)]
            check(not errors, "%s: result does not match the manifest schema: %s" % (what, errors[:3]))
        return value
    check(out == b"", "%s: stdout on failure: %r" % (what, out))
    check(err.endswith(b"\n") and err.count(b"\n") == 1, "%s: stderr not one line: %r" % (what, err))
    return err.decode("utf-8", "replace")


# ------------------------------------------------------------------ textstats

def ts_is_word(cp):
    if cp < 0x80:
        c = chr(cp)
        return c.isascii() and (c.isalnum() or c == "'")
    if cp <= 0xBF:
        return cp in (0xAA, 0xB5, 0xBA)
    if cp in (0xD7, 0xF7):
        return False
    if cp == 0x2019:
        return True
    if 0xDC80 <= cp <= 0xDCFF:  # surrogateescape'd invalid byte
        return False
    for lo, hi in ((0x2000, 0x206F), (0x20A0, 0x20CF), (0x2190, 0x2BFF), (0x2E00, 0x2E7F),
                   (0x3000, 0x303F), (0xFE10, 0xFE1F), (0xFE30, 0xFE6F), (0xFEFF, 0xFEFF),
                   (0xFF00, 0xFF0F), (0xFF1A, 0xFF20), (0xFF3B, 0xFF40), (0xFF5B, 0xFF65),
                   (0xFFF0, 0xFFFF), (0x1F000, 0x1FAFF)):
        if lo <= cp <= hi:
            return False
    return True


def ts_fold(cp):
    if 0x41 <= cp <= 0x5A:
        return cp + 32
    if 0xC0 <= cp <= 0xDE and cp != 0xD7:
        return cp + 0x20
    if 0x391 <= cp <= 0x3A9 and cp != 0x3A2:
        return cp + 0x20
    if 0x410 <= cp <= 0x42F:
        return cp + 0x20
    if 0x400 <= cp <= 0x40F:
        return cp + 0x50
    return cp


def ts_reference(data, top, ignore_case):
    text = data.decode("utf-8", "surrogateescape")
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    counts = {}
    words = 0
    run = []
    for ch in text + "\0":
        cp = ord(ch)
        if ts_is_word(cp):
            if cp == 0x2019:
                cp = 0x27
            if ignore_case:
                cp = ts_fold(cp)
            run.append(chr(cp))
        elif run:
            w = "".join(run).strip("'")
            if w:
                words += 1
                counts[w] = counts.get(w, 0) + 1
            run = []
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode("utf-8")))
    return {"lines": lines, "words": words, "chars": len(text), "bytes": len(data),
            "top": [{"word": w, "count": c} for w, c in ranked[:top]]}


def test_textstats():
    r = call("textstats", ["count", "--top", "2"], b"a b a\n")
    check(r == {"lines": 1, "words": 3, "chars": 6, "bytes": 6,
                "top": [{"word": "a", "count": 2}, {"word": "b", "count": 1}]}, "textstats basic: %r" % r)
    r = call("textstats", ["count", "--top", "5"], b"")
    check(r == {"lines": 0, "words": 0, "chars": 0, "bytes": 0, "top": []}, "textstats empty: %r" % r)
    r = call("textstats", ["count", "--top", "0"], b"x y z")
    check(r == {"lines": 1, "words": 3, "chars": 5, "bytes": 5, "top": []}, "textstats top 0: %r" % r)
    r = call("textstats", ["count", "--top", "5", "--ignore-case"], "Don't DON’T don't 'quoted' Élan élan ΑΒΓ αβγ".encode())
    check(r["top"] == [{"word": "don't", "count": 3}, {"word": "élan", "count": 2},
                       {"word": "αβγ", "count": 2}, {"word": "quoted", "count": 1}], "textstats fold: %r" % r)
    check(r == ts_reference("Don't DON’T don't 'quoted' Élan élan ΑΒΓ αβγ".encode(), 5, True), "textstats fold: %r" % r)
    # JSON escaping and invalid UTF-8
    data = b'say "hi"\\ \xff\xfe caf\xc3\xa9 \xe2\x80\x94 tab\there \xed\xa0\x80 end'
    r = call("textstats", ["count", "--top", "100"], data)
    check(r == ts_reference(data, 100, False), "textstats invalid utf-8: %r vs %r" % (r, ts_reference(data, 100, False)))
    # ties alphabetical, at most N
    r = call("textstats", ["count", "--top", "3"], b"b a c b a c d")
    check([t["word"] for t in r["top"]] == ["a", "b", "c"], "textstats ties: %r" % r)
    # lines
    for data, n in ((b"a\nb", 2), (b"a\nb\n", 2), (b"\n", 1), (b"\n\n", 2), (b"a\r\nb\r\n", 2)):
        r = call("textstats", ["count", "--top", "0"], data)
        check(r["lines"] == n, "textstats lines %r: %r" % (data, r))
    # defensive argument handling
    for bad in (["count", "--top", "101"], ["count", "--top", "-1"], ["count", "--top", "1e3"],
                ["count", "--top", "99999999999999999999"], ["count", "--top"], ["count", "extra"],
                ["count", "--bogus"], ["nope"], []):
        call("textstats", bad, b"a", expect_code=2)
    # a large input with many distinct words
    rng = random.Random(1)
    big = " ".join("w%d" % rng.randrange(50000) for _ in range(200000)).encode()
    r = call("textstats", ["count", "--top", "100"], big)
    check(r == ts_reference(big, 100, False), "textstats big input")
    # multi-byte sequences and invalid bytes across the 64 KiB read chunks
    pieces = ["é", "日本", "😀", "ab", " ", "’", "\n", "Ж"]
    s = "".join(rng.choice(pieces) for _ in range(120000)).encode()
    s = s[:70000] + b"\xe2\x82" + s[70000:140000] + b"\xf0" + s[140000:] + b"\xc3"
    for ic in (False, True):
        argv = ["count", "--top", "10"] + (["--ignore-case"] if ic else [])
        r = call("textstats", argv, s)
        check(r == ts_reference(s, 10, ic), "textstats chunk boundaries (ignore-case %s)" % ic)
    # streaming: a text much larger than the memory limit
    huge = b"the quick brown fox jumps over the lazy dog\n" * 1000000  # 44 MB
    r = call("textstats", ["count", "--top", "1"], huge, memory_limit=32 << 20)
    check(r == {"lines": 1000000, "words": 9000000, "chars": len(huge), "bytes": len(huge),
                "top": [{"word": "the", "count": 2000000}]}, "textstats huge input: %r" % r)
    # too many distinct words for the memory limit: clean error, not a trap
    many = b" ".join(b"%x" % rng.getrandbits(48) for _ in range(2000000))
    err = call("textstats", ["count", "--top", "1"], many, expect_code=3, memory_limit=32 << 20)
    check("out of memory" in (err or ""), "textstats out of memory message: %r" % err)
    r = call("textstats", ["count", "--top", "0"], many, memory_limit=32 << 20)
    check(r is not None and r["words"] == 2000000, "textstats --top 0 does not rank")
    # generated inputs against the reference
    alphabet = ["a", "b", "A", "B", "'", "’", " ", "\n", "\t", ".", ",", "é", "É", "ß", "Ж", "ж", "—",
                "€", "😀", "日", "本", "\u00a0", "\u3000", "1", "0", "\\", "\"", "\x00", "\x1f", "\u2028"]
    for i in range(300):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))).encode()
        if rng.random() < 0.3:  # sprinkle invalid bytes / truncated sequences
            b = bytearray(s)
            for _ in range(rng.randrange(1, 4)):
                b.insert(rng.randrange(len(b) + 1), rng.choice([0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xf0, 0xf5, 0xff]))
            s = bytes(b)
        top = rng.randrange(0, 8)
        ic = rng.random() < 0.5
        argv = ["count", "--top", str(top)] + (["--ignore-case"] if ic else [])
        r = call("textstats", argv, s)
        exp = ts_reference(s, top, ic)
        check(r == exp, "textstats %r %r:\n  got  %r\n  want %r" % (argv, s, r, exp))


# --------------------------------------------------------------------- semver

SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?\Z")  # from semver.org


def sv_key(v):
    m = SEMVER_RE.match(v)
    nums = tuple(int(m.group(i)) for i in (1, 2, 3))
    if m.group(4) is None:
        return nums + ((1,),)
    ids = tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in m.group(4).split("."))
    return nums + ((0,) + ids,)


def sv_cmp(a, b):
    ka, kb = sv_key(a), sv_key(b)
    return (ka > kb) - (ka < kb)


def test_semver():
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1-0", "1.0.1-1", "1.0.1-a", "1.0.1",
             "1.1.0", "1.2.0", "1.10.0", "2.0.0", "10.0.0", "18446744073709551616.0.0"]
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            r = call("semver", ["compare", a, b])
            want = (i > j) - (i < j)
            check(r == {"order": want, "a": a, "b": b}, "semver compare %s %s: %r" % (a, b, r))
    r = call("semver", ["compare", "1.0.0+build.1", "1.0.0+build.2"])
    check(r["order"] == 0, "build metadata ignored: %r" % r)
    r = call("semver", ["compare", "1.0.0-rc.1+x", "1.0.0"])
    check(r["order"] == -1, "pre-release with build: %r" % r)

    valid = ["0.0.4", "1.2.3", "10.20.30", "1.1.2-prerelease+meta", "1.1.2+meta", "1.1.2+meta-valid",
             "1.0.0-alpha", "1.0.0-beta", "1.0.0-alpha.beta", "1.0.0-alpha.beta.1", "1.0.0-alpha.1",
             "1.0.0-alpha0.valid", "1.0.0-alpha.0valid", "1.0.0-alpha-a.b-c-somethinglong+build.1-aef.1-its-okay",
             "1.0.0-rc.1+build.1", "2.0.0-rc.1+build.123", "1.2.3-beta", "10.2.3-DEV-SNAPSHOT",
             "1.2.3-SNAPSHOT-123", "2.0.0+build.1848", "2.0.1-alpha.1227", "1.0.0-alpha+beta",
             "1.2.3----RC-SNAPSHOT.12.9.1--.12+788", "1.2.3----R-S.12.9.1--.12+meta", "1.2.3----RC-SNAPSHOT.12.9.1--.12",
             "1.0.0+0.build.1-rc.10000aaa-kk-0.1", "99999999999999999999999.999999999999999999.99999999999999999",
             "1.0.0-0A.is.legal", "1.0.0+001"]
    invalid = ["1", "1.2", "1.2.3-0123", "1.2.3-0123.0123", "1.1.2+.123", "+invalid", "-invalid",
               "-invalid+invalid", "-invalid.01", "alpha", "alpha.beta", "alpha.beta.1", "alpha.1", "alpha+beta",
               "alpha_beta", "alpha.", "alpha..", "beta", "1.0.0-alpha_beta", "-alpha.", "1.0.0-alpha..",
               "1.0.0-alpha..1", "1.0.0-alpha...1", "1.0.0-alpha....1", "1.0.0-alpha.....1", "1.0.0-alpha......1",
               "1.0.0-alpha.......1", "01.1.1", "1.01.1", "1.1.01", "1.2", "1.2.3.DEV", "1.2-SNAPSHOT",
               "1.2.31.2.3----RC-SNAPSHOT.12.09.1--..12+788", "1.2-RC-SNAPSHOT", "-1.0.3-gamma+b7718",
               "+justmeta", "9.8.7+meta+meta", "9.8.7-whatever+meta+meta",
               "99999999999999999999999.999999999999999999.99999999999999999----RC-SNAPSHOT.12.09.1--------------------------------..12",
               "", " 1.2.3", "1.2.3 ", "v1.2.3", "1.2.3-", "1.2.3+", "1.2.3-a+", "1.2.3-é", "1.2.3\n", "--part"]
    for v in valid:
        check(SEMVER_RE.match(v) is not None, "test data: %r should be valid" % v)
        r = call("semver", ["compare", v, "1.0.0"])
        check(r is not None and r["order"] == sv_cmp(v, "1.0.0"), "semver valid %r: %r" % (v, r))
    for v in invalid:
        check(SEMVER_RE.match(v) is None, "test data: %r should be invalid" % v)
        err = call("semver", ["compare", "1.0.0", v], expect_code=3)
        check(err.startswith("semver: invalid-version: b "), "semver invalid %r names b: %r" % (v, err))
        err = call("semver", ["compare", v, "1.0.0"], expect_code=3)
        check(err.startswith("semver: invalid-version: a "), "semver invalid %r names a: %r" % (v, err))
        err = call("semver", ["bump", v, "--part", "patch"], expect_code=3)
        check(err.startswith("semver: invalid-version: version "), "semver bump invalid %r: %r" % (v, err))
    # all pairs of the valid list against a reference comparison
    for a in valid:
        for b in valid[::3]:
            r = call("semver", ["compare", a, b])
            check(r["order"] == sv_cmp(a, b), "semver compare %s %s: %r want %d" % (a, b, r, sv_cmp(a, b)))

    for v, part, want in (("1.4.2", "patch", "1.4.3"), ("1.4.2", "minor", "1.5.0"), ("1.4.2", "major", "2.0.0"),
                          ("1.5.0-rc.1+b.7", "patch", "1.5.1"), ("0.9.9", "minor", "0.10.0"),
                          ("9.99.999", "patch", "9.99.1000"), ("99.0.0", "major", "100.0.0"),
                          ("0.0.0", "patch", "0.0.1"), ("18446744073709551615.0.0", "major", "18446744073709551616.0.0")):
        r = call("semver", ["bump", v, "--part", part])
        check(r == {"version": want}, "semver bump %s %s: %r" % (v, part, r))
    r = call("semver", ["bump", "1.2.3"])
    check(r == {"version": "1.2.4"}, "semver bump default: %r" % r)
    for bad in (["bump", "1.2.3", "--part", "build"], ["bump", "1.2.3", "--part"], ["bump"],
                ["compare", "1.0.0"], ["compare", "1.0.0", "1.0.0", "1.0.0"], ["bump", "1.2.3", "extra"],
                ["frobnicate"], []):
        call("semver", bad, expect_code=2)


# ----------------------------------------------------------------------- uuid

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\Z")


def test_uuid():
    import datetime
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    r = call("uuid", ["generate", "--count", "1"])
    check(len(r["uuids"]) == 1 and UUID_RE.match(r["uuids"][0]), "uuid one: %r" % r)
    check(TIME_RE.match(r["generatedAt"]) is not None, "uuid time format: %r" % r)
    t = datetime.datetime.strptime(r["generatedAt"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    check(before - datetime.timedelta(seconds=1) <= t <= datetime.datetime.now(datetime.timezone.utc),
          "uuid time plausible: %r" % r)
    r = call("uuid", ["generate", "--count", "100", "--uppercase"])
    check(len(r["uuids"]) == 100 and all(UUID_RE.match(u.lower()) and u == u.upper() for u in r["uuids"]),
          "uuid 100 upper: %r" % r)
    check(len(set(r["uuids"])) == 100, "uuid unique")
    r = call("uuid", ["generate"])
    check(len(r["uuids"]) == 1, "uuid default count: %r" % r)
    for bad in (["generate", "--count", "0"], ["generate", "--count", "101"], ["generate", "--count", "-5"],
                ["generate", "--count", "4294967297"], ["generate", "--count"], ["generate", "x"], ["gen"], []):
        call("uuid", bad, expect_code=1)


# ---------------------------------------------------------------------- fetch

def fetch_server():
    """A local HTTP server for fetch; returns (server, base URL, list of
    (path, request headers) it received)."""
    import http.server
    import threading
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, status, body=b"", headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            p = self.path
            if p == "/hello":
                self.reply(200, b"hello \xc3\xa9 \"world\"\n", [("Content-Type", "text/plain; charset=utf-8"),
                                                        ("X-Multi", "a"), ("X-Multi", "b")])
            elif p == "/invalid":
                self.reply(200, b"a\xffb\xe2\x82c\xed\xa0\x80\x01")
            elif p == "/big":
                self.reply(200, "é".encode() * 50000)
            elif p.startswith("/hop/"):
                n = int(p[5:])
                if n == 0:
                    self.reply(200, b"landed")
                else:
                    self.reply(302, b"", [("Location", "/hop/%d" % (n - 1))])
            elif p == "/relative/a/b":
                self.reply(301, b"", [("Location", "../c/./d?x=1#frag")])
            elif p == "/cross":
                self.reply(307, b"", [("Location", "http://localhost:%d/hello" % port)])
            elif p == "/missing":
                self.reply(404, b"no such page")
            else:
                self.reply(200, ("path=" + p).encode())

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            # fetch stops reading a truncated body and drops the connection
            if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
                super().handle_error(request, client_address)

    srv = Server(("127.0.0.1", 0), Handler)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, "http://127.0.0.1:%d" % port, seen


def test_fetch():
    import socket
    srv, base, seen = fetch_server()
    try:
        r = call("fetch", ["get", base + "/hello", "--max-bytes", "20000", "--header", "X-Token: abc ",
                           "--header", "Accept: text/plain"])
        check(r["url"] == base + "/hello" and r["status"] == 200 and r["truncated"] is False, "fetch hello: %r" % r)
        check(r["body"] == 'hello é "world"\n', "fetch hello body: %r" % r["body"])
        check(r["headers"].get("content-type") == "text/plain; charset=utf-8" and r["headers"].get("x-multi") == "a, b"
              and r["headers"].get("content-length") == "17", "fetch hello headers: %r" % r["headers"])
        path, hdrs = seen[-1]
        check(path == "/hello" and hdrs.get("x-token") == "abc" and hdrs.get("accept") == "text/plain"
              and hdrs.get("user-agent") == "toolgrid-fetch/1.0", "fetch request headers: %r" % hdrs)
        call("fetch", ["get", base + "/ua", "--max-bytes", "20000", "--header", "User-Agent: me/2"])
        check(seen[-1][1].get("user-agent") == "me/2", "fetch custom user-agent: %r" % seen[-1][1])
        r = call("fetch", ["get", base + "/q?a=1&b=%20#frag", "--max-bytes", "20000"])
        check(r["body"] == "path=/q?a=1&b=%20" and seen[-1][0] == "/q?a=1&b=%20", "fetch query: %r" % r)
        r = call("fetch", ["get", base, "--max-bytes", "20000"])
        check(r["body"] == "path=/", "fetch empty path: %r" % r)

        # lossy UTF-8 (one U+FFFD per maximal invalid subpart) and truncation
        r = call("fetch", ["get", base + "/invalid", "--max-bytes", "20000"])
        check(r["body"] == "a\ufffdb\ufffdc\ufffd\ufffd\ufffd\x01", "fetch invalid utf-8: %r" % r["body"])
        r = call("fetch", ["get", base + "/big", "--max-bytes", "5"])
        check(r["body"] == "éé" and r["truncated"] is True, "fetch cut at a character: %r" % r)
        r = call("fetch", ["get", base + "/big", "--max-bytes", "100000"])
        check(r["body"] == "é" * 50000 and r["truncated"] is False, "fetch exact size: %r" % r["truncated"])
        r = call("fetch", ["get", base + "/big", "--max-bytes", "99999"])
        check(r["body"] == "é" * 49999 and r["truncated"] is True, "fetch one byte short: %r" % r["truncated"])
        r = call("fetch", ["get", base + "/big", "--max-bytes", "10485760"])
        check(len(r["body"]) == 50000 and r["truncated"] is False, "fetch max limit")

        # statuses and redirects
        r = call("fetch", ["get", base + "/missing", "--max-bytes", "20000"])
        check(r["status"] == 404 and r["body"] == "no such page", "fetch 404: %r" % r)
        r = call("fetch", ["get", base + "/hop/2", "--max-bytes", "20000"])
        check(r["status"] == 302 and r["headers"].get("location") == "/hop/1" and r["url"] == base + "/hop/2",
              "fetch redirect not followed: %r" % r)
        r = call("fetch", ["get", base + "/hop/5", "--max-bytes", "20000", "--follow-redirects"])
        check(r["status"] == 200 and r["body"] == "landed" and r["url"] == base + "/hop/0", "fetch 5 hops: %r" % r)
        r = call("fetch", ["get", base + "/hop/6", "--max-bytes", "20000", "--follow-redirects"])
        check(r["status"] == 302 and r["url"] == base + "/hop/1", "fetch 6 hops: %r" % r)
        r = call("fetch", ["get", base + "/relative/a/b", "--max-bytes", "20000", "--follow-redirects"])
        check(r["url"] == base + "/relative/c/d?x=1" and r["body"] == "path=/relative/c/d?x=1", "fetch relative: %r" % r)
        n = len(seen)
        r = call("fetch", ["get", base + "/cross", "--max-bytes", "20000", "--follow-redirects",
                           "--header", "Authorization: Bearer secret"])
        if r is not None:
            check(r["url"] == base.replace("127.0.0.1", "localhost") + "/hello" and r["status"] == 200,
                  "fetch cross-origin redirect: %r" % r)
            check("authorization" in seen[n][1] and "authorization" not in seen[n + 1][1]
                  and seen[n + 1][1].get("user-agent") == "toolgrid-fetch/1.0",
                  "fetch drops --header on another origin: %r" % seen[n:])

        # failures: one line on stderr naming the declared error; exit 1 when no response
        # came, 2 for an argument HTTP does not take (through wasi:cli/exit exit-with-code:
        # the preview 1 adapter alone could only report 1)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d/" % s.getsockname()[1]
        s.close()
        err = call("fetch", ["get", dead, "--max-bytes", "20000"], expect_code=1)
        check("request-failed" in err and "connection-refused" in err, "fetch refused: %r" % err)
        for bad in (["get", "ftp://example.com/", "--max-bytes", "20000"], ["get", "http://", "--max-bytes", "1"],
                    ["get", "http://user@example.com/"], ["get", base, "--header", "NoColon"],
                    ["get", base, "--header", "Bad Name: x"], ["get", base, "--header", "Host: example.com"],
                    ["get", base, "--max-bytes", "0"], ["get", base, "--max-bytes", "10485761"],
                    ["get", base, "--max-bytes"], ["get"], ["get", base, base], ["post", base], []):
            err = call("fetch", bad, expect_code=2)
            check(err.startswith("fetch: invalid-argument: "), "fetch %r: %r" % (bad, err))
    finally:
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    for name, fn in (("textstats", test_textstats), ("semver", test_semver), ("uuid", test_uuid),
                     ("fetch", test_fetch)):
        before = failures
        fn()
        print("%-10s %s" % (name, "ok" if failures == before else "FAILED"))
    print("%d checks, %d failures" % (checks, failures))
    sys.exit(1 if failures else 0)

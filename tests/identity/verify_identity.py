#!/usr/bin/env python3
"""Verifies toolgrid identity tokens the way an upstream would, with an independent JWT
library (PyJWT with cryptography), against a JWKS toolgrid published.

Usage: verify_identity.py DIR. DIR/cases.json is

    {"issuer": "http://127.0.0.1:PORT",
     "tamper": "NAME",            # an "ok" case whose token is also checked with a changed payload
     "cases": [{"name": ..., "jwks": "FILE in DIR", "token": ..., "audience": ...,
                "expect": "ok" | "ExpiredSignatureError" | "InvalidAudienceError"
                          | "InvalidSignatureError" | "unknown-kid",
                "claims": {...}}]}   # for "ok": claims the verified token must carry

Prints one line per check and exits 1 when any fails; exits 77 when PyJWT or cryptography
is missing.
"""

import base64
import json
import sys
from pathlib import Path

try:
    import cryptography  # noqa: F401  (PyJWT's EdDSA needs it)
    import jwt
except ImportError as error:  # pragma: no cover
    print(f"python3 module missing: {error.name} (pip install pyjwt cryptography)", file=sys.stderr)
    sys.exit(77)

CLAIMS = ["iss", "aud", "sub", "tenant", "tool", "call", "iat", "exp", "jti"]


def verify(token, jwks, audience, issuer):
    """What an upstream does: the key named by the token's kid, then PyJWT's checks."""
    kid = jwt.get_unverified_header(token).get("kid")
    keys = [k for k in jwks["keys"] if k.get("kid") == kid]
    if not keys:
        raise LookupError(f"no key {kid!r} in the JWKS")
    key = jwt.PyJWK(keys[0])
    return jwt.decode(
        token,
        key.key,
        algorithms=["EdDSA"],
        audience=audience,
        issuer=issuer,
        options={"require": ["exp", "iat", "iss", "aud", "sub", "jti"]},
    )


def outcome(token, jwks, audience, issuer):
    try:
        return "ok", verify(token, jwks, audience, issuer)
    except LookupError as error:
        return "unknown-kid", str(error)
    except jwt.PyJWTError as error:
        return type(error).__name__, str(error)


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def main():
    folder = Path(sys.argv[1])
    spec = json.loads((folder / "cases.json").read_text())
    issuer = spec["issuer"]
    failures = 0

    def report(ok, name, detail):
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    cases = {case["name"]: case for case in spec["cases"]}
    for case in spec["cases"]:
        jwks = json.loads((folder / case["jwks"]).read_text())
        got, detail = outcome(case["token"], jwks, case["audience"], issuer)
        if got != case["expect"]:
            report(False, case["name"], f"expected {case['expect']}, got {got}: {detail}")
            continue
        if got == "ok":
            header = jwt.get_unverified_header(case["token"])
            problems = []
            if header != {"alg": "EdDSA", "typ": "JWT", "kid": header.get("kid")}:
                problems.append(f"header {header}")
            if sorted(detail) != sorted(CLAIMS):
                problems.append(f"claims {sorted(detail)}")
            if detail.get("exp", 0) - detail.get("iat", 0) != 120:
                problems.append("lifetime is not 120 s")
            for claim, value in case.get("claims", {}).items():
                if detail.get(claim) != value:
                    problems.append(f"{claim}={detail.get(claim)!r}, expected {value!r}")
            summary = "; ".join(problems) or f"verified, sub={detail['sub']}"
            report(not problems, case["name"], summary)
        else:
            report(True, case["name"], f"refused: {got}: {detail}")

    # The same token with one claim changed and its signature kept.
    case = cases[spec["tamper"]]
    header, payload, signature = case["token"].split(".")
    claims = json.loads(unb64(payload))
    claims["sub"] = claims["tenant"] + "/someone-else"
    forged = ".".join([header, b64(json.dumps(claims).encode()), signature])
    jwks = json.loads((folder / case["jwks"]).read_text())
    got, detail = outcome(forged, jwks, case["audience"], issuer)
    report(got == "InvalidSignatureError", "tampered-payload",
           f"refused: {got}: {detail}" if got != "ok" else "ACCEPTED a changed payload")

    print(f"{failures} check(s) failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drives the Python clients `toolgrid gen client --lang python` wrote, against a live
platform (tests/gen_client.rs starts it).

Usage: python_client_test.py ADMIN_DIR AGENT_DIR
Environment: TOOLGRID_URL, ADMIN_TOKEN, AGENT_TOKEN, WORK (a scratch directory).
Prints `ok: ...` per check; any failure raises (exit 1).
"""

import importlib
import inspect
import os
import sys
import typing

admin_dir, agent_dir = sys.argv[1], sys.argv[2]
url = os.environ["TOOLGRID_URL"]
admin = os.environ["ADMIN_TOKEN"]
agent = os.environ["AGENT_TOKEN"]
work = os.environ["WORK"]


def load(directory, module):
    sys.path.insert(0, directory)
    try:
        for name in list(sys.modules):
            if name == module:
                del sys.modules[name]
        return importlib.import_module(module)
    finally:
        sys.path.pop(0)


def expect_raises(cls, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except cls as error:
        return error
    raise AssertionError(f"{fn.__name__} did not raise {cls.__name__}")


# The example tools, through the operator's client.
semver = load(admin_dir, "semver")
client = semver.SemverClient(base_url=url, token=admin)
result = client.compare("1.2.0", "1.10.0")
assert result == {"order": -1, "a": "1.2.0", "b": "1.10.0"}, result
print("ok: semver.compare")
assert client.bump("1.4.2")["version"] == "1.4.3"
assert client.bump("1.4.2", part="minor")["version"] == "1.5.0"
print("ok: semver.bump with and without an option")

# A declared error is its typed exception, under the tool's base error class.
error = expect_raises(semver.InvalidVersionError, client.compare, "1.2", "1.0.0")
assert isinstance(error, semver.SemverError) and isinstance(error, semver.ToolgridError)
assert error.kind == "tool-error" and error.error_name == "invalid-version", vars(error)
assert error.call and error.call["state"] == "failed"
print("ok: invalid-version is InvalidVersionError")

# A refusal before the tool runs is a ToolgridError with its kind.
error = expect_raises(semver.ToolgridError, client.bump, "1.0.0", part="huge")
assert error.kind == "invalid-argument" and not isinstance(error, semver.SemverError), vars(error)
print("ok: an invalid option is invalid-argument")

# The signature follows the definition: positionals, then keyword-only options.
sig = inspect.signature(semver.SemverClient.bump)
assert list(sig.parameters) == ["self", "version", "part", "idempotency_key"], sig
assert sig.parameters["part"].kind is inspect.Parameter.KEYWORD_ONLY
assert "Literal" in str(sig.parameters["part"].annotation)
assert typing.get_type_hints(semver.CompareResult)["order"] is not None

# stdin, options and flags.
textstats = load(admin_dir, "textstats")
stats = textstats.TextstatsClient(base_url=url, token=admin).count(
    top=1, ignore_case=True, stdin="The cat saw the dog.\nthe end\n"
)
assert stats["lines"] == 2 and stats["words"] == 7, stats
assert stats["top"] == [{"word": "the", "count": 3}], stats
print("ok: textstats.count with stdin, an option and a flag")

uuid = load(admin_dir, "uuid")
ids = uuid.UuidClient(base_url=url, token=admin).generate(count=2)
assert len(ids["uuids"]) == 2, ids
print("ok: uuid.generate")

# An idempotency key returns the same call.
first = client.compare("1.0.0", "2.0.0", idempotency_key="py-key-1")
again = client.compare("1.0.0", "2.0.0", idempotency_key="py-key-1")
assert first == again
print("ok: idempotency key")

# Without a token: unauthenticated.
error = expect_raises(semver.ToolgridError, semver.SemverClient(base_url=url, token="").compare, "1.0.0", "2.0.0")
assert error.kind == "unauthenticated" and error.status == 401, vars(error)
print("ok: no token is unauthenticated (401)")

# The agent's client holds only its bound tools and commands.
assert sorted(f for f in os.listdir(agent_dir) if f.endswith(".py")) == ["platform_signing_keys.py", "semver.py", "textstats.py"], os.listdir(agent_dir)
agent_semver = load(agent_dir, "semver")
assert hasattr(agent_semver.SemverClient, "compare") and not hasattr(agent_semver.SemverClient, "bump")
os.environ["TOOLGRID_URL"] = url
os.environ["TOOLGRID_TOKEN"] = agent
mine = agent_semver.SemverClient()  # base URL and token from the environment
assert mine.compare("1.2.0", "1.10.0")["order"] == -1
error = expect_raises(agent_semver.InvalidVersionError, mine.compare, "1.2", "1.0.0")
print("ok: the agent's client calls its tool, declared errors included")
# The agent's middleware refuses comparing a version with itself: denied.
error = expect_raises(agent_semver.ToolgridError, mine.compare, "1.0.0", "1.0.0")
assert error.kind == "denied", vars(error)
# The operator's client with the agent's token: a command it is not bound to is refused.
error = expect_raises(semver.ToolgridError, semver.SemverClient(token=agent).bump, "1.0.0")
assert error.kind in ("permission-denied", "unknown-command", "unknown-tool"), vars(error)
print(f"ok: an unbound command is refused ({error.kind})")

# The hostile tool's client imports cleanly, ran nothing, and kept every name usable.
hostile = load(admin_dir, "hostile_edge_case_tool_with_a_rather_long_name")
cls = hostile.HostileEdgeCaseToolWithARatherLongNameClient
method = cls.command_with_a_long_name_too
params = inspect.signature(method).parameters
assert list(params)[:3] == ["self", "class_", "_2fa"], list(params)
for name in ("self_", "max_bytes", "mode", "nested", "tags", "verbose", "import_", "stdin", "idempotency_key"):
    assert name in params, (name, list(params))
assert hostile.ToolgridError_ is not hostile.ToolgridError
assert issubclass(hostile.ToolgridError_, hostile.HostileEdgeCaseToolWithARatherLongNameError)
assert hostile.InvalidVersionError.ERROR_NAME == "invalid-version"
assert "raise SystemExit(7)" in method.__doc__ and "os._exit(7)" in hostile.__doc__
assert hasattr(cls, "free_form")
print("ok: the hostile tool's client is inert and well-formed")
print("all python client checks passed")

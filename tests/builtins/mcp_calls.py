"""Calls tools through toolgrid's /mcp with the official Python SDK (PyPI `mcp` 2.x).

    python3 tests/builtins/mcp_calls.py URL TOKEN CALLS.json

CALLS.json is a list of [tool, arguments]. Prints one JSON line first with the tools the
agent sees ({"tools": [...]}), then one per call, in order: {"tool", "isError",
"structured", "text", "error"} where "error" is toolgrid's `toolgrid.dev/error` meta of a
failed call (its declared error's name and kind).
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main(url, token, calls):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as c:
        tools = (await c.list_tools()).tools
        print(json.dumps({"tools": sorted(t.name for t in tools)}), flush=True)
        for name, arguments in calls:
            result = await c.call_tool(name, arguments)
            text = result.content[0].text if result.content else ""
            print(json.dumps({
                "tool": name,
                "isError": bool(result.is_error),
                "structured": result.structured_content,
                "text": text,
                "error": (result.meta or {}).get("toolgrid.dev/error"),
            }), flush=True)


if __name__ == "__main__":
    with open(sys.argv[3]) as f:
        asyncio.run(main(sys.argv[1], sys.argv[2], json.load(f)))

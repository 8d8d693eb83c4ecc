"""A real MCP client for the tests of `sqlbee mcp`: the protocol's own
Python SDK starts the binary, negotiates (it probes the newest revision
first, then falls back to the initialize handshake), lists the tools and
makes the calls it is given. It prints one JSON report; the Rust test
judges it.

usage: mcp_client.py SQLBEE COLLECTOR_URL TOKEN_FILE CALLS_JSON
CALLS_JSON: [[tool, arguments], ...]
"""

import asyncio
import json
import os
import sys

from mcp import Client, MCPError, StdioServerParameters


def result_of(result):
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    return {
        "is_error": bool(result.is_error),
        "text": texts[0] if texts else None,
        "structured": result.structured_content,
    }


async def main():
    sqlbee, url, token_file, calls = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    server = StdioServerParameters(
        command=sqlbee,
        args=["mcp", "--collector", url, "--token-file", token_file],
        env={"PATH": os.environ.get("PATH", ""), "SQLBEE_LOG": "warn"},
    )
    report = {"calls": []}
    async with Client(server, read_timeout_seconds=60) as client:
        report["protocol_version"] = client.protocol_version
        listed = await client.list_tools()
        report["tools"] = [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]
        for tool, arguments in calls:
            try:
                answer = result_of(await client.call_tool(tool, arguments))
            except MCPError as e:
                answer = {"protocol_error": {"code": e.error.code, "message": e.error.message}}
            report["calls"].append({"tool": tool, "arguments": arguments, **answer})
    print(json.dumps(report))


asyncio.run(main())

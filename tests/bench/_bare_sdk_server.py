"""The floor of bench_light_calls: the SDK's own server with one echo tool, nothing of ours.

python tests/bench/_bare_sdk_server.py PORT
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("bare")


@server.tool()
async def echo(text: str = "") -> str:
    return text


if __name__ == "__main__":
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

// The host side of MCP Apps, as the browser test's host page loads it: the ext-apps
// SDK's AppBridge and its postMessage transport, bundled by install.sh into
// node_modules/.bundle/host-bridge.js (one file: the page loads nothing else).
export { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

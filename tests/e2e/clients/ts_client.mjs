#!/usr/bin/env node
// A real MCP client built on the official TypeScript SDK, against a running sandbox-mcp.
//
//   node ts_client.mjs --sdk v1|v2 --era 2025-11-25|2026-07-28 --url http://127.0.0.1:PORT/mcp
//
// v1 is @modelcontextprotocol/sdk (legacy era only: it has no 2026-07-28 support);
// v2 is @modelcontextprotocol/client, which speaks both eras (`versionNegotiation`).
// When the server asks for a token, the SDK registers a client (RFC 7591), starts
// code + PKCE and calls redirectToAuthorization(url); this script then plays the
// browser: it loads the sign-in page, presses "Create my sandbox" by POSTing the
// page's form (hidden fields and cookie included), follows the 303 to its own
// loopback callback server, and hands the code to transport.finishAuth().
// Then it lists the tools, calls sandbox_status, create_experiment and
// execute_experiment (`echo hi`), and prints one JSON document on stdout,
// including every HTTP request the SDK sent (through its `fetch` option).
import http from 'node:http';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    sdk: { type: 'string' },
    era: { type: 'string' },
    url: { type: 'string' },
  },
});
if (!['v1', 'v2'].includes(args.sdk) || !args.era || !args.url) {
  console.error('usage: ts_client.mjs --sdk v1|v2 --era 2025-11-25|2026-07-28 --url URL');
  process.exit(2);
}
const LEGACY = '2025-11-25';

async function loadSdk(which) {
  if (which === 'v1') {
    const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
    const { StreamableHTTPClientTransport } = await import(
      '@modelcontextprotocol/sdk/client/streamableHttp.js'
    );
    const { UnauthorizedError } = await import('@modelcontextprotocol/sdk/client/auth.js');
    const { version } = await readPackage('@modelcontextprotocol/sdk');
    return { Client, StreamableHTTPClientTransport, UnauthorizedError, name: '@modelcontextprotocol/sdk', version };
  }
  const sdk = await import('@modelcontextprotocol/client');
  const { version } = await readPackage('@modelcontextprotocol/client');
  return { ...sdk, name: '@modelcontextprotocol/client', version };
}

// The version actually installed next to this script (node_modules/NAME/package.json).
async function readPackage(name) {
  const { readFile } = await import('node:fs/promises');
  const path = new URL(`./node_modules/${name}/package.json`, import.meta.url);
  return JSON.parse(await readFile(path, 'utf8'));
}

// Every request the SDK sends, as the server sees it: method, path, the MCP headers,
// whether a token went along, and the JSON-RPC method and protocol version in the body.
const requests = [];
async function recordingFetch(input, init = {}) {
  const url = new URL(input instanceof Request ? input.url : String(input));
  const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
  const entry = {
    method: init.method ?? (input instanceof Request ? input.method : 'GET'),
    path: url.pathname,
    mcp_protocol_version: headers.get('mcp-protocol-version'),
    mcp_method: headers.get('mcp-method'),
    mcp_name: headers.get('mcp-name'),
    mcp_session_id: headers.get('mcp-session-id'),
    authorization: headers.has('authorization'),
  };
  if (typeof init.body === 'string' && url.pathname.endsWith('/mcp')) {
    try {
      const body = JSON.parse(init.body);
      entry.rpc_method = body.method ?? null;
      entry.body_protocol_version =
        body.params?._meta?.['io.modelcontextprotocol/protocolVersion'] ??
        body.params?.protocolVersion ??
        null;
    } catch {
      entry.rpc_method = 'unparsable';
    }
  }
  const response = await fetch(input, init);
  entry.status = response.status;
  requests.push(entry);
  return response;
}

// The loopback redirect URI: a one-shot callback server, as a CLI client runs.
function startCallbackServer() {
  let deliver;
  const received = new Promise((resolve) => (deliver = resolve));
  const server = http.createServer((req, res) => {
    const query = new URL(req.url, 'http://127.0.0.1').searchParams;
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('Signed in; you can close this window.');
    deliver(query);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve({ server, port: server.address().port, received })),
  );
}

function unescapeHtml(text) {
  return text
    .replaceAll('&quot;', '"')
    .replaceAll('&#x27;', "'")
    .replaceAll('&lt;', '<')
    .replaceAll('&gt;', '>')
    .replaceAll('&amp;', '&');
}

// What a person's browser does with the sign-in page: load it, press the one button.
const signin = { pages: 0, button: false, redirect: null };
async function pressTheButton(authorizationUrl) {
  const page = await fetch(authorizationUrl, { redirect: 'manual' });
  if (page.status !== 200) throw new Error(`the sign-in page answered ${page.status}`);
  const html = await page.text();
  signin.pages += 1;
  signin.button = html.includes('Create my sandbox');
  const form = html.match(/<form method="post" action="([^"]*)">([\s\S]*?)<\/form>/);
  if (!form) throw new Error('no sign-in form on the page');
  const fields = new URLSearchParams();
  for (const input of form[2].matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) {
    fields.set(input[1], unescapeHtml(input[2]));
  }
  const cookie = page.headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  const action = new URL(unescapeHtml(form[1]), authorizationUrl);
  const pressed = await fetch(action, {
    method: 'POST',
    body: fields,
    headers: { cookie, origin: action.origin },
    redirect: 'manual',
  });
  if (pressed.status !== 303) {
    throw new Error(`pressing the button answered ${pressed.status}: ${await pressed.text()}`);
  }
  const location = new URL(pressed.headers.get('location'), action);
  signin.redirect = `${location.origin}${location.pathname}`;
  const landed = await fetch(location); // the browser lands on our callback server
  if (landed.status !== 200) throw new Error(`the callback answered ${landed.status}`);
}

class MemoryProvider {
  constructor(redirectUrl) {
    this._redirectUrl = redirectUrl;
    this._client = undefined;
    this._tokens = undefined;
    this._verifier = undefined;
  }
  get redirectUrl() {
    return this._redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: 'sandbox-mcp TypeScript SDK test',
      redirect_uris: [this._redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  clientInformation() {
    return this._client;
  }
  saveClientInformation(info) {
    this._client = info;
  }
  tokens() {
    return this._tokens;
  }
  saveTokens(tokens) {
    this._tokens = tokens;
  }
  async redirectToAuthorization(url) {
    this.authorizationUrl = url;
    await pressTheButton(url.href);
  }
  saveCodeVerifier(verifier) {
    this._verifier = verifier;
  }
  // v2 keeps what it discovered across the redirect, to check that the code comes back
  // from the same authorization server (SEP-2352); v1 never calls these.
  saveDiscoveryState(state) {
    this._discovery = state;
  }
  discoveryState() {
    return this._discovery;
  }
  codeVerifier() {
    if (!this._verifier) throw new Error('no code verifier saved');
    return this._verifier;
  }
}

function clientOptions(sdk) {
  if (sdk.name === '@modelcontextprotocol/sdk') {
    if (args.era !== LEGACY) throw new Error(`${sdk.name} speaks only the legacy era, not ${args.era}`);
    return {};
  }
  return { versionNegotiation: { mode: args.era === LEGACY ? 'legacy' : { pin: args.era } } };
}

async function main() {
  const sdk = await loadSdk(args.sdk);
  const callback = await startCallbackServer();
  const redirectUrl = `http://127.0.0.1:${callback.port}/callback`;
  const provider = new MemoryProvider(redirectUrl);
  const url = new URL(args.url);
  const newTransport = () =>
    new sdk.StreamableHTTPClientTransport(url, { authProvider: provider, fetch: recordingFetch });
  const newClient = () =>
    new sdk.Client({ name: 'sandbox-mcp-ts-test', version: '1.0.0' }, clientOptions(sdk));

  let client = newClient();
  let transport = newTransport();
  let signedIn = false;
  try {
    await client.connect(transport);
  } catch (error) {
    if (!(error instanceof sdk.UnauthorizedError)) throw error;
    const query = await callback.received;
    if (query.get('error')) throw new Error(`sign-in failed: ${query.get('error')}`);
    // v2 takes the whole callback query (it checks `iss`, RFC 9207); v1 the code.
    await (args.sdk === 'v2' ? transport.finishAuth(query) : transport.finishAuth(query.get('code')));
    signedIn = true;
    client = newClient();
    transport = newTransport();
    await client.connect(transport);
  } finally {
    callback.server.close();
  }

  const negotiated =
    typeof client.getNegotiatedProtocolVersion === 'function'
      ? client.getNegotiatedProtocolVersion()
      : transport.protocolVersion;
  const tools = await client.listTools();
  const call = async (name, toolArgs = {}) => {
    const result = await client.callTool({ name, arguments: toolArgs });
    return { is_error: result.isError ?? false, structured: result.structuredContent ?? null };
  };
  const status = await call('sandbox_status');
  const created = await call('create_experiment', { name: 'ts-sdk' });
  const experimentId = created.structured?.experiment_id;
  const executed = experimentId
    ? await call('execute_experiment', { experiment_id: experimentId, command: 'echo hi' })
    : null;
  await client.close();

  console.log(
    JSON.stringify({
      sdk: sdk.name,
      sdk_version: sdk.version,
      era_requested: args.era,
      negotiated_protocol_version: negotiated ?? null,
      signed_in: signedIn,
      signin: { ...signin, redirect_uri: redirectUrl },
      tools: tools.tools.map((tool) => tool.name),
      sandbox_status: status,
      create_experiment: created,
      execute_experiment: executed,
      requests,
    }),
  );
}

main().catch((error) => {
  console.error(error?.stack ?? String(error));
  console.error(JSON.stringify({ requests }));
  process.exit(1);
});

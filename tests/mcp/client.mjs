// Drives toolgrid's /mcp with an official TypeScript client, one era per run:
//
//   node tests/mcp/client.mjs --sdk v1 --mode legacy --plan PLAN.json   (@modelcontextprotocol/sdk 1.x)
//   node tests/mcp/client.mjs --sdk v2 --mode legacy|auto --plan PLAN.json  (@modelcontextprotocol/client 2.x)
//
// The same checks as tests/mcp/client.py: one JSON line per check, a final {"summary"},
// exit 1 when one failed. Schemas are checked with ajv's JSON Schema 2020-12 dialect.

import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const { values: opts } = parseArgs({
  options: { sdk: { type: 'string' }, mode: { type: 'string' }, plan: { type: 'string' } },
});
// Each `{tag}` in the plan's strings becomes this run's own, so no run repeats another's
// call (the agent would be refused `repeated-call`).
const plan = JSON.parse(readFileSync(opts.plan, 'utf8').replaceAll('{tag}', `js-${opts.sdk}-${opts.mode}`.replace(/[^0-9A-Za-z-]/g, '-')));
const results = [];
const check = (name, ok, detail) => {
  results.push({ check: name, ok: !!ok, detail });
  console.log(JSON.stringify(results.at(-1)));
};

const HINTS = {
  read: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  idempotent: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  write: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  external: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
};

// The packages installed in tests/js (TOOLGRID_JS_DIR): this script lives outside it.
const require = createRequire(join(process.env.TOOLGRID_JS_DIR, 'package.json'));
let Client, Transport;
if (opts.sdk === 'v1') {
  ({ Client } = require('@modelcontextprotocol/sdk/client/index.js'));
  ({ StreamableHTTPClientTransport: Transport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js'));
} else {
  ({ Client, StreamableHTTPClientTransport: Transport } = require('@modelcontextprotocol/client'));
}
// ajv with the 2020-12 dialect (a dependency of the v1 SDK).
const Ajv2020 = require('ajv/dist/2020').default ?? require('ajv/dist/2020');
const ajv = new Ajv2020({ strict: false, validateFormats: false });

function connect(token) {
  const headers = token ? { Authorization: `Bearer ${plan.token}` } : {};
  const transport = new Transport(new URL(plan.url), { requestInit: { headers } });
  const options = {};
  if (opts.sdk === 'v2') {
    options.versionNegotiation = { mode: opts.mode === 'legacy' ? 'legacy' : opts.mode === 'auto' ? 'auto' : { pin: opts.mode } };
  }
  const client = new Client({ name: `toolgrid-test-${opts.sdk}`, version: '1.0.0' }, options);
  return { client, transport };
}

async function callTool(client, params, options = {}) {
  return opts.sdk === 'v1' ? client.callTool(params, undefined, options) : client.callTool(params, options);
}

async function apiGet(path) {
  const r = await fetch(plan.api + path, { headers: { Authorization: `Bearer ${plan.token}` } });
  return r.json();
}

async function unauthenticated() {
  const r = await fetch(plan.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } } }),
  });
  const challenge = r.headers.get('www-authenticate') ?? '';
  check('401-status', r.status === 401, r.status);
  check('401-challenge', challenge.startsWith('Bearer resource_metadata="'), challenge);
  const url = challenge.split('resource_metadata="')[1]?.split('"')[0];
  const metadata = url ? await (await fetch(url)).json() : {};
  check('metadata-resource', metadata.resource === plan.url, metadata);
  const { client, transport } = connect(false);
  try {
    await client.connect(transport);
    await client.listTools();
    check('sdk-without-token-fails', false, 'connected without a token');
  } catch (e) {
    check('sdk-without-token-fails', true, e?.constructor?.name);
  }
}

async function main() {
  await unauthenticated();
  const { client, transport } = connect(true);
  await client.connect(transport);
  check('era', true, transport.protocolVersion ?? client.getNegotiatedProtocolVersion?.());
  const tools = [];
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : undefined);
    tools.push(...page.tools);
    cursor = page.nextCursor;
  } while (cursor);
  const names = tools.map((t) => t.name).sort();
  check('list-only-bound', JSON.stringify(names) === JSON.stringify(Object.keys(plan.tools).sort()), names);
  for (const tool of tools) {
    const effect = plan.tools[tool.name];
    if (!effect) continue;
    const a = tool.annotations ?? {};
    const got = { readOnlyHint: a.readOnlyHint, destructiveHint: a.destructiveHint, idempotentHint: a.idempotentHint, openWorldHint: a.openWorldHint };
    check(`annotations:${tool.name}`, JSON.stringify(got) === JSON.stringify(HINTS[effect]), got);
    let ok = tool.inputSchema?.type === 'object';
    let detail = null;
    for (const schema of [tool.inputSchema, tool.outputSchema].filter(Boolean)) {
      try {
        ajv.compile(schema);
      } catch (e) {
        ok = false;
        detail = String(e);
      }
    }
    if (tool.outputSchema && tool.outputSchema.type !== 'object') ok = false;
    check(`schemas:${tool.name}`, ok, detail);
  }
  const call = plan.call;
  let result = await callTool(client, { name: call.name, arguments: call.arguments });
  check('call-structured', !result.isError && JSON.stringify(result.structuredContent) === JSON.stringify(call.structured), result.structuredContent);
  check('call-text', JSON.stringify(JSON.parse(result.content[0].text)) === JSON.stringify(call.structured), result.content[0].text);
  const err = plan.declared_error;
  result = await callTool(client, { name: err.name, arguments: err.arguments });
  const meta = result._meta?.['toolgrid.dev/error'] ?? {};
  check('declared-error', result.isError && result.content[0].text.includes(err.error) && meta.name === err.error, { text: result.content[0].text, meta });
  for (const [name, params] of [['invalid-arguments', { name: plan.invalid.name, arguments: plan.invalid.arguments }], ['unbound-tool', { name: plan.unbound, arguments: {} }]]) {
    try {
      result = await callTool(client, params);
      check(name, false, result);
    } catch (e) {
      check(name, e.code === -32602, { code: e.code, message: e.message });
    }
  }
  if (plan.progress) {
    const p = plan.progress;
    const seen = [];
    const args = { ...p.arguments, run: `${p.arguments.run}-${opts.sdk}-${opts.mode}` };
    result = await callTool(client, { name: p.name, arguments: args }, { onprogress: (n) => seen.push(n), timeout: 120000 });
    check('progress-result', !result.isError, result.structuredContent);
    check('progress-notifications', seen.length >= p.min && seen.every((s, i) => s.progress === i + 1 && s.message), seen);
  }
  if (plan.cancel) {
    const p = plan.cancel;
    const run = `${p.arguments.run}-${opts.sdk}-${opts.mode}`;
    const controller = new AbortController();
    let first;
    const progressed = new Promise((resolve) => (first = resolve));
    const pending = callTool(client, { name: p.name, arguments: { ...p.arguments, run } }, { onprogress: () => first(), signal: controller.signal, timeout: 120000 });
    pending.catch(() => {});
    await progressed;
    controller.abort('test cancels');
    await pending.then(() => {}, () => {});
    let ended;
    for (let i = 0; i < 300 && !ended; i++) {
      const { calls } = await apiGet(`/v1/calls?tool=${p.tool}&limit=50`);
      const found = calls.find((c) => JSON.stringify(c.args ?? {}).includes(run));
      if (found && ['succeeded', 'failed'].includes(found.state)) ended = found;
      else await new Promise((r) => setTimeout(r, 200));
    }
    const kind = ended?.error?.kind;
    check('cancelled', ended && ['cancelled', 'outcome-unknown'].includes(kind), { state: ended?.state, kind, id: ended?.id });
    console.log(JSON.stringify({ cancelled_run: run, call: ended?.id }));
  }
  await client.close();
}

try {
  await main();
} catch (e) {
  check('no-exception', false, String(e?.stack ?? e));
}
const failed = results.filter((r) => !r.ok).map((r) => r.check);
console.log(JSON.stringify({ summary: { sdk: opts.sdk, mode: opts.mode, checks: results.length, failed } }));
process.exit(failed.length ? 1 : 0);

// Drives the TypeScript clients `toolgrid gen client --lang typescript` wrote, against a
// live platform (tests/gen_client.rs copies this file next to them as main.ts, compiles
// everything with tsc --strict and runs it with Node 22).
// Environment: TOOLGRID_URL, ADMIN_TOKEN, AGENT_TOKEN. The agent's clients are in ./agent/.
// Prints `ok: ...` per check; any failure throws (exit 1).

import { SemverClient, SemverError, InvalidVersionError, ToolgridError } from "./semver.js";
import type { CompareResult, BumpOptions } from "./semver.js";
import { TextstatsClient } from "./textstats.js";
import { UuidClient } from "./uuid.js";
import * as hostile from "./hostile-edge-case-tool-with-a-rather-long-name.js";
import {
  SemverClient as AgentSemverClient,
  InvalidVersionError as AgentInvalidVersion,
  ToolgridError as AgentToolgridError,
} from "./agent/semver.js";

const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env ?? {};
const url = env["TOOLGRID_URL"]!;
const admin = env["ADMIN_TOKEN"]!;
const agent = env["AGENT_TOKEN"]!;

function assert(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Error("check failed: " + what);
}

async function rejects<E extends Error>(cls: abstract new (...args: never[]) => E, run: () => Promise<unknown>): Promise<E> {
  try {
    await run();
  } catch (error) {
    if (error instanceof cls) return error;
    throw new Error("wrong error: " + String(error));
  }
  throw new Error("did not throw " + cls.name);
}

const semver = new SemverClient({ baseUrl: url, token: admin });
const compared: CompareResult = await semver.compare("1.2.0", "1.10.0");
assert(compared.order === -1 && compared.a === "1.2.0" && compared.b === "1.10.0", JSON.stringify(compared));
console.log("ok: semver.compare");

const minor: BumpOptions = { part: "minor" };
assert((await semver.bump("1.4.2", minor)).version === "1.5.0", "bump minor");
assert((await semver.bump("1.4.2")).version === "1.4.3", "bump default");
console.log("ok: semver.bump with and without an option");

const invalid = await rejects(InvalidVersionError, () => semver.compare("1.2", "1.0.0"));
assert(invalid instanceof SemverError && invalid instanceof ToolgridError, "error classes");
assert(invalid.kind === "tool-error" && invalid.errorName === "invalid-version", invalid.message);
assert(InvalidVersionError.errorName === "invalid-version", "static errorName");
console.log("ok: invalid-version is InvalidVersionError");

const refused = await rejects(ToolgridError, () => semver.bump("1.0.0", { part: "huge" as "major" }));
assert(refused.kind === "invalid-argument" && !(refused instanceof SemverError), refused.message);
console.log("ok: an invalid option is invalid-argument");

const stats = await new TextstatsClient({ baseUrl: url, token: admin }).count({
  top: 1,
  ignoreCase: true,
  stdin: "The cat saw the dog.\nthe end\n",
});
assert(stats.lines === 2 && stats.words === 7, JSON.stringify(stats));
assert(stats.top.length === 1 && stats.top[0]?.word === "the" && stats.top[0]?.count === 3, JSON.stringify(stats.top));
console.log("ok: textstats.count with stdin, an option and a flag");

const ids = await new UuidClient({ baseUrl: url, token: admin }).generate({ count: 2 });
assert(ids.uuids.length === 2, JSON.stringify(ids));
console.log("ok: uuid.generate");

const unauthenticated = await rejects(ToolgridError, () => new SemverClient({ baseUrl: url, token: "" }).compare("1.0.0", "2.0.0"));
assert(unauthenticated.kind === "unauthenticated" && unauthenticated.status === 401, unauthenticated.message);
console.log("ok: no token is unauthenticated (401)");

const mine = new AgentSemverClient({ baseUrl: url, token: agent });
assert((await mine.compare("1.2.0", "1.10.0")).order === -1, "agent compare");
await rejects(AgentInvalidVersion, () => mine.compare("1.2", "1.0.0"));
assert(!("bump" in mine), "the agent's client has no bump");
// Each generated module has its own error classes.
const denied = await rejects(AgentToolgridError, () => mine.compare("1.0.0", "1.0.0"));
assert(denied.kind === "denied", denied.message);
const unbound = await rejects(ToolgridError, () => new SemverClient({ baseUrl: url, token: agent }).bump("1.0.0"));
assert(["permission-denied", "unknown-command", "unknown-tool"].includes(unbound.kind), unbound.message);
console.log(`ok: the agent's client calls its tool; an unbound command is refused (${unbound.kind})`);

// The hostile tool's module loaded (so nothing in it ran) and its names are usable.
const h = new hostile.HostileEdgeCaseToolWithARatherLongNameClient({ baseUrl: url, token: admin });
assert(typeof h.commandWithALongNameToo === "function" && typeof h.freeForm === "function", "hostile methods");
assert(hostile.ToolgridError_ !== hostile.ToolgridError, "the error named toolgrid got its own class");
const options: hostile.CommandWithALongNameTooOptions = {
  self: "x",
  maxBytes: 1,
  mode: "slow\"quote",
  nested: { depth: 1 },
  tags: ["a"],
  verbose: true,
  import: true,
  stdin: { items: ["a"] },
};
assert(options.mode !== "fast", "enum with a quote");
console.log("ok: the hostile tool's client is inert and well-formed");
console.log("all typescript client checks passed");

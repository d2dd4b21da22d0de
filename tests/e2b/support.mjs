// What the E2B tier's test files share: the run's names, generous timeouts (the tier runs
// under emulation, one CPU for serve and every guest), and sandboxes that are killed when
// their test ends, whatever happened in it.
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';

import { Sandbox } from 'e2b';

export const inTesthost = process.env.AGENTVM_IN_TESTHOST === '1';
// Every sandbox of this run carries it in its metadata, so a list can be narrowed to them.
export const runId = process.env.E2B_TIER_RUN ?? `run-${process.pid}`;
export const serveUrl = process.env.E2B_SANDBOX_URL;
export const apiKey = process.env.E2B_API_KEY;

// A whole test's budget, and a single request's (the SDKs' default of 60 s is short for a
// create that restores a VM while others do under emulation).
export const testTimeoutMs = inTesthost ? 600_000 : 120_000;
export const requestTimeoutMs = inTesthost ? 240_000 : 60_000;
export const commandTimeoutMs = inTesthost ? 240_000 : 60_000;

// A sandbox for test `t`, killed when `t` ends. `cls`: Sandbox of e2b or of
// @e2b/code-interpreter; `template` omitted for the class's default.
export async function sandboxFor(t, { cls = Sandbox, template, metadata = {}, ...opts } = {}) {
  const options = {
    requestTimeoutMs,
    timeoutMs: 1_800_000,
    metadata: { tier: 'e2b', run: runId, ...metadata },
    ...opts,
  };
  const sbx = template === undefined ? await cls.create(options) : await cls.create(template, options);
  t.after(() => sbx.kill({ requestTimeoutMs }).catch(() => {}));
  return sbx;
}

// Runs `cmd` in `sbx` and returns its stdout, failing with the whole result when it fails.
export async function sh(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, { timeoutMs: commandTimeoutMs, requestTimeoutMs, ...opts });
  assert.equal(r.exitCode, 0, `${cmd}: ${JSON.stringify(r)}`);
  return r.stdout;
}

// Polls `probe` until it returns a truthy value, then returns that value.
export async function eventually(probe, { withinMs = 60_000, everyMs = 250, what = 'the condition' } = {}) {
  const deadline = Date.now() + withinMs;
  let last;
  for (;;) {
    try {
      last = await probe();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) assert.fail(`${what} did not hold within ${withinMs} ms (last: ${last})`);
    await sleep(everyMs);
  }
}

// `fn` must reject with an instance of `cls`; returns the error for more checks.
export async function rejectsWith(fn, cls, what) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    return e;
  }
  assert.fail(`${what}: expected ${cls.name}, but it succeeded`);
}

// Every page of a paginator, with the size of each.
export async function allPages(paginator) {
  const pages = [];
  while (paginator.hasNext) pages.push(await paginator.nextItems({ requestTimeoutMs }));
  return pages;
}

// The control plane through the official SDK: create, getInfo, setTimeout, isRunning, connect,
// getMetrics, kill, list with its filters and pages, a timeout that ends a sandbox, and the
// keys: a wrong API key, and one sandbox's envd token used on another.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import test, { describe } from 'node:test';

import { AuthenticationError, Sandbox, SandboxNotFoundError } from 'e2b';

import {
  allPages, eventually, rejectsWith, requestTimeoutMs, runId, sandboxFor, sh, testTimeoutMs,
} from './support.mjs';

const wrongKey = `e2b_${'0'.repeat(40)}`;
// Clocks: serve's and this process's are the same machine's; the slack is for a slow create.
const slackMs = 60_000;

function ids(pages) {
  return pages.flat().map((s) => s.sandboxId).sort();
}

describe('lifecycle', () => {
  test('create, getInfo, setTimeout, isRunning, connect, getMetrics, then kill', { timeout: testTimeoutMs }, async (t) => {
    const before = Date.now();
    const sbx = await sandboxFor(t, { metadata: { case: 'info' }, timeoutMs: 300_000 });
    assert.match(sbx.sandboxId, /^[\w-]+$/);

    const info = await sbx.getInfo({ requestTimeoutMs });
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.deepEqual(info.metadata, { tier: 'e2b', run: runId, case: 'info' });
    assert.equal(info.state, 'running');
    assert.ok(info.templateId, 'a templateId');
    assert.ok(info.cpuCount >= 1 && info.memoryMB >= 64, `${info.cpuCount} CPUs, ${info.memoryMB} MiB`);
    assert.match(info.envdVersion, /^\d+\.\d+\.\d+/);
    assert.ok(info.startedAt.getTime() >= before - slackMs && info.startedAt.getTime() <= Date.now() + 1000,
      `startedAt ${info.startedAt.toISOString()}`);
    const lifetime = info.endAt.getTime() - info.startedAt.getTime();
    assert.ok(Math.abs(lifetime - 300_000) <= slackMs, `endAt - startedAt = ${lifetime} ms, want ~300 s`);

    await sbx.setTimeout(900_000, { requestTimeoutMs });
    const extended = await Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs });
    const fromNow = extended.endAt.getTime() - Date.now();
    assert.ok(Math.abs(fromNow - 900_000) <= slackMs, `endAt is ${fromNow} ms away after setTimeout(900 s)`);

    assert.equal(await sbx.isRunning({ requestTimeoutMs }), true);
    const again = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs });
    assert.equal(again.sandboxId, sbx.sandboxId);
    assert.equal(await sh(again, 'echo connected'), 'connected\n');

    const metrics = await eventually(async () => {
      const m = await sbx.getMetrics({ requestTimeoutMs });
      return m.length ? m : null;
    }, { withinMs: 30_000, what: 'a metrics sample' });
    const last = metrics.at(-1);
    assert.ok(last.timestamp instanceof Date && !Number.isNaN(last.timestamp.getTime()), `timestamp ${last.timestamp}`);
    assert.ok(last.cpuCount >= 1, `cpuCount ${last.cpuCount}`);
    assert.ok(last.cpuUsedPct >= 0, `cpuUsedPct ${last.cpuUsedPct}`);
    assert.ok(last.memTotal > 0 && last.memUsed > 0 && last.memUsed <= last.memTotal,
      `memUsed ${last.memUsed} of ${last.memTotal}`);
    assert.ok(last.diskTotal > 0 && last.diskUsed <= last.diskTotal, `diskUsed ${last.diskUsed} of ${last.diskTotal}`);

    assert.equal(await sbx.kill({ requestTimeoutMs }), true);
    assert.equal(await sbx.isRunning({ requestTimeoutMs }), false);
    assert.equal(await Sandbox.kill(sbx.sandboxId, { requestTimeoutMs }), false, 'a second kill finds nothing');
    await rejectsWith(() => Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs }), SandboxNotFoundError,
      'getInfo after kill');
    await rejectsWith(() => sbx.setTimeout(60_000, { requestTimeoutMs }), SandboxNotFoundError, 'setTimeout after kill');
    await rejectsWith(() => Sandbox.connect(sbx.sandboxId, { requestTimeoutMs }), SandboxNotFoundError,
      'connect after kill');
  });

  test('list: metadata and state filters, pages of limit', { timeout: testTimeoutMs }, async (t) => {
    const group = `list-${randomBytes(3).toString('hex')}`;
    // A key and value that need encoding, the SDK's three layers of it included.
    const odd = { 'odd key': 'v&w=x y%' };
    const sbxs = await Promise.all([0, 1, 2].map((i) => sandboxFor(t, { metadata: { group, i: String(i), ...odd } })));
    const want = sbxs.map((s) => s.sandboxId).sort();

    const pages = await allPages(Sandbox.list({ query: { metadata: { run: runId, group } }, limit: 2, requestTimeoutMs }));
    assert.deepEqual(pages.map((p) => p.length), [2, 1], 'three sandboxes in pages of two');
    assert.deepEqual(ids(pages), want);
    for (const s of pages.flat()) {
      assert.equal(s.state, 'running');
      assert.equal(s.metadata.group, group);
      assert.ok(s.startedAt instanceof Date && s.endAt > s.startedAt, `${s.startedAt} .. ${s.endAt}`);
    }

    const one = await allPages(Sandbox.list({ query: { metadata: { group, i: '1', ...odd } }, requestTimeoutMs }));
    assert.deepEqual(ids(one), [sbxs[1].sandboxId], 'metadata filters combine with AND, encoded keys included');
    const none = await allPages(Sandbox.list({ query: { metadata: { group, i: '7' } }, requestTimeoutMs }));
    assert.deepEqual(ids(none), []);

    assert.equal(await sbxs[2].pause({ requestTimeoutMs }), true);
    const running = await allPages(Sandbox.list({ query: { metadata: { group }, state: ['running'] }, requestTimeoutMs }));
    assert.deepEqual(ids(running), [sbxs[0].sandboxId, sbxs[1].sandboxId].sort());
    const paused = await allPages(Sandbox.list({ query: { metadata: { group }, state: ['paused'] }, requestTimeoutMs }));
    assert.deepEqual(ids(paused), [sbxs[2].sandboxId]);
    assert.equal(paused[0][0].state, 'paused');
    const both = await allPages(Sandbox.list({ query: { metadata: { group } }, requestTimeoutMs }));
    assert.deepEqual(ids(both), want, 'running and paused by default');

    // Paging walks the whole set once, whatever the page size.
    const byOne = await allPages(Sandbox.list({ query: { metadata: { group } }, limit: 1, requestTimeoutMs }));
    assert.deepEqual(byOne.map((p) => p.length), [1, 1, 1]);
    assert.deepEqual(ids(byOne), want);
  });

  test('a sandbox whose timeout passes ends', { timeout: testTimeoutMs }, async (t) => {
    const sbx = await sandboxFor(t, { metadata: { case: 'expiry' } });
    await sbx.setTimeout(3_000, { requestTimeoutMs });
    await eventually(async () => !(await sbx.isRunning({ requestTimeoutMs })),
      { withinMs: 60_000, what: 'the sandbox ended' });
    await rejectsWith(() => Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs }), SandboxNotFoundError,
      'getInfo after expiry');
  });

  test('a wrong API key is AuthenticationError on every control-plane call', { timeout: testTimeoutMs }, async (t) => {
    const sbx = await sandboxFor(t, { metadata: { case: 'auth' } });
    const opts = { apiKey: wrongKey, requestTimeoutMs };
    await rejectsWith(() => Sandbox.create(opts), AuthenticationError, 'create');
    await rejectsWith(() => Sandbox.list(opts).nextItems(), AuthenticationError, 'list');
    await rejectsWith(() => Sandbox.getInfo(sbx.sandboxId, opts), AuthenticationError, 'getInfo');
    await rejectsWith(() => Sandbox.connect(sbx.sandboxId, opts), AuthenticationError, 'connect');
    await rejectsWith(() => Sandbox.setTimeout(sbx.sandboxId, 60_000, opts), AuthenticationError, 'setTimeout');
    await rejectsWith(() => Sandbox.kill(sbx.sandboxId, opts), AuthenticationError, 'kill');
    assert.equal(await sbx.isRunning({ requestTimeoutMs }), true, 'the refused kill left it running');
  });

  test("one sandbox's envd token does not open another", { timeout: testTimeoutMs }, async (t) => {
    const [a, b] = await Promise.all([sandboxFor(t, { metadata: { case: 'token-a' } }),
      sandboxFor(t, { metadata: { case: 'token-b' } })]);
    assert.ok(a.envdAccessToken && b.envdAccessToken, 'each create answers an envdAccessToken');
    assert.notEqual(a.envdAccessToken, b.envdAccessToken);
    await sh(b, 'echo secret > /tmp/b-only.txt');
    // What Sandbox.connect builds, with a's token in place of b's.
    const intruder = new Sandbox({ sandboxId: b.sandboxId, envdVersion: (await b.getInfo()).envdVersion,
      envdAccessToken: a.envdAccessToken, requestTimeoutMs });
    await rejectsWith(() => intruder.commands.run('cat /tmp/b-only.txt'), AuthenticationError, 'commands.run');
    await rejectsWith(() => intruder.files.read('/tmp/b-only.txt'), AuthenticationError, 'files.read');
    await rejectsWith(() => intruder.files.list('/tmp'), AuthenticationError, 'files.list');
    await rejectsWith(() => intruder.commands.list(), AuthenticationError, 'commands.list');
    const tokenless = new Sandbox({ sandboxId: b.sandboxId, envdVersion: (await b.getInfo()).envdVersion,
      requestTimeoutMs });
    await rejectsWith(() => tokenless.files.read('/tmp/b-only.txt'), AuthenticationError, 'files.read with no token');
    assert.equal(await sh(b, 'cat /tmp/b-only.txt'), 'secret\n', 'b still answers its own token');
  });
});

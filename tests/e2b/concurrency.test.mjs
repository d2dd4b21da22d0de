// Twenty sandboxes driven at once from one process: each created with its own envVars, given
// a command and a file round trip, listed together in pages, then killed. Their paced uploads
// are what found serve suspending an HTTP connection twice (unit http_body_pause).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import test, { describe } from 'node:test';

import { Sandbox } from 'e2b';

import { allPages, requestTimeoutMs, runId, sh, testTimeoutMs } from './support.mjs';

const count = 20;

describe('concurrency', () => {
  test(`${count} sandboxes at once`, { timeout: testTimeoutMs * 2 }, async (t) => {
    const group = `many-${randomBytes(3).toString('hex')}`;
    const created = await Promise.allSettled(Array.from({ length: count }, (_, i) => Sandbox.create({
      requestTimeoutMs, timeoutMs: 1_800_000, envs: { N: String(i) }, metadata: { tier: 'e2b', run: runId, group },
    })));
    const sbxs = created.filter((c) => c.status === 'fulfilled').map((c) => c.value);
    t.after(() => Promise.all(sbxs.map((s) => s.kill({ requestTimeoutMs }).catch(() => {}))));
    const failures = created.filter((c) => c.status === 'rejected').map((c) => String(c.reason));
    assert.deepEqual(failures, [], `${failures.length} of ${count} creates failed`);
    assert.equal(new Set(sbxs.map((s) => s.sandboxId)).size, count, `${count} different sandboxes`);

    const results = await Promise.all(sbxs.map(async (s, i) => {
      const doubled = await sh(s, 'echo $N > /tmp/n.txt && echo $((N * 2))');
      await s.files.write('/tmp/from-host.txt', `host ${i}`);
      return [doubled, await s.files.read('/tmp/n.txt'), await sh(s, 'cat /tmp/from-host.txt')];
    }));
    results.forEach(([doubled, n, back], i) => {
      assert.equal(doubled, `${i * 2}\n`, `sandbox ${i}: its own envVars`);
      assert.equal(n, `${i}\n`, `sandbox ${i}: its own file`);
      assert.equal(back, `host ${i}`, `sandbox ${i}: the file written to it`);
    });

    const listed = (await allPages(Sandbox.list({ query: { metadata: { group } }, limit: 7, requestTimeoutMs }))).flat();
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), sbxs.map((s) => s.sandboxId).sort());

    const killed = await Promise.all(sbxs.map((s) => s.kill({ requestTimeoutMs })));
    assert.deepEqual(killed, Array(count).fill(true));
    const left = (await allPages(Sandbox.list({ query: { metadata: { group } }, requestTimeoutMs }))).flat();
    assert.deepEqual(left, []);
  });
});

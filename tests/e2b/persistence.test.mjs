// What a sandbox keeps through the control plane's pause + connect (resume), fork, and
// snapshots: its files and, where memory is kept, its running processes.
import assert from 'node:assert/strict';
import test, { describe } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { Sandbox, SandboxError } from 'e2b';

import {
  allPages, eventually, requestTimeoutMs, runId, sandboxFor, sh, testTimeoutMs,
} from './support.mjs';

// A background loop that counts into /tmp/count, five times a second, with no command
// deadline (timeoutMs 0), left running without a client.
async function startCounter(sbx) {
  const handle = await sbx.commands.run(
    "bash -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done'",
    { background: true, timeoutMs: 0, requestTimeoutMs });
  await handle.disconnect();
  await eventually(async () => Number(await sh(sbx, 'cat /tmp/count 2>/dev/null || echo 0')) > 0,
    { what: 'the counter started' });
  return handle.pid;
}

// The counter still counts: two reads a while apart differ, and its process is listed.
async function counterRuns(sbx, pid) {
  const first = Number(await sh(sbx, 'cat /tmp/count'));
  await eventually(async () => Number(await sh(sbx, 'cat /tmp/count')) > first,
    { withinMs: 30_000, what: `the counter moved on from ${first}` });
  const listed = await sbx.commands.list({ requestTimeoutMs });
  assert.ok(listed.some((p) => p.pid === pid), `pid ${pid} in ${JSON.stringify(listed.map((p) => p.pid))}`);
}

describe('persistence', () => {
  test('pause, then connect resumes it with its files and its running process', { timeout: testTimeoutMs }, async (t) => {
    const sbx = await sandboxFor(t, { metadata: { case: 'pause' } });
    await sbx.files.write('/tmp/kept.txt', 'kept across the pause');
    const pid = await startCounter(sbx);

    assert.equal(await sbx.pause({ requestTimeoutMs }), true);
    assert.equal(await sbx.pause({ requestTimeoutMs }), false, 'already paused');
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs })).state, 'paused');
    assert.equal(await sbx.isRunning({ requestTimeoutMs }), false, 'envd does not answer while paused');
    const paused = await allPages(Sandbox.list({ query: { metadata: { run: runId, case: 'pause' }, state: ['paused'] },
      requestTimeoutMs }));
    assert.deepEqual(paused.flat().map((s) => s.sandboxId), [sbx.sandboxId]);

    const resumed = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs });
    assert.equal(resumed.sandboxId, sbx.sandboxId);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs })).state, 'running');
    assert.equal(await resumed.files.read('/tmp/kept.txt'), 'kept across the pause');
    await counterRuns(resumed, pid);
    // The handle from before the pause still works: the same sandbox, the same token.
    assert.equal(await sbx.isRunning({ requestTimeoutMs }), true);
    assert.equal(await sh(sbx, 'cat /tmp/kept.txt'), 'kept across the pause');

    // connect() on the instance resumes as well.
    assert.equal(await sbx.pause({ requestTimeoutMs }), true);
    await sbx.connect({ requestTimeoutMs });
    await counterRuns(sbx, pid);
  });

  test('fork: each child has the files and the running process, then goes its own way', { timeout: testTimeoutMs }, async (t) => {
    const parent = await sandboxFor(t, { metadata: { case: 'fork' } });
    await parent.files.write('/tmp/inherited.txt', 'from the parent');
    const pid = await startCounter(parent);

    const forks = await parent.fork({ count: 2, requestTimeoutMs });
    assert.equal(forks.length, 2);
    for (const f of forks) {
      if (f instanceof Sandbox) t.after(() => f.kill({ requestTimeoutMs }).catch(() => {}));
    }
    for (const f of forks) assert.ok(f instanceof Sandbox, `a fork failed: ${f}`);
    const allIds = new Set([parent.sandboxId, ...forks.map((f) => f.sandboxId)]);
    assert.equal(allIds.size, 3, 'three different sandboxes');

    for (const f of forks) {
      assert.equal(await f.files.read('/tmp/inherited.txt'), 'from the parent');
      await counterRuns(f, pid);
    }
    await forks[0].files.write('/tmp/own.txt', 'fork 0 only');
    assert.equal(await forks[1].files.exists('/tmp/own.txt'), false);
    assert.equal(await parent.files.exists('/tmp/own.txt'), false);
    // The parent ran on through the fork.
    assert.equal((await parent.getInfo({ requestTimeoutMs })).state, 'running');
    await counterRuns(parent, pid);
  });

  test('createSnapshot, create from it, listSnapshots, deleteSnapshot', { timeout: testTimeoutMs }, async (t) => {
    const src = await sandboxFor(t, { metadata: { case: 'snapshot' } });
    await src.files.write('/tmp/snap.txt', 'in the snapshot');
    const snap = await src.createSnapshot({ name: `tier-${runId}`, requestTimeoutMs });
    assert.ok(typeof snap.snapshotId === 'string' && snap.snapshotId, JSON.stringify(snap));
    assert.ok(Array.isArray(snap.names), JSON.stringify(snap));
    // Written after the snapshot: not in it.
    await src.files.write('/tmp/after.txt', 'after the snapshot');
    assert.equal(await src.files.read('/tmp/snap.txt'), 'in the snapshot', 'the source runs on');

    const bySource = (await allPages(Sandbox.listSnapshots({ sandboxId: src.sandboxId, requestTimeoutMs }))).flat();
    assert.deepEqual(bySource.map((s) => s.snapshotId), [snap.snapshotId]);
    const fromInstance = (await allPages(src.listSnapshots({ requestTimeoutMs }))).flat();
    assert.deepEqual(fromInstance.map((s) => s.snapshotId), [snap.snapshotId]);

    const copy = await sandboxFor(t, { template: snap.snapshotId, metadata: { case: 'from-snapshot' } });
    assert.notEqual(copy.sandboxId, src.sandboxId);
    assert.equal(await copy.files.read('/tmp/snap.txt'), 'in the snapshot');
    assert.equal(await copy.files.exists('/tmp/after.txt'), false);

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { requestTimeoutMs }), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { requestTimeoutMs }), false, 'already deleted');
    const left = (await allPages(Sandbox.listSnapshots({ sandboxId: src.sandboxId, requestTimeoutMs }))).flat();
    assert.deepEqual(left, []);
    await assert.rejects(() => Sandbox.create(snap.snapshotId, { requestTimeoutMs, timeoutMs: 60_000 }),
      (e) => e instanceof SandboxError && e.statusCode === 404, 'a create from a deleted snapshot is a 404');
    // The sandbox made from it outlives the snapshot.
    await sleep(100);
    assert.equal(await sh(copy, 'cat /tmp/snap.txt'), 'in the snapshot');
  });
});

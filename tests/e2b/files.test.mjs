// sandbox.files through the official SDK (envd's filesystem.Filesystem and /files): write and
// read as text and bytes, several files at once, list with depth, exists, makeDir, rename,
// remove, getInfo, watchDir, and the signed upload/download URLs fetched without the SDK.
// One sandbox for the file; each test works under its own directory.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import test, { after, before, describe } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { FileNotFoundError, FileType, FilesystemEventType, Sandbox } from 'e2b';

import { eventually, rejectsWith, requestTimeoutMs, runId, sh, testTimeoutMs } from './support.mjs';

describe('files', () => {
  let sbx;
  before(async () => {
    sbx = await Sandbox.create({ requestTimeoutMs, timeoutMs: 1_800_000,
      metadata: { tier: 'e2b', run: runId, case: 'files' } });
  });
  after(async () => {
    await sbx?.kill({ requestTimeoutMs }).catch(() => {});
  });

  const ro = { requestTimeoutMs };

  test('write and read text, parents made', { timeout: testTimeoutMs }, async () => {
    const info = await sbx.files.write('/tmp/text/deep/er/a.txt', 'héllo\nwörld\n', ro);
    assert.equal(info.path, '/tmp/text/deep/er/a.txt');
    assert.equal(info.name, 'a.txt');
    assert.equal(info.type, FileType.FILE);
    assert.equal(await sbx.files.read('/tmp/text/deep/er/a.txt', ro), 'héllo\nwörld\n');
    assert.equal(await sh(sbx, 'cat /tmp/text/deep/er/a.txt'), 'héllo\nwörld\n', 'the command sees the same file');
    await sbx.files.write('/tmp/text/deep/er/a.txt', 'shorter', ro);
    assert.equal(await sbx.files.read('/tmp/text/deep/er/a.txt', ro), 'shorter', 'a rewrite replaces the content');
    await sbx.files.write('/tmp/text/empty.txt', '', ro);
    assert.equal(await sbx.files.read('/tmp/text/empty.txt', ro), '');
  });

  test('write and read bytes, every byte value', { timeout: testTimeoutMs }, async () => {
    const data = new Uint8Array(256 * 1024);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 8)) & 0xff;
    await sbx.files.write('/tmp/bytes/blob.bin', data.buffer, ro);
    const back = await sbx.files.read('/tmp/bytes/blob.bin', { format: 'bytes', ...ro });
    assert.ok(back instanceof Uint8Array);
    assert.equal(back.length, data.length);
    assert.ok(Buffer.from(back).equals(Buffer.from(data)), 'the bytes read back are the bytes written');
    assert.equal(await sh(sbx, 'sha256sum < /tmp/bytes/blob.bin | cut -c1-64'),
      `${createHash('sha256').update(data).digest('hex')}\n`, 'the command reads the same bytes');
    const blob = await sbx.files.read('/tmp/bytes/blob.bin', { format: 'blob', ...ro });
    assert.equal(blob.size, data.length);
  });

  test('several files in one write', { timeout: testTimeoutMs }, async () => {
    const infos = await sbx.files.write([
      { path: '/tmp/multi/x/one.txt', data: 'one' },
      { path: '/tmp/multi/y/two.bin', data: new Uint8Array([0, 1, 2, 255]).buffer },
      { path: '/tmp/multi/three.txt', data: new Blob(['three']) },
    ], ro);
    assert.deepEqual(infos.map((i) => i.path).sort(),
      ['/tmp/multi/three.txt', '/tmp/multi/x/one.txt', '/tmp/multi/y/two.bin']);
    assert.equal(await sbx.files.read('/tmp/multi/x/one.txt', ro), 'one');
    assert.deepEqual([...await sbx.files.read('/tmp/multi/y/two.bin', { format: 'bytes', ...ro })], [0, 1, 2, 255]);
    assert.equal(await sbx.files.read('/tmp/multi/three.txt', ro), 'three');
  });

  test('makeDir, list with depth, exists', { timeout: testTimeoutMs }, async () => {
    assert.equal(await sbx.files.makeDir('/tmp/tree/a/b', ro), true);
    assert.equal(await sbx.files.makeDir('/tmp/tree/a/b', ro), false, 'it exists already');
    await sbx.files.write('/tmp/tree/a/b/c.txt', 'c', ro);
    await sbx.files.write('/tmp/tree/top.txt', 'top!', ro);

    const one = await sbx.files.list('/tmp/tree', ro);
    assert.deepEqual(one.map((e) => [e.name, e.type]).sort(), [['a', FileType.DIR], ['top.txt', FileType.FILE]]);
    const top = one.find((e) => e.name === 'top.txt');
    assert.equal(top.path, '/tmp/tree/top.txt');
    assert.equal(top.size, 4);

    const deep = await sbx.files.list('/tmp/tree', { depth: 3, ...ro });
    assert.deepEqual(deep.map((e) => e.path).sort(),
      ['/tmp/tree/a', '/tmp/tree/a/b', '/tmp/tree/a/b/c.txt', '/tmp/tree/top.txt']);
    const two = await sbx.files.list('/tmp/tree', { depth: 2, ...ro });
    assert.deepEqual(two.map((e) => e.path).sort(), ['/tmp/tree/a', '/tmp/tree/a/b', '/tmp/tree/top.txt']);

    assert.equal(await sbx.files.exists('/tmp/tree/a/b/c.txt', ro), true);
    assert.equal(await sbx.files.exists('/tmp/tree/a', ro), true);
    assert.equal(await sbx.files.exists('/tmp/tree/nope', ro), false);
    await rejectsWith(() => sbx.files.list('/tmp/tree/nope', ro), FileNotFoundError, 'list of a missing directory');
  });

  test('getInfo of a file and a directory', { timeout: testTimeoutMs }, async () => {
    const before = Date.now();
    await sbx.files.write('/tmp/info/f.txt', '12345', ro);
    await sh(sbx, 'chmod 640 /tmp/info/f.txt && ln -s /tmp/info/f.txt /tmp/info/link');
    const f = await sbx.files.getInfo('/tmp/info/f.txt', ro);
    assert.equal(f.name, 'f.txt');
    assert.equal(f.path, '/tmp/info/f.txt');
    assert.equal(f.type, FileType.FILE);
    assert.equal(f.size, 5);
    assert.equal(f.mode & 0o777, 0o640);
    assert.equal(f.permissions, '-rw-r-----');
    assert.ok(f.owner && f.group, `owner ${f.owner}, group ${f.group}`);
    assert.ok(f.modifiedTime instanceof Date && Math.abs(f.modifiedTime.getTime() - before) < 120_000,
      `modifiedTime ${f.modifiedTime}`);
    const d = await sbx.files.getInfo('/tmp/info', ro);
    assert.equal(d.type, FileType.DIR);
    assert.equal(d.name, 'info');
    const l = await sbx.files.getInfo('/tmp/info/link', ro);
    assert.equal(l.symlinkTarget, '/tmp/info/f.txt');
    await rejectsWith(() => sbx.files.getInfo('/tmp/info/missing', ro), FileNotFoundError, 'getInfo of a missing file');
    await rejectsWith(() => sbx.files.read('/tmp/info/missing', ro), FileNotFoundError, 'read of a missing file');
  });

  test('rename and remove', { timeout: testTimeoutMs }, async () => {
    await sbx.files.write('/tmp/mv/old.txt', 'moving', ro);
    await sbx.files.makeDir('/tmp/mv/sub', ro);
    const moved = await sbx.files.rename('/tmp/mv/old.txt', '/tmp/mv/sub/new.txt', ro);
    assert.equal(moved.path, '/tmp/mv/sub/new.txt');
    assert.equal(moved.name, 'new.txt');
    assert.equal(await sbx.files.exists('/tmp/mv/old.txt', ro), false);
    assert.equal(await sbx.files.read('/tmp/mv/sub/new.txt', ro), 'moving');
    const dir = await sbx.files.rename('/tmp/mv/sub', '/tmp/mv/renamed', ro);
    assert.equal(dir.type, FileType.DIR);
    assert.equal(await sbx.files.read('/tmp/mv/renamed/new.txt', ro), 'moving');

    await sbx.files.remove('/tmp/mv/renamed/new.txt', ro);
    assert.equal(await sbx.files.exists('/tmp/mv/renamed/new.txt', ro), false);
    await sbx.files.write('/tmp/mv/renamed/x/y.txt', 'y', ro);
    await sbx.files.remove('/tmp/mv/renamed', ro);
    assert.equal(await sbx.files.exists('/tmp/mv/renamed', ro), false, 'a directory goes with what it holds');
    await rejectsWith(() => sbx.files.rename('/tmp/mv/gone', '/tmp/mv/x', ro), FileNotFoundError, 'rename of a missing file');
  });

  test('watchDir, recursive: create, write and remove events', { timeout: testTimeoutMs }, async () => {
    await sbx.files.makeDir('/tmp/watched/sub', ro);
    const events = [];
    const handle = await sbx.files.watchDir('/tmp/watched', (e) => events.push(e),
      { recursive: true, timeoutMs: 0, ...ro });
    try {
      await sbx.files.write('/tmp/watched/sub/new.txt', 'first', ro);
      await sh(sbx, 'echo more >> /tmp/watched/sub/new.txt && echo top > /tmp/watched/top.txt');
      await sbx.files.remove('/tmp/watched/sub/new.txt', ro);
      const has = (name, type) => events.some((e) => e.name === name && e.type === type);
      await eventually(() => has('sub/new.txt', FilesystemEventType.CREATE) && has('sub/new.txt', FilesystemEventType.WRITE)
        && has('sub/new.txt', FilesystemEventType.REMOVE) && has('top.txt', FilesystemEventType.CREATE),
      { withinMs: 30_000, what: `create, write and remove events (got ${JSON.stringify(events)})` });
      const firstCreate = events.findIndex((e) => e.name === 'sub/new.txt' && e.type === FilesystemEventType.CREATE);
      const remove = events.findIndex((e) => e.name === 'sub/new.txt' && e.type === FilesystemEventType.REMOVE);
      assert.ok(firstCreate < remove, `the create came before the remove: ${JSON.stringify(events)}`);
    } finally {
      await handle.stop();
    }
    const seen = events.length;
    await sbx.files.write('/tmp/watched/after-stop.txt', 'x', ro);
    await sleep(1000);
    assert.equal(events.length, seen, 'no events after stop()');
  });

  test('watchDir, not recursive: a subdirectory is not watched', { timeout: testTimeoutMs }, async () => {
    await sbx.files.makeDir('/tmp/flat/sub', ro);
    const events = [];
    const handle = await sbx.files.watchDir('/tmp/flat', (e) => events.push(e), { timeoutMs: 0, ...ro });
    try {
      await sbx.files.write('/tmp/flat/sub/hidden.txt', 'x', ro);
      await sbx.files.write('/tmp/flat/seen.txt', 'x', ro);
      await eventually(() => events.some((e) => e.name === 'seen.txt'), { withinMs: 30_000, what: 'the event of seen.txt' });
      assert.ok(!events.some((e) => e.name.includes('hidden')), JSON.stringify(events));
    } finally {
      await handle.stop();
    }
    await rejectsWith(() => sbx.files.watchDir('/tmp/flat/none', () => {}, ro), FileNotFoundError, 'watch of a missing dir');
  });

  test('uploadUrl and downloadUrl, signed, fetched without the SDK', { timeout: testTimeoutMs }, async () => {
    const path = '/tmp/signed/up.txt';
    const up = await sbx.uploadUrl(path);
    assert.match(up, /[?&]signature=v1_/);
    const form = new FormData();
    form.append('file', new Blob(['uploaded through a signed URL\n']), 'up.txt');
    const put = await fetch(up, { method: 'POST', body: form });
    assert.equal(put.status, 200, await put.clone().text());
    assert.equal(await sbx.files.read(path, ro), 'uploaded through a signed URL\n');

    const down = await sbx.downloadUrl(path);
    const got = await fetch(down);
    assert.equal(got.status, 200);
    assert.equal(await got.text(), 'uploaded through a signed URL\n');

    // The signature is for that path and that operation only.
    const other = new URL(down);
    other.searchParams.set('path', '/etc/shadow');
    assert.ok([401, 403].includes((await fetch(other)).status), 'a signature for another path is refused');
    const forged = new URL(down);
    forged.searchParams.set('signature', `v1_${'A'.repeat(43)}`);
    assert.ok([401, 403].includes((await fetch(forged)).status), 'a forged signature is refused');
    const upAsDown = await fetch(up);
    assert.ok([401, 403].includes(upAsDown.status), `a write signature used to read is refused (${upAsDown.status})`);

    // An expiring signature holds until it expires.
    const brief = await sbx.downloadUrl(path, { useSignatureExpiration: 2 });
    assert.match(brief, /signature_expiration=\d+/);
    assert.equal((await fetch(brief)).status, 200);
    await sleep(3500);
    assert.ok([401, 403].includes((await fetch(brief)).status), 'an expired signature is refused');
  });
});

// tests/e2b/node_env.sh's choice of Node.js for the SDKs (no VM): the version comparison, and
// which node it picks when the machine's is too old, missing, or fine.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import test, { describe } from 'node:test';
import { fileURLToPath } from 'node:url';

const nodeEnv = join(dirname(fileURLToPath(import.meta.url)), 'node_env.sh');

function bash(script, env = {}) {
  return spawnSync('/bin/bash', ['-c', `source '${nodeEnv}'; ${script}`],
    { encoding: 'utf8', env: { ...process.env, ...env } });
}

describe('install', () => {
  test('e2b_version_at_least compares numbers, part by part', () => {
    const cases = [
      ['v20.18.1', '20.18.1', true], ['20.18.1', '20.18.1', true], ['v20.18.0', '20.18.1', false],
      ['v20.20.2', '20.18.1', true], ['v20.9.0', '20.18.1', false], ['v20.100.0', '20.18.1', true],
      ['v22.0.0', '20.18.1', true], ['v18.19.0', '20.18.1', false], ['v100.0.0', '20.18.1', true],
      ['v20.18.2-rc.1', '20.18.1', true], ['v20.18.1+local', '20.18.1', true], ['v20.018.1', '20.18.1', true],
      ['', '20.18.1', false], ['v20.18', '20.18.1', false], ['v20.x.1', '20.18.1', false], ['garbage', '20.18.1', false],
      ['v20.18.1.5', '20.18.1', false], ['v9999999999.0.0', '20.18.1', false],
    ];
    for (const [have, want, fits] of cases) {
      const r = bash(`e2b_version_at_least '${have}' '${want}'`);
      assert.equal(r.status === 0, fits, `${have} >= ${want}: exit ${r.status} ${r.stderr}`);
    }
  });

  test('e2b_node_fits: 20.18.1 and up, but not 21', () => {
    for (const [v, fits] of [['v20.18.1', true], ['v20.20.2', true], ['v21.7.3', false], ['v22.12.0', true],
      ['v24.0.0', true], ['v20.18.0', false], ['v18.20.4', false]]) {
      assert.equal(bash(`e2b_node_fits '${v}'`).status === 0, fits, v);
    }
  });

  test("e2b_find_node: the machine's node when it fits, else the pinned one, else a clear failure", (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'e2b-find-node-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const fake = (where, version) => {
      mkdirSync(where, { recursive: true });
      writeFileSync(join(where, 'node'), `#!/bin/sh\necho ${version}\n`);
      chmodSync(join(where, 'node'), 0o755);
    };
    const cache = join(dir, 'cache');
    const basePath = '/usr/bin:/bin';
    const pinned = bash('e2b_pinned_node_dir', { AGENTVM_CACHE: cache }).stdout.trim();
    assert.ok(pinned.startsWith(`${cache}/node/`), pinned);

    fake(join(dir, 'new'), 'v20.19.0');
    let r = bash('e2b_find_node', { PATH: `${join(dir, 'new')}:${basePath}`, AGENTVM_CACHE: cache });
    assert.equal(r.stdout.trim(), join(dir, 'new', 'node'));

    fake(join(dir, 'old'), 'v18.19.0');
    r = bash('e2b_find_node', { PATH: `${join(dir, 'old')}:${basePath}`, AGENTVM_CACHE: cache });
    assert.notEqual(r.status, 0, 'an old node and no pinned one');
    assert.match(r.stderr, /no Node\.js >= 20\.18\.1.*v18\.19\.0/);

    fake(join(pinned, 'bin'), 'v22.23.5');
    r = bash('e2b_find_node', { PATH: `${join(dir, 'old')}:${basePath}`, AGENTVM_CACHE: cache });
    assert.equal(r.stdout.trim(), join(pinned, 'bin', 'node'), 'the pinned node stands in for an old one');
    // No node at all: only the tools node_env.sh uses.
    const tools = join(dir, 'tools');
    mkdirSync(tools);
    for (const tool of ['sha256sum', 'cut']) symlinkSync(`/usr/bin/${tool}`, join(tools, tool));
    r = bash('e2b_find_node', { PATH: tools, AGENTVM_CACHE: cache });
    assert.equal(r.stdout.trim(), join(pinned, 'bin', 'node'), 'and for a missing one');
  });
});

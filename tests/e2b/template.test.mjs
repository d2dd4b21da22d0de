// The core calls on a template of one's own, built by `agentvm template` (tests/e2b/run.sh
// builds it from the default guest's tree with an --env and a --copy; the driver bakes it and
// gives serve a pool of it): E2B's Sandbox.create(<template name>).
import assert from 'node:assert/strict';
import test, { describe } from 'node:test';

import { Sandbox as CodeSandbox } from '@e2b/code-interpreter';
import { Sandbox } from 'e2b';

import { allPages, requestTimeoutMs, runId, sandboxFor, sh, testTimeoutMs } from './support.mjs';

const template = process.env.E2B_TIER_TEMPLATE;

describe('template', () => {
  test('create from an agentvm template: commands, files, code, info, list, kill', { timeout: testTimeoutMs }, async (t) => {
    assert.equal(process.env.E2B_TIER_TEMPLATE_ERROR || '', '', 'the template was built and baked');
    const sbx = await sandboxFor(t, { cls: CodeSandbox, template, metadata: { case: 'template' } });

    assert.equal(await sh(sbx, 'echo "$E2B_TIER_TEMPLATE"'), `${template}\n`, "the template's --env");
    assert.match(await sbx.files.read('/opt/e2b-tier/marker.txt'), /agentvm template build --copy/, "the template's --copy");
    await sbx.files.write('/tmp/on-template.txt', 'written');
    assert.equal(await sh(sbx, 'cat /tmp/on-template.txt'), 'written');
    assert.ok((await sbx.files.list('/opt/e2b-tier')).some((e) => e.name === 'marker.txt'));
    const code = await sbx.runCode('import os\nos.environ["E2B_TIER_TEMPLATE"]', { timeoutMs: requestTimeoutMs });
    assert.equal(code.error, undefined, JSON.stringify(code.error));
    assert.equal(code.text, template);

    const info = await sbx.getInfo();
    assert.ok(info.templateId === template || info.name === template, `templateId ${info.templateId}, name ${info.name}`);
    const query = { metadata: { run: runId }, template };
    const listed = (await allPages(Sandbox.list({ query, requestTimeoutMs }))).flat();
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId], 'a list filtered by the template');
    assert.equal(await sbx.kill(), true);
    assert.equal(await sbx.isRunning(), false);
  });

  test('an unknown template is refused with 404', { timeout: testTimeoutMs }, async () => {
    await assert.rejects(() => Sandbox.create('no-such-template-here', { requestTimeoutMs }),
      (e) => e.statusCode === 404, 'create of an unknown template');
  });
});

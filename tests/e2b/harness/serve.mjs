// One agentvm-serve for the whole E2B tier, as python/tests/conftest.py runs one for the Python
// client's, but on a TCP listener (the SDKs speak HTTP to a host and port) with a token of
// E2B's key shape. stop() checks that it leaves nothing behind: it exits 0 on SIGTERM, every
// process it started (episodes and their VMMs) is gone, and its temporary directory is removed.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

// serve's --e2b-domain: create and connect answer it as `domain`, so the SDKs' getHost(port)
// is `<port>-<sandbox id>.<e2bDomain>`, and serve routes a request with such a Host to that
// port. Nothing resolves it; a test sends the Host header to serve's address itself.
export const e2bDomain = 'sandbox.agentvm.test';

// E2B's API keys are `e2b_` and 40 hex digits; the SDKs send the key as it is.
export function e2bShapedKey() {
  return `e2b_${randomBytes(20).toString('hex')}`;
}

async function freePort() {
  const server = createServer();
  await new Promise((resolve, reject) => server.listen(0, '127.0.0.1', resolve).on('error', reject));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

function children(pid) {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function descendants(pid) {
  const out = [];
  const todo = [pid];
  while (todo.length) {
    for (const child of children(todo.pop())) {
      out.push(child);
      todo.push(child);
    }
  }
  return out;
}

function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] !== 'Z';
  } catch {
    return false;
  }
}

export class Serve {
  // pools: {name: count}; templateStore: where --pool's templates are.
  static async start({ binary, pools, templateStore, startTimeoutMs = 120_000 }) {
    const dir = mkdtempSync(join(tmpdir(), 'agentvm-e2b-serve-'));
    const key = e2bShapedKey();
    const tokenFile = join(dir, 'token');
    writeFileSync(tokenFile, key, { mode: 0o600 });
    // E2B_TIER_SERVE_LOG=PATH keeps serve's log, at level debug, where it outlives the run.
    const logPath = process.env.E2B_TIER_SERVE_LOG || join(dir, 'serve.log');
    const logLevel = process.env.E2B_TIER_SERVE_LOG ? 'debug' : 'warn';
    // A port taken between freePort() and serve's bind makes serve exit; try another.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const args = ['--log-level', logLevel, '--listen', `tcp:127.0.0.1:${port}`, '--token-file', tokenFile,
        '--mem-reserve', '256', '--state-dir', join(dir, 'state'), '--e2b-domain', e2bDomain];
      for (const [name, count] of Object.entries(pools)) args.push('--pool', `${name}=${count}`);
      if (templateStore) args.push('--template-store', templateStore);
      const log = openSync(logPath, 'w');
      const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', log] });
      closeSync(log);
      const serve = new Serve(dir, key, port, proc, logPath);
      const up = await serve.waitHealthy(startTimeoutMs);
      if (up) return serve;
      const text = serve.logText();
      if (attempt < 3 && /address already in use/i.test(text)) continue;
      await serve.stop().catch(() => {});
      throw new Error(`agentvm-serve did not answer /healthz within ${startTimeoutMs / 1000} s: ${text.slice(-2000)}`);
    }
  }

  constructor(dir, key, port, proc, logPath) {
    this.dir = dir;
    this.key = key;
    this.port = port;
    this.url = `http://127.0.0.1:${port}`;
    this.proc = proc;
    this.logPath = logPath;
    this.exit = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
    this.exited = null;
    this.exit.then((e) => { this.exited = e; });
    this.seen = new Set();
    this.sampler = setInterval(() => this.noteProcesses(), 500);
  }

  logText() {
    try {
      return readFileSync(this.logPath, 'utf8');
    } catch {
      return '';
    }
  }

  noteProcesses() {
    if (this.exited) return;
    for (const pid of descendants(this.proc.pid)) this.seen.add(pid);
  }

  async waitHealthy(timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.exited) return false;
      try {
        const res = await fetch(`${this.url}/healthz`, { headers: { Authorization: `Bearer ${this.key}` } });
        await res.arrayBuffer();
        if (res.status === 200) return true;
      } catch {
        // Not listening yet.
      }
      await sleep(200);
    }
    return false;
  }

  // Problems found, as sentences; none when serve stopped clean.
  async stop({ graceMs = 120_000 } = {}) {
    const problems = [];
    this.noteProcesses();
    clearInterval(this.sampler);
    if (!this.exited) {
      this.proc.kill('SIGTERM');
      const timer = sleep(graceMs).then(() => 'timeout');
      if ((await Promise.race([this.exit, timer])) === 'timeout') {
        this.proc.kill('SIGKILL');
        await this.exit;
        problems.push(`serve did not stop within ${graceMs / 1000} s of SIGTERM`);
      }
    } else {
      problems.push(`serve had exited before the end of the tier: ${JSON.stringify(this.exited)}`);
    }
    const { code, signal } = this.exited;
    if (code !== 0 && !problems.length) problems.push(`serve exited ${code ?? signal} on SIGTERM`);
    // Episodes stop after serve answers SIGTERM; give the last ones a moment to be reaped.
    const deadline = Date.now() + 10_000;
    let left = [...this.seen].filter(alive);
    while (left.length && Date.now() < deadline) {
      await sleep(200);
      left = left.filter(alive);
    }
    if (left.length) {
      problems.push(`processes serve started are still running after it stopped: ${left.join(', ')}`);
      for (const pid of left) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // Gone meanwhile.
        }
      }
    }
    if (problems.length) problems.push(`serve's log ends with: ${this.logText().slice(-3000)}`);
    rmSync(this.dir, { recursive: true, force: true });
    if (existsSync(this.dir)) problems.push(`${this.dir} could not be removed`);
    return problems;
  }
}

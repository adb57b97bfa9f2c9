// Minimal reproduction of a Node.js defect (seen on 20 and 24.21): an HTTP/2 session on a TLS socket
// (node:http2's native path) whose peer dies with a TCP reset while the session writes stays open for
// good: it neither errors nor closes, session.destroy() does not finish it, and its socket stays open.
//
//   node test/repro/h2-tls-reset.mjs [rounds]        (needs openssl for a throwaway certificate)
//
// Each round: an HTTP/2 server on TLS, a peer in a child process with large windows sending and
// reading as fast as it can on one stream while the server does the same; after 300 ms the peer is
// SIGKILLed (its kernel answers the server's next segments with RST). A round passes when the
// server's session closes within 3 s. When it does not, the script prints the TLS handle's pending
// encrypted bytes (writeQueueSize) and the TCP handle's queue under it, then calls session.destroy()
// and, when that does not close it either, destroys the TLS socket (which does).
//
// Cause, as read in src/crypto/crypto_tls.cc and src/node_http2.cc: TLSWrap::EncOut() sets write_size_
// and writes to the TCP stream; when that write fails (synchronously, or later in OnStreamAfterWrite
// with an error status) it calls InvokeQueued(error) and returns without clearing write_size_, so every
// later EncOut() returns early ("write currently in progress"): encrypted bytes stay in enc_out_ and
// the next write's callback never runs. Http2Session::OnStreamAfterWrite() drops the error status (it
// completes its outgoing writes with 0), writes again, and with that write pending stops reading
// (MaybeStopReading), so it never reads the reset; Http2Session::Close() then waits for that write
// before calling ondone, so session.destroy() never emits 'close' either.
import http2 from 'node:http2';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const chunk = Buffer.alloc(16384);
const pump = (stream) => {
  const go = () => { while (!stream.destroyed && stream.write(chunk)); };
  stream.on('drain', go);
  go();
};

if (process.argv[2] === 'peer') {
  const s = http2.connect(`https://localhost:${process.argv[3]}`, { rejectUnauthorized: false, settings: { initialWindowSize: 16 << 20 } });
  s.on('connect', () => s.setLocalWindowSize(64 << 20));
  const req = s.request({ ':path': '/', ':method': 'POST' });
  req.on('data', () => {});
  pump(req);
  req.once('response', () => process.send('flowing'));
} else {
  const dir = mkdtempSync(join(tmpdir(), 'h2-tls-reset-'));
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
    '-subj', '/CN=localhost', '-keyout', join(dir, 'key'), '-out', join(dir, 'cert')], { stdio: 'ignore' });
  const server = http2.createSecureServer({ key: readFileSync(join(dir, 'key')), cert: readFileSync(join(dir, 'cert')) });
  rmSync(dir, { recursive: true });
  let tlsSocket;
  server.prependListener('secureConnection', (s) => { tlsSocket = s; });
  server.on('stream', (stream) => {
    stream.on('error', () => {});
    stream.respond({ ':status': 200 });
    stream.on('data', () => {});
    pump(stream);
  });
  const rounds = Number(process.argv[2] ?? 10);
  const after = (ms) => new Promise((r) => setTimeout(r, ms));
  const round = async (i) => {
    const session = await new Promise((resolve) => {
      const child = spawn(process.execPath, [fileURLToPath(import.meta.url), 'peer', String(server.address().port)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      server.once('session', (s) => {
        s.on('error', () => {});
        child.once('message', async () => {
          await after(300);
          child.kill('SIGKILL');
          resolve(s);
        });
      });
    });
    const t0 = Date.now();
    const closed = new Promise((r) => session.once('close', () => r(true)));
    if (await Promise.race([closed, after(3000)])) {
      console.log(`round ${i}: ok, the session closed ${Date.now() - t0} ms after the peer was killed`);
      return true;
    }
    const h = tlsSocket._handle;
    console.log(`round ${i}: STUCK, the session is open 3 s after the peer was killed; TLS handle writeQueueSize ${h.writeQueueSize} (encrypted bytes pending), TCP handle writeQueueSize ${h._parent?.writeQueueSize}`);
    session.destroy();
    if (await Promise.race([closed, after(1000)])) {
      console.log('  session.destroy() closed it');
      return false;
    }
    console.log(`  session.destroy(): still no 'close' 1 s later (socket destroyed: ${tlsSocket.destroyed})`);
    tlsSocket.destroy();
    if (await Promise.race([closed, after(1000)])) console.log('  destroying the TLS socket closed it');
    else console.log('  destroying the TLS socket did not close it either');
    return false;
  };
  server.listen(0, async () => {
    let stuck = 0;
    for (let i = 0; i < rounds; i++) if (!(await round(i))) stuck++;
    console.log(`${process.version}: ${stuck} of ${rounds} rounds stuck`);
    server.close();
    process.exitCode = stuck > 0 ? 1 : 0;
  });
}

import type { Duplex } from 'node:stream';

/** Writes `payload` to an echoing peer and resolves with as many bytes read back. */
export function echoRoundTripForTest(s: Duplex, payload: Buffer): Promise<Buffer> {
  const got: Buffer[] = [];
  let n = 0;
  return new Promise((resolve, reject) => {
    const onData = (d: Buffer): void => {
      got.push(d);
      n += d.length;
      if (n >= payload.length) {
        s.off('data', onData);
        resolve(Buffer.concat(got));
      }
    };
    s.on('data', onData);
    s.once('error', reject);
    s.write(payload);
  });
}

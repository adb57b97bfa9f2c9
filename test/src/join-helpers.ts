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
        s.off('error', onError);
        resolve(Buffer.concat(got));
      }
    };
    // Taken off again with the data listener: a connection that round-trips many times gains no listeners.
    const onError = (err: Error): void => {
      s.off('data', onData);
      reject(err);
    };
    s.on('data', onData);
    s.once('error', onError);
    s.write(payload);
  });
}

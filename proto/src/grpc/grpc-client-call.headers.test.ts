// requestWithHeaderList(): a header array where node:http2 takes one (Node 24, 22.17), an object where it
// does not (Node 20 and older 22 throw ERR_INVALID_ARG_TYPE for an array): an SDK embedded in an older Node
// still dials. A file of its own: what it learns stays for the module's life.
import type http2 from 'node:http2';
import { describe, expect, it } from 'vitest';
import { requestWithHeaderList } from './grpc-client-call.js';

const HEADERS = [':method', 'POST', ':path', '/svc/Method', 'content-type', 'application/grpc', 'x-extra', 'v'];

/** A session that takes only header objects, as Node 20's does, and records what it was given. */
function objectOnlySession(): { session: Pick<http2.ClientHttp2Session, 'request'>; given: unknown[] } {
  const given: unknown[] = [];
  const session = {
    request(headers: unknown) {
      given.push(headers);
      if (Array.isArray(headers)) {
        const err = new TypeError('The "headers" argument must be of type object. Received an instance of Array');
        (err as NodeJS.ErrnoException).code = 'ERR_INVALID_ARG_TYPE';
        throw err;
      }
      return {} as http2.ClientHttp2Stream;
    },
  };
  return { session, given };
}

describe('request headers', () => {
  it('an array first; refused as Node 20 refuses it, the same headers as an object, and objects from then on', () => {
    const { session, given } = objectOnlySession();
    requestWithHeaderList(session, HEADERS);
    const object = { ':method': 'POST', ':path': '/svc/Method', 'content-type': 'application/grpc', 'x-extra': 'v' };
    expect(given).toEqual([HEADERS, object]);
    requestWithHeaderList(session, HEADERS);
    expect(given).toEqual([HEADERS, object, object]);
  });

  it('any other error goes to the caller', () => {
    const session = {
      request(): http2.ClientHttp2Stream {
        throw Object.assign(new Error('session destroyed'), { code: 'ERR_HTTP2_INVALID_SESSION' });
      },
    };
    expect(() => requestWithHeaderList(session, HEADERS)).toThrow('session destroyed');
  });
});

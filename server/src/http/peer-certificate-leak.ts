// Node 24.21.0's TLS server leaks the client's certificate on every handshake that verified one.
//
// Once a client's chain verified, Node's server now also checks that the client sent a certificate at
// all (a TLS 1.3 resumption may carry none) by calling its TLS handle's getPeerX509Certificate(). The
// native certificate that call takes is never freed, not even after its JavaScript object is collected:
// ~4.4 KiB of C memory per handshake, without bound, with the allocator's pages around it: every agent
// reconnect and every client with a certificate, most of all konnectivity-clients, which dial a TLS
// connection per proxied connection. Node 24.20.0 does not make the call (docs/measurements/log.md).
//
// The handle's getPeerCertificate(), which builds the legacy certificate object, answers the same
// question without leaking. So the handle's getPeerX509Certificate() answers with that object (Node's
// own check only asks whether there is one), and TLSSocket#getPeerX509Certificate(), which wraps what the
// handle returns, builds its X509Certificate from the certificate's DER instead. Both are installed once
// per process, where the handle has both methods; elsewhere nothing changes.
import { X509Certificate } from 'node:crypto';
import type { Socket } from 'node:net';
import tls from 'node:tls';

/** The two methods of Node's TLS handle (TLSWrap) this replaces and uses. */
interface TlsHandle {
  getPeerCertificate(detailed?: boolean): { raw?: Buffer } | null | undefined;
  getPeerX509Certificate(): unknown;
}

type GuardState = 'not-tried' | 'installed' | 'unavailable';
let guard: GuardState = 'not-tried';

/**
 * Keeps a TLS server from leaking each verified client certificate (above). Call before a server with
 * `requestCert` accepts connections; later calls do nothing. Returns whether the replacement is in place.
 */
export function avoidPeerCertificateLeak(): boolean {
  if (guard === 'not-tried') guard = install() ? 'installed' : 'unavailable';
  return guard === 'installed';
}

function install(): boolean {
  // A TLS socket without a connection, for its handle's prototype; destroying it releases the handle.
  const probe = new tls.TLSSocket(null as unknown as Socket);
  const handle = (probe as unknown as { _handle: object | null })._handle;
  probe.destroy();
  const proto = handle === null ? null : (Object.getPrototypeOf(handle) as Partial<TlsHandle> | null);
  if (!proto || typeof proto.getPeerCertificate !== 'function' || typeof proto.getPeerX509Certificate !== 'function') return false;

  proto.getPeerX509Certificate = function peerCertificateWithoutLeak(this: TlsHandle): unknown {
    return this.getPeerCertificate(false) ?? undefined;
  };
  tls.TLSSocket.prototype.getPeerX509Certificate = function peerX509Certificate(this: tls.TLSSocket): X509Certificate | undefined {
    const handle = (this as unknown as { _handle: TlsHandle | null })._handle;
    const raw = handle?.getPeerCertificate(false)?.raw;
    return raw ? new X509Certificate(raw) : undefined;
  };
  return true;
}

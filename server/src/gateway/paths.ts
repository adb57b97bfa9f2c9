// The gateway's request target: `/<cluster>/<kube path>?<query>` → the cluster and the target sent on
// to its apiserver. Anything that could mean a different path to a proxy or a server than to us is
// refused rather than normalised: dot segments (plain or percent-encoded), encoded slashes and
// backslashes, empty segments, control characters, and absolute-form or `*` targets.
//
// The service form (OCM's user-server URL, kept so its users' URLs work here):
//   /<cluster>/api/v1/namespaces/<ns>/services/<[proto:]name[:port]>/proxy-service/<path>
// names a Service in the cluster instead of its apiserver; proto http or https (default https), port a
// number (default 80 / 443). `default/kubernetes` is the apiserver itself, as in OCM.

/** DNS-1123 label: what a managed cluster name is (it names a namespace and a Service). */
const CLUSTER_NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** A Service behind the proxy-service form. */
export interface ServiceTarget {
  protocol: 'http' | 'https';
  namespace: string;
  name: string;
  port: number;
}

export type GatewayTarget = { cluster: string; path: string; service?: ServiceTarget } | { error: string };

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export function parseGatewayTarget(target: string | undefined): GatewayTarget {
  if (!target || !target.startsWith('/')) return { error: 'the request target must be /CLUSTER/PATH' };
  const q = target.indexOf('?');
  const pathPart = q < 0 ? target : target.slice(0, q);
  const query = q < 0 ? '' : target.slice(q);
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x20\x7f#]/.test(target)) return { error: 'the request target holds a space, a control character or a fragment' };
  if (/%(2f|5c|00)/i.test(pathPart)) return { error: 'encoded slashes, backslashes or NULs are not allowed in the path' };
  if (pathPart.includes('\\')) return { error: 'backslashes are not allowed in the path' };
  const segments = pathPart.slice(1).split('/');
  const cluster = segments[0] ?? '';
  if (cluster === '') return { error: 'the path must start with a cluster name: /CLUSTER/PATH' };
  if (!CLUSTER_NAME.test(cluster)) return { error: 'the first path segment is not a cluster name (a DNS-1123 label)' };
  const rest = segments.slice(1);
  for (let i = 0; i < rest.length; i++) {
    const seg = rest[i]!;
    let decoded: string;
    try {
      decoded = decodeURIComponent(seg);
    } catch {
      return { error: 'the path holds a malformed percent-encoding' };
    }
    if (decoded === '.' || decoded === '..') return { error: 'dot segments (. and ..) are not allowed in the path' };
    // A trailing slash is a real path (/api/ lists like /api); an empty segment elsewhere is `//`.
    if (seg === '' && i !== rest.length - 1) return { error: 'empty path segments (//) are not allowed' };
  }
  if (
    rest.length >= 7 &&
    rest[6] === 'proxy-service' &&
    rest[0] === 'api' &&
    rest[1] === 'v1' &&
    rest[2] === 'namespaces' &&
    rest[4] === 'services'
  ) {
    const service = parseService(rest[3]!, rest[5]!);
    if ('error' in service) return service;
    const servicePath = `/${rest.slice(7).join('/')}${query}`;
    // The apiserver under its Service name is the apiserver, with impersonation like the kube form.
    if (service.namespace === 'default' && service.name === 'kubernetes') return { cluster, path: servicePath };
    return { cluster, path: servicePath, service };
  }
  const path = rest.length === 0 ? '/' : `/${rest.join('/')}`;
  return { cluster, path: `${path}${query}` };
}

/** `[proto:]name[:port]` in namespace `ns` (Kubernetes' SplitSchemeNamePort, with a numeric port). */
function parseService(ns: string, spec: string): ServiceTarget | { error: string } {
  const parts = spec.split(':');
  if (parts.length > 3) return { error: `service "${spec}" must be [http:|https:]NAME[:PORT]` };
  const [protocol, name, portText] = parts.length === 3 ? parts : parts.length === 2 ? ['', parts[0]!, parts[1]!] : ['', parts[0]!, ''];
  if (protocol !== '' && protocol !== 'http' && protocol !== 'https')
    return { error: `service protocol "${protocol}" must be http or https` };
  if (!DNS_LABEL.test(ns)) return { error: `namespace "${ns}" is not a namespace name (a DNS-1123 label)` };
  if (!DNS_LABEL.test(name!)) return { error: `service name "${name}" is not a Service name (a DNS-1123 label)` };
  const proto = protocol === 'http' ? 'http' : 'https';
  if (portText !== '' && !/^\d{1,5}$/.test(portText!))
    return { error: `service port "${portText}" must be a port number (named ports are not resolved)` };
  const port = portText === '' ? (proto === 'http' ? 80 : 443) : Number(portText);
  if (port < 1 || port > 65535) return { error: `service port ${port} is out of range` };
  return { protocol: proto, namespace: ns, name: name!, port };
}

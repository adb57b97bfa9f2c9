// The gateway's request target: `/<cluster>/<kube path>?<query>` → the cluster and the target sent on
// to its apiserver. Anything that could mean a different path to a proxy or a server than to us is
// refused rather than normalised: dot segments (plain or percent-encoded), encoded slashes and
// backslashes, empty segments, control characters, and absolute-form or `*` targets.

/** DNS-1123 label: what a managed cluster name is (it names a namespace and a Service). */
const CLUSTER_NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export type GatewayTarget = { cluster: string; path: string } | { error: string };

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
  const path = rest.length === 0 ? '/' : `/${rest.join('/')}`;
  return { cluster, path: `${path}${query}` };
}

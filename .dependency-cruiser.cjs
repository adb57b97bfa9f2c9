// The layers of the code, checked in CI (`pnpm check-layers`). Each rule names what may not import what;
// a module may always import from its own folder and from the layers below it.
//
//   packages:      cli → server, agent, client → proto          (test/ may import any of them, by their entry points)
//   proto/src:     index.ts                                      the public surface
//                  grpc/ → mux/ → conn/ → flow/ → wire/, runtime/, http/   gRPC, our framed transport, connection tables, flow control, the wire format
//   server/src:    proxy-server.ts, hub.ts, index.ts, parsers.ts the hub's wiring and public surface
//                  ocm/                                          OCM's addon framework, our half
//                  addon/   connect/   gateway/                  addon manager; the CONNECT and HTTP gateway frontends
//                  fleet/                                        hub API, registration, replicas, tokens
//                  dataplane/                                    the core, its mux and gRPC frontends, agent streams
//                  pki/   store/   egress/   http/               certificates, the store, egress settings, HTTP helpers
/** Folders inside a package, lowest first; a folder may import only from its own folder and earlier layers. */
const LAYERS = {
  'proto/src/': [['wire', 'runtime', 'http'], ['flow'], ['conn'], ['mux'], ['h2'], ['grpc']],
  'server/src/': [['pki', 'store', 'http'], ['egress'], ['dataplane'], ['fleet'], ['addon', 'connect', 'gateway'], ['ocm']],
};
/** Each package's top-level modules that wire its folders together or are its public surface. */
const TOP = { 'proto/src/': 'index', 'server/src/': 'proxy-server|hub|index|parsers' };

/** Per folder: no import of a folder of a higher layer or another folder of its own layer (tests excepted); and
 * no folder imports the package's top-level modules (its wiring and public surface). */
function layerRules() {
  const rules = [];
  for (const [pkg, layers] of Object.entries(LAYERS)) {
    layers.forEach((layer, i) => {
      const above = layers.slice(i + 1).flat();
      for (const folder of layer) {
        const forbidden = [...above, ...layer.filter((f) => f !== folder)];
        rules.push({
          name: `layer-${pkg.split('/')[0]}-${folder}`,
          comment: `${pkg}${folder}/ imports only its own folder and the layers below it`,
          severity: 'error',
          from: { path: `^${pkg}${folder}/`, pathNot: '\\.test\\.ts$' },
          to: { path: `^${pkg}(${forbidden.join('|')})/` },
        });
      }
    });
    rules.push({
      name: `layer-${pkg.split('/')[0]}-top`,
      comment: `the folders of ${pkg} never import its top-level modules (the wiring and the public surface)`,
      severity: 'error',
      from: { path: `^${pkg}[^/]+/`, pathNot: '\\.test\\.ts$' },
      to: { path: `^${pkg}(${TOP[pkg]})\\.ts$` },
    });
  }
  return rules;
}

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'no two modules import each other, directly or through others (type-only imports included)',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'proto-is-the-base',
      comment: 'proto/ imports no other package of ours',
      severity: 'error',
      from: { path: '^proto/' },
      to: { path: '^(server|agent|client|cli|test)/' },
    },
    {
      name: 'server-agent-client-below-cli',
      comment: 'server/, agent/ and client/ import only proto/ of ours, never each other, cli/ or test/ (their tests may use fixtures)',
      severity: 'error',
      from: { path: '^(server|agent|client)/', pathNot: '\\.test\\.ts$' },
      to: { path: '^(cli|test)/' },
    },
    // server/, agent/ and client/ never import each other; their tests may use the others by name to run a hub or an agent.
    ...['server', 'agent', 'client'].map((pkg) => ({
      name: `${pkg}-not-its-siblings`,
      severity: 'error',
      from: { path: `^${pkg}/`, pathNot: '\\.test\\.ts$' },
      to: { path: `^(${['server', 'agent', 'client'].filter((p) => p !== pkg).join('|')})/` },
    })),
    {
      name: 'cli-not-test',
      severity: 'error',
      from: { path: '^cli/' },
      to: { path: '^test/' },
    },
    {
      name: 'no-test-code-in-product',
      comment: 'product code never imports a test file',
      severity: 'error',
      from: { path: '^(proto|server|agent|client|cli)/src/', pathNot: '\\.test\\.ts$' },
      to: { path: '\\.test\\.ts$' },
    },
    {
      name: 'packages-by-their-entry-points',
      comment: 'another package is imported by its name (@cluster-proxy/x and its exported subpaths), never by a path into its src/',
      severity: 'error',
      from: { path: '^(proto|server|agent|client|cli|test)/' },
      to: { path: '^(proto|server|agent|client|cli)/src/', pathNot: ['^$1/', '^cli/src/memory/native-calls\\.ts$'], dependencyTypesNot: ['aliased'] },
    },
    ...layerRules(),
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '(^|/)(dist|node_modules)/|\\.d\\.ts$' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.depcruise.json' },
    combinedDependencies: false,
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'types', 'default'],
      extensions: ['.ts', '.js'],
    },
  },
};

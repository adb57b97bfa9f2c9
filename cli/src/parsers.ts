// The CLI's readers and writers of user-supplied text: the --config file and the kubeconfig it writes
// for a token. A subpath of the package (`@cluster-proxy/cli/parsers`) for the fuzz targets (test/fuzz);
// importing it starts nothing (main.ts is the command).
export { parseConfigYaml, type ConfigScalar, type ConfigValue } from './config-file.js';
export { buildKubeconfig, proxyUrl, type KubeconfigOptions } from './kubeconfig.js';

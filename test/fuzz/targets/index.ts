// Every fuzz target, in the order the runner and the suite run them.
import type { FuzzTarget } from '../engine.js';
import { caBundleTarget, configFileTarget, proxyEnvTarget } from './config.js';
import { gatewayIdentityTarget } from './gateway-identity.js';
import { h2SessionTarget, hpackTarget } from './h2.js';
import { hubApiTarget } from './hub-api.js';
import { kubeconfigTarget } from './kubeconfig.js';
import { connectHeadTarget, gatewayHeadersTarget, gatewayTargetTarget, upgradeAnswerTarget } from './http-heads.js';
import { packetCodecTarget } from './packets.js';
import { grpcMessagesTarget, muxFramesTarget } from './streams.js';

export const TARGETS: readonly FuzzTarget[] = [
  packetCodecTarget,
  muxFramesTarget,
  grpcMessagesTarget,
  hpackTarget,
  h2SessionTarget,
  connectHeadTarget,
  gatewayTargetTarget,
  gatewayHeadersTarget,
  gatewayIdentityTarget,
  upgradeAnswerTarget,
  proxyEnvTarget,
  configFileTarget,
  kubeconfigTarget,
  caBundleTarget,
  hubApiTarget,
];

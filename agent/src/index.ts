export { Agent, type AgentOptions, type AgentStatus } from './agent.js';
export { startAgentHealthServer } from './health.js';
export { Allowlist, AllowlistError } from './allowlist.js';
export { TargetDialer, DialFailure } from './target-dialer.js';
export { Backoff } from './backoff.js';
export { type AgentTransport } from './links.js';

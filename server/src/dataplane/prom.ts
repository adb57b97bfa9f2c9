// prom-client's metric classes, loaded without its index. The index also loads what the hub does not
// use (its default collectors with the OpenTelemetry API, the pushgateway, summaries, the cluster
// aggregator): ~2 MiB of the hub's RSS at start. These are prom-client's own classes, from the version
// pinned in package.json; process metrics come from proto's prometheus.ts.
import { createRequire } from 'node:module';
import type * as PromClient from 'prom-client';

const load = createRequire(import.meta.url);

export const Counter = load('prom-client/lib/counter') as typeof PromClient.Counter;
export type Counter<T extends string = string> = PromClient.Counter<T>;
export const Gauge = load('prom-client/lib/gauge') as typeof PromClient.Gauge;
export type Gauge<T extends string = string> = PromClient.Gauge<T>;
export const Histogram = load('prom-client/lib/histogram') as typeof PromClient.Histogram;
export type Histogram<T extends string = string> = PromClient.Histogram<T>;
export const Registry = load('prom-client/lib/registry') as typeof PromClient.Registry;
export type Registry = PromClient.Registry;

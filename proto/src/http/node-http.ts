// node:http, loaded so that its unused getters stay unread.
//
// An ES-module import of a built-in makes Node read every export to build the module's namespace, and
// node:http's `WebSocket`, `CloseEvent` and `MessageEvent` are getters that load undici (Node's fetch
// and WebSocket client): ~16 MiB of RSS in every process that imports node:http that way (7 MiB
// anonymous, the rest the binary's pages), although nothing here uses them. Through require they are
// never read. Code that needs node:http at run time takes it from here; types may still be imported.
import { createRequire } from 'node:module';
import type * as NodeHttp from 'node:http';

export const http: typeof NodeHttp = createRequire(import.meta.url)('node:http') as typeof NodeHttp;

// The hub store: one interface, two implementations (embedded on local disk, Kubernetes API), both
// held to one conformance suite (test/src/store-conformance.ts). Semantics follow the Kubernetes API so the
// two behave the same: optimistic concurrency on resourceVersion, status written separately,
// watches that deliver every change after a given resourceVersion.
import type { Kind, ObjectOfKind } from './objects.js';

export interface ObjectKey {
  name: string;
  /** Required for namespaced kinds, absent for cluster-scoped ones. */
  namespace?: string;
}

export interface ListOptions {
  /** Only this namespace (namespaced kinds); all namespaces when absent. */
  namespace?: string;
  /** Equality selector on labels: every pair must match. */
  labels?: Record<string, string>;
}

export interface ListResult<K extends Kind> {
  items: ObjectOfKind<K>[];
  /** Start a watch from here to see every change after this list. */
  resourceVersion: string;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface WatchEvent<K extends Kind> {
  type: WatchEventType;
  object: ObjectOfKind<K>;
}

export interface WatchOptions extends ListOptions {
  /** Deliver changes after this version; absent = an ADDED event for every current object first. */
  resourceVersion?: string;
}

export interface StatusOptions {
  /** 'approval': CertificateSigningRequest only. */
  subresource?: 'status' | 'approval';
}

export interface Watch {
  /** Stops delivery; no callback is called after it returns. Idempotent. */
  stop(): void;
}

export interface WatchHandlers<K extends Kind> {
  onEvent(event: WatchEvent<K>): void;
  /**
   * The watch ended and cannot resume by itself (e.g. the version it would resume from is too old:
   * `GoneError`). The caller lists again and starts a new watch. Not called after stop().
   */
  onError?(err: Error): void;
}

export interface Store {
  /** Which implementation, for logs and `/readyz` ("embedded" | "kubernetes"; "memory" in tests). */
  readonly kind: 'embedded' | 'kubernetes' | 'memory';
  get<K extends Kind>(kind: K, key: ObjectKey): Promise<ObjectOfKind<K> | null>;
  list<K extends Kind>(kind: K, opts?: ListOptions): Promise<ListResult<K>>;
  /** AlreadyExistsError if the name is taken. Ignores `status` on kinds with a status subresource. */
  create<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>>;
  /**
   * Replaces metadata (labels, annotations, finalizers) and spec; keeps status. ConflictError when
   * `metadata.resourceVersion` is set and stale; NotFoundError when gone.
   */
  update<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>>;
  /**
   * Replaces only status, with the same concurrency rules as update(). A CertificateSigningRequest's
   * Approved/Denied conditions change only through `{ subresource: 'approval' }` (which changes nothing
   * else), as in Kubernetes.
   */
  updateStatus<K extends Kind>(kind: K, obj: ObjectOfKind<K>, opts?: StatusOptions): Promise<ObjectOfKind<K>>;
  /** NotFoundError when absent; ConflictError when `resourceVersion` is given and stale. */
  delete<K extends Kind>(kind: K, key: ObjectKey, opts?: { resourceVersion?: string }): Promise<void>;
  watch<K extends Kind>(kind: K, opts: WatchOptions, handlers: WatchHandlers<K>): Watch;
  /**
   * Makes sure a namespace exists before namespaced objects go into it (a cluster's namespace, the
   * hub's own). The Kubernetes API needs the Namespace object; the embedded store has implicit ones.
   */
  ensureNamespace(name: string): Promise<void>;
  /** Cheap round trip for `/readyz`: throws when the store cannot be reached. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

export class StoreError extends Error {
  constructor(
    message: string,
    readonly code: 'NotFound' | 'AlreadyExists' | 'Conflict' | 'Gone' | 'Invalid' | 'Unavailable',
  ) {
    super(message);
    this.name = `${code}Error`;
  }
}
export class NotFoundError extends StoreError {
  constructor(message: string) {
    super(message, 'NotFound');
  }
}
export class AlreadyExistsError extends StoreError {
  constructor(message: string) {
    super(message, 'AlreadyExists');
  }
}
export class ConflictError extends StoreError {
  constructor(message: string) {
    super(message, 'Conflict');
  }
}
/** A watch asked to resume from a version the store no longer has. */
export class GoneError extends StoreError {
  constructor(message: string) {
    super(message, 'Gone');
  }
}
export class InvalidError extends StoreError {
  constructor(message: string) {
    super(message, 'Invalid');
  }
}
export class UnavailableError extends StoreError {
  constructor(message: string) {
    super(message, 'Unavailable');
  }
}

/** "Kind ns/name" for error messages. */
export function describeKey(kind: Kind, key: ObjectKey): string {
  return `${kind} ${key.namespace ? `${key.namespace}/` : ''}${key.name}`;
}

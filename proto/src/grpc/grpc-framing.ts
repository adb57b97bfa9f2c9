// gRPC over HTTP/2 as our server (hub) and our client (SDK, agent) speak it on node:http2, without
// grpc-js: status codes, `grpc-message` and `grpc-timeout` encoding, and the length-prefixed message
// framing around our packet codec (one 5-byte prefix, then the encoded packet, written corked so the
// parts leave in one DATA frame where they fit).
import type { Writable } from 'node:stream';
import { ChunkQueue } from '../flow/chunk-queue.js';
import { DataViews, decodePacket, encodeDataHeader, encodePacketParts } from '../wire/codec.js';
import type { DataViewHandler } from '../mux/framing.js';
import { packets, type Packet } from '../wire/packet.js';

/** gRPC status codes. */
export const GrpcStatus = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;
export type GrpcStatusName = keyof typeof GrpcStatus;

/** Status codes by number as ANP (Go's codes.Code.String()) spells them, for metric labels. */
const GO_CODE_NAMES = [
  'OK',
  'Canceled',
  'Unknown',
  'InvalidArgument',
  'DeadlineExceeded',
  'NotFound',
  'AlreadyExists',
  'PermissionDenied',
  'ResourceExhausted',
  'FailedPrecondition',
  'Aborted',
  'OutOfRange',
  'Unimplemented',
  'Internal',
  'Unavailable',
  'DataLoss',
  'Unauthenticated',
];

/** "Unavailable" for 14: Go's spelling, as ANP labels stream errors ("Unknown" outside the table). */
export function grpcCodeName(code: number | undefined): string {
  return (code !== undefined && GO_CODE_NAMES[code]) || 'Unknown';
}

/** "UNAVAILABLE" for 14 (the number itself for codes outside the table). */
export function grpcStatusName(code: number): string {
  for (const [name, value] of Object.entries(GrpcStatus)) if (value === code) return name;
  return String(code);
}

/** A call's final status; `details` is the decoded `grpc-message`. */
export interface GrpcCallStatus {
  code: number;
  details: string;
  /** Trailers (or trailers-only headers) as received; empty when the status was made up locally. */
  metadata: Record<string, string[]>;
}

/** What a failed call reports ('error' event): an Error with the status. */
export class GrpcCallError extends Error {
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${grpcStatusName(code)}: ${details}`);
    this.name = 'GrpcCallError';
  }
}

/** grpc-message is percent-encoded outside printable ASCII (and '%' itself). */
export function encodeGrpcMessage(s: string): string {
  return s.replace(/[^\x20-\x24\x26-\x7e]/gu, (c) => encodeURIComponent(c));
}

export function decodeGrpcMessage(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** `grpc-timeout` in milliseconds: up to 8 digits and a unit (H, M, S, m, u, n); null if absent or malformed. */
export function parseGrpcTimeout(value: string | undefined): number | null {
  const m = /^(\d{1,8})([HMSmun])$/.exec(value ?? '');
  if (!m) return null;
  const unit = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 }[m[2] as 'H'];
  return Number(m[1]) * unit;
}

/** The gRPC code for an HTTP status that came without grpc-status (gRPC's HTTP-to-gRPC mapping). */
export function grpcStatusFromHttp(status: number): number {
  switch (status) {
    case 400:
      return GrpcStatus.INTERNAL;
    case 401:
      return GrpcStatus.UNAUTHENTICATED;
    case 403:
      return GrpcStatus.PERMISSION_DENIED;
    case 404:
      return GrpcStatus.UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return GrpcStatus.UNAVAILABLE;
    default:
      return GrpcStatus.UNKNOWN;
  }
}

const HEADER_BYTES = 5;

/** Writes `p` as one gRPC message; returns write()'s answer (false: wait for 'drain'). */
export function writeGrpcMessage(stream: Writable, p: Packet, callback?: (err?: Error | null) => void): boolean {
  return writeParts(stream, grpcMessageParts(p), callback);
}

/** Writes a DATA packet whose `length` (> 0) payload bytes are `chunks` as one gRPC message, without copying them. */
export function writeGrpcData(
  stream: Writable,
  connectID: number,
  chunks: readonly Buffer[],
  length: number,
  callback?: (err?: Error | null) => void,
): boolean {
  return writeParts(stream, grpcDataParts(connectID, chunks, length), callback);
}

/** One gRPC message as the pieces to send: the 5-byte prefix, then the encoded packet; `length` in all. */
export interface GrpcMessageParts {
  parts: Buffer[];
  length: number;
}

/** `p` as one gRPC message's pieces. */
export function grpcMessageParts(p: Packet): GrpcMessageParts {
  const packet = encodePacketParts(p);
  let length = 0;
  for (const b of packet) length += b.length;
  return { parts: [messagePrefix(length), ...packet], length: HEADER_BYTES + length };
}

/** A DATA packet whose `length` payload bytes are `chunks` as one gRPC message's pieces (the chunks not copied). */
export function grpcDataParts(connectID: number, chunks: readonly Buffer[], length: number): GrpcMessageParts {
  const header = encodeDataHeader(connectID, length);
  const total = header.length + length;
  return { parts: [messagePrefix(total), header, ...chunks], length: HEADER_BYTES + total };
}

function messagePrefix(length: number): Buffer {
  const prefix = Buffer.allocUnsafe(HEADER_BYTES);
  prefix[0] = 0; // not compressed
  prefix.writeUInt32BE(length, 1);
  return prefix;
}

function writeParts(stream: Writable, { parts }: GrpcMessageParts, callback?: (err?: Error | null) => void): boolean {
  stream.cork();
  for (let i = 0; i < parts.length - 1; i++) stream.write(parts[i]);
  const ok = stream.write(parts[parts.length - 1], callback);
  stream.uncork();
  return ok;
}

/** A message we refuse, with the status to answer it with. */
export class GrpcFramingError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
    this.name = 'GrpcFramingError';
  }
}

/**
 * Hands a message the reader produced to a call's reader: DataViews to `views`, or, when that handler
 * went after the message was read, as one DATA packet to the call's 'data'; anything else to 'data'.
 */
export function deliverMessage(
  m: Packet | DataViews,
  views: DataViewHandler | null,
  call: { emit(event: 'data', p: Packet): unknown },
): void {
  if (!(m instanceof DataViews)) call.emit('data', m);
  else if (views) views(m.connectID, m.chunks, m.length);
  else call.emit('data', packets.data(m.connectID, Buffer.concat(m.chunks, m.length)));
}

/**
 * Splits received bytes into packets (HTTP/2 DATA frames are at most 16 KiB by default, so a message
 * often spans several). What is held is bounded by the largest message allowed plus one chunk.
 */
export class GrpcMessageReader {
  /**
   * While true, a DATA message comes out as DataViews: its payload as views of the HTTP/2 chunks it
   * spans (a 256 KiB message spans 16 frames or more) instead of copied into one Buffer. Only the
   * layout our encoder and Go's protobuf write is read so (decodeDataHeader); any other message is
   * decoded as a Packet.
   */
  views = false;
  private readonly received = new ChunkQueue();

  constructor(private readonly maxMessageBytes: number) {}

  /** Adds `chunk` and appends every message now complete to `out` (DataViews only with `views`); throws GrpcFramingError on a bad message. */
  push(chunk: Buffer, out: (Packet | DataViews)[]): void {
    this.received.push(chunk);
    while (this.received.length >= HEADER_BYTES) {
      const head = this.received.peek(HEADER_BYTES);
      const length = head.readUInt32BE(1);
      if (head[0] !== 0)
        throw new GrpcFramingError(GrpcStatus.UNIMPLEMENTED, 'compressed messages are not supported (send grpc-encoding identity)');
      if (length > this.maxMessageBytes)
        throw new GrpcFramingError(
          GrpcStatus.RESOURCE_EXHAUSTED,
          `Received message larger than max (${length} vs. ${this.maxMessageBytes})`,
        );
      if (this.received.length < HEADER_BYTES + length) return;
      this.received.take(HEADER_BYTES);
      const data = this.views ? this.received.takeDataViews(length) : null;
      if (data) {
        out.push(data);
        continue;
      }
      const message = this.received.take(length);
      try {
        out.push(decodePacket(message));
      } catch (err) {
        throw new GrpcFramingError(GrpcStatus.INTERNAL, `cannot deserialize the message: ${(err as Error).message}`);
      }
    }
  }

  /** Bytes of an incomplete message held (a stream that ends with some left was cut short). */
  get pending(): number {
    return this.received.length;
  }

  clear(): void {
    this.received.clear();
  }
}

// Typed view of ANP's Packet (client.proto). `random` is an int64 chosen by clients (Go uses
// rand.Int63), so it is a bigint; connection IDs are assigned by agents counting up from 1, so
// they are plain numbers (the codec rejects values beyond Number.MAX_SAFE_INTEGER).

export enum PacketType {
  DIAL_REQ = 0,
  DIAL_RSP = 1,
  CLOSE_REQ = 2,
  CLOSE_RSP = 3,
  DATA = 4,
  DIAL_CLS = 5,
  DRAIN = 6,
  /** extension, capability "credit" */
  CREDIT = 100,
  /** extension, capability "half-close" */
  HALF_CLOSE = 101,
}

export interface DialRequest {
  protocol: string;
  address: string;
  random: bigint;
}
/** `reason` is our extension field (100); ANP peers leave it empty. */
export interface DialResponse {
  error: string;
  connectID: number;
  random: bigint;
  reason: string;
}
export interface CloseRequest {
  connectID: number;
}
export interface CloseResponse {
  error: string;
  connectID: number;
}
export interface CloseDial {
  random: bigint;
}
export interface Data {
  connectID: number;
  error: string;
  data: Buffer;
}
export interface Credit {
  connectID: number;
  bytes: number;
}
export interface HalfClose {
  connectID: number;
}

export type Packet =
  | { type: PacketType.DIAL_REQ; dialRequest: DialRequest }
  | { type: PacketType.DIAL_RSP; dialResponse: DialResponse }
  | { type: PacketType.CLOSE_REQ; closeRequest: CloseRequest }
  | { type: PacketType.CLOSE_RSP; closeResponse: CloseResponse }
  | { type: PacketType.DATA; data: Data }
  | { type: PacketType.DIAL_CLS; closeDial: CloseDial }
  | { type: PacketType.DRAIN }
  | { type: PacketType.CREDIT; credit: Credit }
  | { type: PacketType.HALF_CLOSE; halfClose: HalfClose };

export function packetTypeName(type: number): string {
  return PacketType[type] ?? `UNKNOWN(${type})`;
}

// Constructors keep call sites short and the defaults in one place.
export const packets = {
  dialRequest: (address: string, random: bigint, protocol = 'tcp'): Packet => ({
    type: PacketType.DIAL_REQ,
    dialRequest: { protocol, address, random },
  }),
  dialResponse: (random: bigint, connectID: number, error = '', reason = ''): Packet => ({
    type: PacketType.DIAL_RSP,
    dialResponse: { random, connectID, error, reason },
  }),
  closeRequest: (connectID: number): Packet => ({ type: PacketType.CLOSE_REQ, closeRequest: { connectID } }),
  closeResponse: (connectID: number, error = ''): Packet => ({ type: PacketType.CLOSE_RSP, closeResponse: { connectID, error } }),
  data: (connectID: number, data: Buffer): Packet => ({ type: PacketType.DATA, data: { connectID, error: '', data } }),
  closeDial: (random: bigint): Packet => ({ type: PacketType.DIAL_CLS, closeDial: { random } }),
  drain: (): Packet => ({ type: PacketType.DRAIN }),
  credit: (connectID: number, bytes: number): Packet => ({ type: PacketType.CREDIT, credit: { connectID, bytes } }),
  halfClose: (connectID: number): Packet => ({ type: PacketType.HALF_CLOSE, halfClose: { connectID } }),
};

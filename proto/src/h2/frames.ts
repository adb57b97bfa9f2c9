// HTTP/2's frame layout and codes (RFC 9113), as our HTTP/2 session reads and writes them.

export const FrameType = {
  DATA: 0x0,
  HEADERS: 0x1,
  PRIORITY: 0x2,
  RST_STREAM: 0x3,
  SETTINGS: 0x4,
  PUSH_PROMISE: 0x5,
  PING: 0x6,
  GOAWAY: 0x7,
  WINDOW_UPDATE: 0x8,
  CONTINUATION: 0x9,
} as const;

export const Flags = {
  END_STREAM: 0x1,
  ACK: 0x1,
  END_HEADERS: 0x4,
  PADDED: 0x8,
  PRIORITY: 0x20,
} as const;

export const SettingId = {
  HEADER_TABLE_SIZE: 0x1,
  ENABLE_PUSH: 0x2,
  MAX_CONCURRENT_STREAMS: 0x3,
  INITIAL_WINDOW_SIZE: 0x4,
  MAX_FRAME_SIZE: 0x5,
  MAX_HEADER_LIST_SIZE: 0x6,
} as const;

export const H2Error = {
  NO_ERROR: 0x0,
  PROTOCOL_ERROR: 0x1,
  INTERNAL_ERROR: 0x2,
  FLOW_CONTROL_ERROR: 0x3,
  SETTINGS_TIMEOUT: 0x4,
  STREAM_CLOSED: 0x5,
  FRAME_SIZE_ERROR: 0x6,
  REFUSED_STREAM: 0x7,
  CANCEL: 0x8,
  COMPRESSION_ERROR: 0x9,
  CONNECT_ERROR: 0xa,
  ENHANCE_YOUR_CALM: 0xb,
  INADEQUATE_SECURITY: 0xc,
  HTTP_1_1_REQUIRED: 0xd,
} as const;

/** What a client sends first on every HTTP/2 connection. */
export const CLIENT_PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
export const FRAME_HEADER_BYTES = 9;
/** Every window's size before SETTINGS or WINDOW_UPDATE change it. */
export const DEFAULT_WINDOW = 65_535;
export const MAX_WINDOW = 2 ** 31 - 1;
/** The largest frame payload a peer may send before it is told otherwise (and what we announce). */
export const DEFAULT_MAX_FRAME = 16_384;
export const MAX_FRAME_LIMIT = 2 ** 24 - 1;

/** A frame's 9-byte header. */
export function frameHeader(length: number, type: number, flags: number, streamId: number): Buffer {
  return writeHeader(Buffer.allocUnsafe(FRAME_HEADER_BYTES), length, type, flags, streamId);
}

/** A whole frame whose payload is `payload`. */
export function frame(type: number, flags: number, streamId: number, payload?: Buffer): Buffer {
  const length = payload?.length ?? 0;
  const b = writeHeader(Buffer.allocUnsafe(FRAME_HEADER_BYTES + length), length, type, flags, streamId);
  if (payload) payload.copy(b, FRAME_HEADER_BYTES);
  return b;
}

function writeHeader(b: Buffer, length: number, type: number, flags: number, streamId: number): Buffer {
  b[0] = length >>> 16;
  b[1] = (length >>> 8) & 0xff;
  b[2] = length & 0xff;
  b[3] = type;
  b[4] = flags;
  b.writeUInt32BE(streamId, 5);
  return b;
}

export function settingsPayload(settings: readonly (readonly [id: number, value: number])[]): Buffer {
  const b = Buffer.allocUnsafe(6 * settings.length);
  settings.forEach(([id, value], i) => {
    b.writeUInt16BE(id, 6 * i);
    b.writeUInt32BE(value, 6 * i + 2);
  });
  return b;
}

export function u32(value: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(value >>> 0, 0);
  return b;
}

export function goawayPayload(lastStreamId: number, code: number, debug = ''): Buffer {
  const text = Buffer.from(debug, 'utf8');
  const b = Buffer.allocUnsafe(8 + text.length);
  b.writeUInt32BE(lastStreamId & MAX_WINDOW, 0);
  b.writeUInt32BE(code >>> 0, 4);
  text.copy(b, 8);
  return b;
}

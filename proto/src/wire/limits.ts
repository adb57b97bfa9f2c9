// Sizes shared by every peer of ours. They are defaults; a process may be configured otherwise.

/** Largest DATA payload we send: big enough to keep per-message overhead low, small enough to
 * interleave fairly with other connections on a shared stream. */
export const MAX_DATA_CHUNK = 256 * 1024;

/** Largest gRPC message we accept. grpc-go's default receive limit is 4 MiB; ANP clients send one
 * DATA per Write with no cap, so we accept a little more than that. Larger is a protocol error. */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024 + 1024;

/** Per-connection credit window a connection starts with (announced in the handshake). Small, so
 * that connections whose reader stops hold little; a connection that moves data grows its window
 * from the process's memory budget (memory-budget.ts). */
export const INITIAL_CONNECTION_WINDOW = 32 * 1024;

/** Largest per-connection window. At 20 ms RTT, 4 MiB in flight allows ~200 MB/s. */
export const MAX_CONNECTION_WINDOW = 4 * 1024 * 1024;

/** Bytes a process holds on behalf of its peers, by default (flag `--memory-budget`). */
export const AGENT_MEMORY_BUDGET = 64 * 1024 * 1024;
export const HUB_MEMORY_BUDGET = 256 * 1024 * 1024;

/** HTTP/2 windows we ask for on every session (stream and connection level). They only cap what
 * can be in flight; memory is bounded by the per-connection credit above, because every reader
 * consumes the shared stream at once. */
export const HTTP2_STREAM_WINDOW = 32 * 1024 * 1024;
export const HTTP2_CONNECTION_WINDOW = 64 * 1024 * 1024;
/** Receive window a gRPC client session on the hub's frontend starts with, for its first stream: a
 * konnectivity-client opens a session (and a TLS connection) per proxied connection, and one whose
 * destination stops reading holds this much at the hub beside the agent's window, unless its session grew
 * it from the budget once a MiB went through (session-window.ts in server). A fourth of a connection's
 * window: a fifth less hub memory per such stuck connection (docs/measurements/log.md), for an upload whose
 * first MiB goes at 8 KiB per round trip. A session with several streams (our SDK) gives them
 * INITIAL_CONNECTION_WINDOW. */
export const FRONTEND_STREAM_WINDOW = 8 * 1024;

/** Receive window our SDK asks for: enough for ~400 MB/s at 20 ms, and the most a client that
 * stops reading one connection holds in memory for it. */
export const CLIENT_HTTP2_WINDOW = 8 * 1024 * 1024;

/**
 * After DIAL_RSP, how long the destination's first bytes wait before going to an ANP client (one that
 * did not negotiate half-close: konnectivity-client), unless the client writes first. konnectivity-client's
 * receive loop hands DIAL_RSP to the dialing goroutine and reads on; that goroutine registers the
 * connection only afterwards, so a DATA right behind DIAL_RSP is "not recognized": dropped, and the
 * connection closed (a server-first destination lost its first bytes or all of them). Its own Write
 * comes only after the registration, so client-first traffic never waits. The hub holds them towards such a
 * client; our agent holds them behind ANP's proxy-server, which passes them straight on.
 */
export const KONNECTIVITY_FIRST_DATA_HOLD_MS = 50;

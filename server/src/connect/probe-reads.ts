// What the CONNECT frontend's probes read from clients that wait for credit (connection.ts). A paused
// socket is out of the event loop, so now and then it is read one chunk at a time to see whether the
// client left (its FIN behind a little data); those bytes are kept for the agent. Each connection may
// read up to `perConnection` that way, and all of them together up to `total`: a thousand clients
// waiting on a stuck destination must not hold a thousand allowances (past it, a probe only asks the
// kernel whether the client reset the connection).
export class ProbeReads {
  private readonly byConnection = new Map<object, number>();
  private heldBytes = 0;

  constructor(
    readonly perConnection: number,
    readonly total: number,
  ) {}

  /** Bytes read by probes, not yet passed on, over all connections. */
  get held(): number {
    return this.heldBytes;
  }

  mayRead(conn: object): boolean {
    return (this.byConnection.get(conn) ?? 0) < this.perConnection && this.heldBytes < this.total;
  }

  read(conn: object, bytes: number): void {
    this.byConnection.set(conn, (this.byConnection.get(conn) ?? 0) + bytes);
    this.heldBytes += bytes;
  }

  /** The connection's credit came back (what its probes read goes on to the agent) or it closed. */
  release(conn: object): void {
    const bytes = this.byConnection.get(conn);
    if (bytes === undefined) return;
    this.byConnection.delete(conn);
    this.heldBytes -= bytes;
  }
}

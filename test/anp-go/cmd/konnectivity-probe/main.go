// konnectivity-probe dials through an ANP frontend (ours or ANP's proxy-server) with ANP's own
// konnectivity-client, the way kube-apiserver's egress selector does: one single-use gRPC tunnel per
// dial, over a Unix socket without TLS (kube-apiserver's gRPC egress transport) or over mTLS.
// Each scenario prints one JSON object on stdout and exits 0; the test judges it. Exit 2 is a usage
// error.
//
//	konnectivity-probe --uds PATH <scenario> [flags]
//	konnectivity-probe --address HOST:PORT --ca F --cert F --key F [--server-name N] <scenario> [flags]
//
// konnectivity-client's own log (klog) goes to stderr; -v=5 before the scenario traces its packets.
//
// Scenarios (--dest HOST:PORT is the destination the frontend dials):
//
//	echo      write --message, read it back from an echo destination, Close()
//	bulk      write --bytes of seeded random data to an echo destination while reading the echo; sha256 both
//	upload    write "<n>\n" and --bytes to a digest destination, which answers the sha256 hex and closes;
//	          read until EOF (the destination's close, as CLOSE_RSP), then Close()
//	download  read until EOF from a destination that sends and closes; report bytes and sha256; with
//	          --count N, N such dials at once, reporting how many got each (bytes, sha256)
//	flood     --count parallel dials, each its own tunnel, each echoing a distinct 1 KiB message
//	dial      one dial; report whether it failed, the error and konnectivity-client's failure reason
//	stuck     the bench's stuck-destination clients (stuck.go): --count dials, --concurrency at a time,
//	          written into with --chunk bytes per Write for --seconds, up to --limit bytes each; JSON lines
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

type frontend struct {
	uds     string
	address string
	tls     *tls.Config
}

// dial opens one single-use tunnel and one connection in it, as kube-apiserver's grpc egress dialer does.
func (f frontend) dial(ctx context.Context, dest string) (net.Conn, error) {
	return f.dialIn(ctx, context.TODO(), dest)
}

// dialIn is dial with the tunnel's lifetime given: cancelling tunnelCtx ends the tunnel.
func (f frontend) dialIn(ctx, tunnelCtx context.Context, dest string) (net.Conn, error) {
	opts := []grpc.DialOption{grpc.WithBlock(), grpc.WithReturnConnectionError(), grpc.WithTimeout(30 * time.Second)}
	target := f.address
	if f.uds != "" {
		uds := f.uds
		target = uds
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", uds)
			}))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(f.tls)))
	}
	tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(context.TODO(), tunnelCtx, target, opts...)
	if err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	return tunnel.DialContext(ctx, "tcp", dest)
}

type result map[string]any

func main() {
	fs := flag.NewFlagSet("konnectivity-probe", flag.ContinueOnError)
	uds := fs.String("uds", "", "frontend Unix socket (no TLS)")
	address := fs.String("address", "", "frontend HOST:PORT (mTLS)")
	ca := fs.String("ca", "", "CA certificate of the frontend")
	cert := fs.String("cert", "", "client certificate")
	key := fs.String("key", "", "client key")
	serverName := fs.String("server-name", "localhost", "TLS server name")
	// konnectivity-client logs with klog: -v=5 traces every packet it receives (on stderr).
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil || fs.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: konnectivity-probe (--uds PATH | --address H:P --ca F --cert F --key F) SCENARIO [flags]")
		os.Exit(2)
	}
	f := frontend{uds: *uds, address: *address}
	if f.uds == "" {
		cfg, err := tlsConfig(*ca, *cert, *key, *serverName)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		f.tls = cfg
	}

	scenario := fs.Arg(0)
	sf := flag.NewFlagSet(scenario, flag.ContinueOnError)
	dest := sf.String("dest", "", "destination HOST:PORT")
	message := sf.String("message", "hello through konnectivity", "echo: the message")
	size := sf.Int("bytes", 8<<20, "bulk/upload: bytes to send")
	count := sf.Int("count", 100, "flood: parallel dials")
	timeout := sf.Duration("timeout", 60*time.Second, "the whole scenario's deadline (not stuck's)")
	concurrency := sf.Int("concurrency", 64, "stuck: dials at a time")
	seconds := sf.Float64("seconds", 20, "stuck: how long to write")
	chunk := sf.Int("chunk", 16<<10, "stuck: bytes per Write")
	limit := sf.Int64("limit", 256<<20, "stuck: bytes handed over per connection at most")
	if err := sf.Parse(fs.Args()[1:]); err != nil || *dest == "" {
		fmt.Fprintln(os.Stderr, "every scenario needs --dest HOST:PORT")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var r result
	switch scenario {
	case "echo":
		r = echo(ctx, f, *dest, []byte(*message))
	case "bulk":
		r = bulk(ctx, f, *dest, *size)
	case "upload":
		r = upload(ctx, f, *dest, *size)
	case "download":
		if *count > 1 && countSet(sf) {
			r = downloads(ctx, f, *dest, *count)
		} else {
			r = download(ctx, f, *dest)
		}
	case "flood":
		r = flood(ctx, f, *dest, *count)
	case "dial":
		r = dialOnly(ctx, f, *dest)
	case "stuck":
		if *count < 1 || *concurrency < 1 || *chunk < 1 || *limit < 1 || *seconds <= 0 {
			fmt.Fprintln(os.Stderr, "stuck needs --count, --concurrency, --chunk and --limit above 0 and --seconds above 0")
			os.Exit(2)
		}
		stuck(f, *dest, stuckOptions{count: *count, concurrency: *concurrency, chunk: *chunk, limit: *limit, seconds: *seconds}, clientVersion())
	default:
		fmt.Fprintf(os.Stderr, "unknown scenario %q\n", scenario)
		os.Exit(2)
	}
	r["scenario"] = scenario
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

// clientVersion is the konnectivity-client module this program was built with.
func clientVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "sigs.k8s.io/apiserver-network-proxy/konnectivity-client" {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}

func tlsConfig(ca, cert, key, serverName string) (*tls.Config, error) {
	if ca == "" || cert == "" || key == "" {
		return nil, errors.New("--address needs --ca, --cert and --key")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no certificate", ca)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}

// closeResult is Close()'s outcome: nil means the frontend answered CLOSE_RSP without an error.
func closeResult(r result, c net.Conn) result {
	start := time.Now()
	err := c.Close()
	r["closeMs"] = time.Since(start).Milliseconds()
	if err != nil {
		r["closeError"] = err.Error()
	}
	return r
}

func fail(stage string, err error) result {
	r := result{"ok": false, "stage": stage, "error": err.Error()}
	if is, reason := client.GetDialFailureReason(err); is {
		r["reason"] = string(reason)
	}
	return r
}

func echo(ctx context.Context, f frontend, dest string, msg []byte) result {
	c, err := f.dial(ctx, dest)
	if err != nil {
		return fail("dial", err)
	}
	if _, err := c.Write(msg); err != nil {
		c.Close()
		return fail("write", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		c.Close()
		return fail("read", err)
	}
	return closeResult(result{"ok": string(got) == string(msg), "echo": string(got)}, c)
}

// writeSeeded writes n bytes of seeded random data in 32 KiB writes (io.Copy's size: one DATA each)
// and returns their sha256.
func writeSeeded(w io.Writer, n int) (string, error) {
	src := rand.New(rand.NewSource(int64(n)))
	h := sha256.New()
	buf := make([]byte, 32<<10)
	for left := n; left > 0; {
		chunk := buf[:min(len(buf), left)]
		src.Read(chunk)
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return "", err
		}
		left -= len(chunk)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func bulk(ctx context.Context, f frontend, dest string, n int) result {
	c, err := f.dial(ctx, dest)
	if err != nil {
		return fail("dial", err)
	}
	start := time.Now()
	sent := make(chan error, 1)
	var sentSha string
	go func() {
		var err error
		sentSha, err = writeSeeded(c, n)
		sent <- err
	}()
	h := sha256.New()
	got, rerr := io.CopyN(h, c, int64(n))
	if err := <-sent; err != nil {
		c.Close()
		return fail("write", err)
	}
	if rerr != nil {
		c.Close()
		return fail("read", fmt.Errorf("after %d bytes: %w", got, rerr))
	}
	recvSha := hex.EncodeToString(h.Sum(nil))
	ms := time.Since(start).Milliseconds()
	return closeResult(result{"ok": sentSha == recvSha, "bytes": got, "sentSha256": sentSha, "receivedSha256": recvSha, "ms": ms}, c)
}

func upload(ctx context.Context, f frontend, dest string, n int) result {
	c, err := f.dial(ctx, dest)
	if err != nil {
		return fail("dial", err)
	}
	if _, err := fmt.Fprintf(c, "%d\n", n); err != nil {
		c.Close()
		return fail("write", err)
	}
	sentSha, err := writeSeeded(c, n)
	if err != nil {
		c.Close()
		return fail("write", err)
	}
	// The destination's answer, then its close: Read gives io.EOF once CLOSE_RSP arrives.
	reply, err := io.ReadAll(c)
	if err != nil {
		c.Close()
		return fail("read", err)
	}
	return closeResult(result{"ok": string(reply) == sentSha, "sentSha256": sentSha, "reply": string(reply)}, c)
}

func download(ctx context.Context, f frontend, dest string) result {
	c, err := f.dial(ctx, dest)
	if err != nil {
		return fail("dial", err)
	}
	h := sha256.New()
	got, err := io.Copy(h, c)
	if err != nil {
		c.Close()
		return fail("read", err)
	}
	return closeResult(result{"ok": true, "bytes": got, "sha256": hex.EncodeToString(h.Sum(nil))}, c)
}

func countSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == "count" })
	return set
}

// downloads runs n downloads at once: a server-first destination, n times, each in its own tunnel.
func downloads(ctx context.Context, f frontend, dest string, n int) result {
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := download(ctx, f, dest)
			// Close()'s outcome is not counted: after the destination's close, konnectivity-client's Close
			// reports "tunnel closed" or nothing at random (its select sees both the answer and the
			// tunnel's end).
			key := fmt.Sprintf("%v %v", r["bytes"], r["sha256"])
			if r["error"] != nil {
				key = fmt.Sprintf("%s: %s", r["stage"], r["error"])
			}
			mu.Lock()
			got[key]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return result{"ok": len(got) == 1, "count": n, "outcomes": got}
}

func flood(ctx context.Context, f frontend, dest string, n int) result {
	var mu sync.Mutex
	errs := map[string]int{}
	okCount := 0
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, 1024)
			rand.New(rand.NewSource(int64(i))).Read(msg)
			r := echo(ctx, f, dest, msg)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r["error"] != nil:
				errs[fmt.Sprintf("%s: %s", r["stage"], r["error"])]++
			case r["ok"] != true:
				errs["echo differs"]++
			case r["closeError"] != nil:
				errs[fmt.Sprintf("close: %s", r["closeError"])]++
			default:
				okCount++
			}
		}()
	}
	wg.Wait()
	return result{"ok": okCount == n, "count": n, "succeeded": okCount, "errors": errs, "ms": time.Since(start).Milliseconds()}
}

func dialOnly(ctx context.Context, f frontend, dest string) result {
	start := time.Now()
	c, err := f.dial(ctx, dest)
	ms := time.Since(start).Milliseconds()
	if err != nil {
		r := fail("dial", err)
		r["ms"] = ms
		return r
	}
	return closeResult(result{"ok": true, "ms": ms}, c)
}

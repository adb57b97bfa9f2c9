package main

// The stuck scenario: the clients of the bench's stuck-destination measurement (test/src/bench/stuck.ts and
// anp-stuck.ts) as kube-apiserver makes them, one single-use tunnel (a TLS connection and an HTTP/2 session)
// per connection, written into by ANP's own konnectivity-client. It speaks the line protocol of the bench's
// stuck-client.js:
//
//  1. opens --count connections to --dest, --concurrency at a time; prints {"opened":N,"failed":F,...}
//  2. writes --chunk bytes per Write() into every one of them, never reading their data, for --seconds (or
//     until SIGUSR1: the bench's memory guard); a connection stops at --limit bytes handed over. Prints
//     {"filled":BYTES,...} and keeps them open.
//  3. on SIGUSR2: prints {"holding":N,"lost":L,...}, ends the tunnels, prints {"closed":N} and exits.
//
// A Write() that the tunnel's flow control holds back blocks (grpc-go's Send); "blocked" counts the writers
// still inside one when the time is up. Exits on SIGTERM, or by itself once its parent is gone.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type stuckOptions struct {
	count, concurrency, chunk int
	limit                     int64
	seconds                   float64
}

type stuckConn struct {
	handed  atomic.Int64
	writing atomic.Bool
	closed  atomic.Bool
}

// exitWithParent ends the process once the bench that started it is gone (it is reparented).
func exitWithParent() {
	parent := os.Getppid()
	go func() {
		for range time.Tick(500 * time.Millisecond) {
			if os.Getppid() != parent {
				os.Exit(0)
			}
		}
	}()
}

func say(r result) {
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func stuck(f frontend, dest string, o stuckOptions, version string) {
	exitWithParent()
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM)
	guard := make(chan struct{})
	release := make(chan struct{})
	go func() {
		guarded := false
		for s := range signals {
			switch s {
			case syscall.SIGTERM:
				os.Exit(0)
			case syscall.SIGUSR1:
				if !guarded {
					guarded = true
					close(guard)
				}
			case syscall.SIGUSR2:
				close(release)
				return
			}
		}
	}()

	// Every tunnel lives in this context: cancelling it ends them all (Close() would wait behind a blocked Write).
	tunnels, endTunnels := context.WithCancel(context.Background())
	var mu sync.Mutex
	var held []*stuckConn
	var conns []net.Conn
	var failed, lost atomic.Int64
	var closing atomic.Bool
	firstError := ""
	noteError := func(s string) {
		mu.Lock()
		if firstError == "" {
			firstError = s
		}
		mu.Unlock()
	}

	// 1. open
	begin := time.Now()
	var started atomic.Int64
	var wg sync.WaitGroup
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for started.Add(1) <= int64(o.count) {
				dialCtx, cancel := context.WithTimeout(tunnels, 30*time.Second)
				c, err := f.dialIn(dialCtx, tunnels, dest)
				cancel()
				if err != nil {
					noteError("dial: " + err.Error())
					if failed.Add(1) > int64(max(20, o.count/10)) {
						started.Store(int64(o.count))
					}
					continue
				}
				h := &stuckConn{}
				mu.Lock()
				held = append(held, h)
				conns = append(conns, c)
				mu.Unlock()
				// konnectivity-client closes a tunnel whose reader falls behind; the destination never sends,
				// so this only learns when the path closes the connection.
				go func() {
					buf := make([]byte, 32<<10)
					for {
						if _, err := c.Read(buf); err != nil {
							h.closed.Store(true)
							if !closing.Load() {
								lost.Add(1)
								noteError("a held connection ended: " + err.Error())
							}
							return
						}
					}
				}()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	fe := firstError
	mu.Unlock()
	say(result{"opened": len(held), "failed": failed.Load(), "unsentLimited": 0, "firstError": fe,
		"seconds": time.Since(begin).Seconds(),
		"client":  fmt.Sprintf("konnectivity-client %s (Go): a TLS connection and an HTTP/2 session per connection", version)})

	// 2. fill
	chunk := make([]byte, o.chunk)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	var stopped atomic.Bool
	var lastWrite atomic.Int64
	var capped atomic.Int64
	fillBegin := time.Now()
	done := make(chan struct{})
	var writers sync.WaitGroup
	for i, h := range held {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for !stopped.Load() && !h.closed.Load() {
				if h.handed.Load() >= o.limit {
					capped.Add(1)
					return
				}
				h.writing.Store(true)
				_, err := conns[i].Write(chunk)
				h.writing.Store(false)
				if err != nil {
					return
				}
				h.handed.Add(int64(len(chunk)))
				lastWrite.Store(int64(time.Since(fillBegin)))
			}
		}()
	}
	go func() {
		writers.Wait()
		close(done)
	}()
	stoppedBy := "closed"
	select {
	case <-time.After(time.Duration(o.seconds * float64(time.Second))):
		stoppedBy = "time"
	case <-guard:
		stoppedBy = "guard"
	case <-done:
	}
	stopped.Store(true)
	var total, least, most int64
	open, blocked := 0, 0
	for i, h := range held {
		n := h.handed.Load()
		total += n
		if i == 0 || n < least {
			least = n
		}
		most = max(most, n)
		if !h.closed.Load() {
			open++
			if h.writing.Load() {
				blocked++
			}
		}
	}
	mu.Lock()
	fe = firstError
	mu.Unlock()
	say(result{"filled": total, "min": least, "max": most, "open": open, "blocked": blocked, "capped": capped.Load(),
		"lastWriteAfter": time.Duration(lastWrite.Load()).Seconds(), "seconds": time.Since(fillBegin).Seconds(),
		"stoppedBy": stoppedBy, "lost": lost.Load(), "firstError": fe})

	// 3. close
	<-release
	holding := 0
	for _, h := range held {
		if !h.closed.Load() {
			holding++
		}
	}
	mu.Lock()
	fe = firstError
	mu.Unlock()
	say(result{"holding": holding, "lost": lost.Load(), "firstError": fe})
	closing.Store(true)
	endTunnels()
	// Writers blocked in Send return once their streams are cancelled; the process's exit closes the sockets.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	say(result{"closed": len(held)})
	os.Exit(0)
}

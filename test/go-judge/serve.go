// `judge serve-https CERT KEY`: Go's own net/http server (the HTTP layer kube-apiserver runs) on
// 127.0.0.1, for the differential of the agent's apiserver relay (test/fuzz/relay-go.test.ts). It prints
// {"listening":PORT}, then one JSON line per request its handler got, as Go read it:
//
//	{"conn":1,"method":"GET","requestURI":"/api?x=1","host":"h","header":{"Impersonate-User":["alice"]},
//	 "contentLength":0,"transferEncoding":null,"body":"<base64>","bodyError":""}
//
// and {"conn":"new"} / {"conn":"closed"} as connections come and go (a request's line comes before its
// connection's "closed"), and answers each request with 200, `ok ` and its request target, and the header X-Judge: 1. Requests Go refuses never reach the handler
// (Go answers them itself, 400 or 431, and closes): no line.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
)

type seen struct {
	Conn             int64               `json:"conn"`
	Method           string              `json:"method"`
	RequestURI       string              `json:"requestURI"`
	Host             string              `json:"host"`
	Header           map[string][]string `json:"header"`
	ContentLength    int64               `json:"contentLength"`
	TransferEncoding []string            `json:"transferEncoding"`
	Body             []byte              `json:"body"`
	BodyError        string              `json:"bodyError,omitempty"`
}

type connKey struct{}

func serveHTTPS(certFile, keyFile string) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		log.Fatalf("serve-https: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("serve-https: %v", err)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	var conns atomic.Int64
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}},
		ErrorLog:  log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, conns.Add(1))
		},
		// Opened and closed connections, counted: once every one is closed, every request has its line.
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew || state == http.StateClosed || state == http.StateHijacked {
				mu.Lock()
				_ = enc.Encode(map[string]string{"conn": state.String()})
				mu.Unlock()
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			s := seen{
				Conn:             r.Context().Value(connKey{}).(int64),
				Method:           r.Method,
				RequestURI:       r.RequestURI,
				Host:             r.Host,
				Header:           r.Header,
				ContentLength:    r.ContentLength,
				TransferEncoding: r.TransferEncoding,
				Body:             body,
			}
			if err != nil {
				s.BodyError = err.Error()
			}
			// Printed before the answer leaves: whoever reads the answer can wait for this line.
			mu.Lock()
			_ = enc.Encode(s)
			mu.Unlock()
			w.Header().Set("X-Judge", "1")
			_, _ = io.WriteString(w, "ok "+r.RequestURI)
		}),
	}
	mu.Lock()
	_ = enc.Encode(map[string]int{"listening": ln.Addr().(*net.TCPAddr).Port})
	mu.Unlock()
	// Until stdin closes (the test ends): then exit.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	if err := srv.ServeTLS(ln, "", ""); err != nil {
		log.Fatalf("serve-https: %v", err)
	}
}

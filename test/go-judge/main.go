// The Go judge for the agent's proxy selection (agent/src/no-proxy.ts): answers, with Go's own
// golang.org/x/net/http/httpproxy (what kubelet and kubectl run, through net/http), which proxy a
// request to a URL takes given an environment. Reads one JSON case per line on stdin, writes one JSON
// answer per line on stdout, in order:
//
//	{"env":{"HTTPS_PROXY":"…","NO_PROXY":"…"},"url":"https://host:port"}
//	→ {"proxy":{"scheme":"http","user":"u","password":"p","hostname":"h","port":"3128"}} (or "proxy":null,
//	   "urlError" when Go cannot parse the target URL, "error" when Go refuses the request)
//
// With `serve-https CERT KEY` it is Go's HTTP server instead (serve.go).
//
// Built by test/fuzz/go-judge.ts into ~/.cache/cluster-proxy/go-judge (never committed); test/fuzz/README.md tells more.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/url"
	"os"

	"golang.org/x/net/http/httpproxy"
)

type request struct {
	Env map[string]string `json:"env"`
	URL string            `json:"url"`
}

type proxyURL struct {
	Scheme      string `json:"scheme"`
	User        string `json:"user"`
	Password    string `json:"password"`
	HasPassword bool   `json:"hasPassword"`
	Hostname    string `json:"hostname"`
	Port        string `json:"port"`
}

type answer struct {
	Proxy    *proxyURL `json:"proxy"`
	URLError string    `json:"urlError,omitempty"`
	Error    string    `json:"error,omitempty"`
}

var names = []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "REQUEST_METHOD"}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "serve-https" {
		serveHTTPS(os.Args[2], os.Args[3])
		return
	}
	in := bufio.NewReaderSize(os.Stdin, 1<<16)
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	enc := json.NewEncoder(out)
	for {
		line, readErr := in.ReadBytes('\n')
		if len(line) == 0 && readErr != nil {
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // a blank line asks for nothing
		}
		var req request
		var a answer
		if err := json.Unmarshal(line, &req); err != nil {
			a.Error = "bad request: " + err.Error()
			_ = enc.Encode(a)
			if in.Buffered() == 0 {
				_ = out.Flush()
			}
			continue
		}
		// The environment exactly as a Go process would read it.
		for _, n := range names {
			if v, ok := req.Env[n]; ok {
				os.Setenv(n, v)
			} else {
				os.Unsetenv(n)
			}
		}
		if target, err := url.Parse(req.URL); err != nil {
			a.URLError = err.Error()
		} else if p, err := httpproxy.FromEnvironment().ProxyFunc()(target); err != nil {
			a.Error = err.Error()
		} else if p != nil {
			pw, has := p.User.Password()
			a.Proxy = &proxyURL{Scheme: p.Scheme, User: p.User.Username(), Password: pw, HasPassword: has, Hostname: p.Hostname(), Port: p.Port()}
		}
		_ = enc.Encode(a)
		// Answers go out once nothing more is waiting to be read: a caller that writes a batch gets it whole.
		if in.Buffered() == 0 {
			_ = out.Flush()
		}
	}
	_ = out.Flush()
}

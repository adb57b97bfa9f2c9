// The Go judge of the agent's NO_PROXY / HTTPS_PROXY handling (main.go). The pin below is the
// golang.org/x/net whose http/httpproxy it runs.
module cluster-proxy.test/go-judge

go 1.26.0

require golang.org/x/net v0.62.0

require golang.org/x/text v0.43.0 // indirect

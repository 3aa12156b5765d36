//go:build tools

// Package tools holds the command `cargo xtask setup` builds, so that `go mod tidy`
// keeps its dependencies in go.mod and go.sum.
package tools

import _ "go.etcd.io/etcd/server/v3"

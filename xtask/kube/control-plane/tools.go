//go:build tools

// Package tools holds the commands `cargo xtask setup` builds, so that `go mod tidy`
// keeps their dependencies in go.mod and go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)

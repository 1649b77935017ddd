package testinfra

// Copy this package into the libraries (see the package documentation).
//go:generate go run ../../tools/cmd/gentestinfra -root ../..

package testinfra

// Write the libraries' copies of this package, and every other generated copy (see the
// package documentation and tools/copies).
//go:generate go run ../../tools/cmd/gencopies

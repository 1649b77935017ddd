package pgpartition

// Write the libraries' copies of this package, and every other generated copy
// (tools/copies).
//go:generate go run ../../tools/cmd/gencopies

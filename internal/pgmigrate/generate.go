package pgmigrate

// Write the libraries' copies of this package (but service.go), and every other generated
// copy (see the package documentation and tools/copies).
//go:generate go run ../../tools/cmd/gencopies

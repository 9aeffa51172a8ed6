// Package script runs datadriven test scripts in the style of etcd raft.
//
// A script is a text file of cases. Each case is a command line, a line
// holding only "----", and the expected output, which ends at the first
// blank line (or at the end of the file). Blank lines and lines starting
// with # between cases are comments and are kept as they are:
//
//	# A new merger starts at the minimum.
//	new channels=2
//	----
//	combined=min idle=false
//
// A command line is a name followed by key=value arguments. [Run] parses
// each command into a [Command], hands it to the test's handler and compares
// what the handler returns with the expected output. Handlers read
// arguments through the typed readers of [Command]; an argument the handler
// never read is an error, so a misspelt argument cannot pass unnoticed.
//
// Running the tests with
//
//	go test ./pkg/ -run Script -update
//
// rewrites the expected output of every script with what the handlers
// print, leaving commands and comments as they are.
//
// The package is meant for tests only: it imports package testing and
// defines the -update flag.
package script

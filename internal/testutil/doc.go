// Package testutil holds the helpers every package's tests share: one
// bounded wait on a condition (never a sleep as synchronisation) and a CPU
// burner that puts a test's goroutines under contention, where races hide.
package testutil

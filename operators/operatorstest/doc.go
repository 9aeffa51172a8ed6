// Package operatorstest drives one operator instance directly, without the
// actor runtime, for deterministic tests: Flink's
// OneInputStreamOperatorTestHarness for edged.
//
// A Harness owns the operators.Context it opens the operator with. The test
// feeds records (Process, with an explicit event timestamp), watermarks
// (Watermark) and processing time (AdvanceProcessingTime, over a
// clockwork.FakeClock), and reads what the operator did from the
// harness's fields: the records of the main output with their timestamps
// (Out), the watermarks and stream-status changes it forwarded (Watermarks,
// Idle) and the records of its side outputs (Side).
//
// Nothing here starts a goroutine or reads the real clock: processing-time
// callbacks run inside AdvanceProcessingTime, in order of their due time,
// with the fake clock moved to each due time in turn, as a runtime that is
// never late would run them.
//
// Failures. Operators abort a record by panicking with *operators.Failure
// (operators.Fail); the runtime recovers it and fails the task. Process
// lets that panic through, so an unexpected failure stops the test with
// its stack; TryProcess and Catch return it as an error instead. The
// methods that return an error (Open, Watermark, AdvanceProcessingTime,
// Finish, EndInput, Close) return both the operator's error and a
// *operators.Failure it panicked with. Any other panic propagates.
//
// A Harness is not safe for concurrent use: like the subtask it stands
// for, it is used from one goroutine (the test's).
package operatorstest

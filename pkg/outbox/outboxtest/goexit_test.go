package outboxtest_test

import "runtime"

func runtimeGoexit() { runtime.Goexit() }

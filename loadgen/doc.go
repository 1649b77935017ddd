// Package loadgen places orders on the outboxshop orders API at a steady rate, the way real
// clients would: with an Idempotency-Key on every order, deliberate duplicates, retries of
// lost answers, cancellations and orders that are refused. Docker compose runs it for a
// trickle of orders, the chaos scenarios run it while they break things, the benchmarks run it
// flat out. The binary is cmd/loadgen.
//
//	res, err := loadgen.Run(ctx, loadgen.Config{OrdersURL: "http://127.0.0.1:8080", Rate: 50, Count: 500})
//	if err != nil { // a bad Config only
//		return err
//	}
//	fmt.Print(res.Summary())
//
// # Orders
//
// Order n (from 1) carries the Idempotency-Key [Config.KeyPrefix] + n, one to three distinct
// lines of [Config.SKUs] with quantities 1 to [Config.MaxQuantity], and a customer among a
// hundred. Everything random about an order — its lines, and whether it has an unknown SKU,
// is duplicated or is cancelled — comes from [Config.Seed] and n alone, so a run is
// reproducible whatever the scheduling. With the shop's stock (BAG-1 has 10) some orders are
// rejected by the warehouse; that happens after the API's 201 and is the saga's business, not
// an error here.
//
//   - UnknownSKUFraction of the orders name a SKU the shop does not sell: the API must answer
//     422, counted in [Result.RejectedByAPI].
//   - DuplicateFraction of the acknowledged orders are sent a second time with the same key and
//     body: the answer must be the first answer again (status, body, Location) marked
//     Idempotent-Replayed. Anything else is an error of kind "mismatch": a correctness bug.
//   - CancelFraction of the acknowledged orders are cancelled right after. 200 counts in
//     [Result.Cancelled]; 409 (the warehouse rejected the order first) is expected.
//   - A connection error, a timeout, a 5xx or a 429 is retried with the same key and body for
//     up to [Config.RetryFor], with exponential backoff and the server's Retry-After; such a
//     retry may well be answered by a replay, which is the point.
//
// # Pacing
//
// With a [Config.Rate], order k is due at start + k/Rate: the schedule is fixed, so the rate
// does not drift however long requests take. At most [Config.Concurrency] orders are in flight
// (an order's duplicate and cancellation run on its worker). When every worker is busy the due
// orders queue up to a small backlog (one per worker, or 100ms worth) and go out as soon as a
// worker is free; beyond it slots are dropped, the progress line says BEHIND and the summary
// says that the run fell behind its rate. Rate 0 places orders as fast as the workers allow.
//
// # Results
//
// [Result.Errors] counts what went wrong by kind: "connection", "timeout", "http_4xx",
// "http_5xx" (after RetryFor ran out), "mismatch", "unexpected" (an answer outside the API,
// such as an unknown SKU accepted) and "interrupted" (abandoned when the grace period after a
// stop ran out). [Result.Summary] gives one example of each.
//
// Latency percentiles cover every POST /orders answered 201, replays included, each HTTP
// exchange on its own. They come from a fixed-bucket log-linear histogram (HdrHistogram's
// layout: exact below 128ns, then 64 buckets per power of two), which keeps every sample in
// 18 KiB however long the run: a percentile is at most 1.6% above the true sample, never below,
// and Max is exact.
package loadgen

package inboxrabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The broker's dead-letter headers ([DeadLetterMessage]), which a replayed copy does not carry.
const (
	headerXDeath          = "x-death"
	headerFirstDeathQueue = "x-first-death-queue"
	headerFirstDeathRsn   = "x-first-death-reason"
	headerFirstDeathExch  = "x-first-death-exchange"
	prefixFirstDeath      = "x-first-death-"
	prefixLastDeath       = "x-last-death-"
)

// BrokerReasonPrefix starts the [DeadLetterMessage].Reason of a message the broker
// dead-lettered itself (a quorum queue's x-delivery-limit, a TTL, a length limit), followed by
// the broker's reason: "broker: delivery_limit".
const BrokerReasonPrefix = "broker: "

// ReplayConfig configures [ReplayDeadLetters]; [ReplayConfig.WithDefaults] fills in the fields
// left zero.
type ReplayConfig struct {
	// Queue is the dead-letter queue to replay from. Required.
	Queue string
	// Match selects the dead letters to replay; nil selects every one. It is called once for
	// each examined message, in queue order, from the goroutine of ReplayDeadLetters.
	Match func(DeadLetterMessage) bool
	// GroupBy, optional, labels each examined message: the report counts per label too
	// ([ReplayGroup].Label), e.g. the schema version of the body.
	GroupBy func(DeadLetterMessage) string
	// DryRun examines and counts what would be replayed, and moves nothing: nothing is
	// published and nothing acknowledged.
	DryRun bool
	// Limit is the most messages examined. 0 examines every message the queue held when the
	// replay started. Not negative.
	Limit int
	// PublishTimeout bounds the wait for the broker's confirm of each copy. Default 30s
	// ([DefaultPublishTimeout]).
	PublishTimeout time.Duration
	// Logger receives a line when the replay starts and ends, a warning per message left in
	// place for lack of a queue or because the broker did not take its copy, and a debug line
	// per replayed message, with the attributes queue, message_id, message_type and
	// original_queue. Nil discards.
	Logger *slog.Logger
}

// WithDefaults returns c validated, with every default filled in: what [ReplayDeadLetters]
// will use.
func (c ReplayConfig) WithDefaults() (ReplayConfig, error) {
	var errs []error
	if c.Queue == "" {
		errs = append(errs, errors.New("queue (the dead-letter queue) is required"))
	}
	if c.Limit < 0 {
		errs = append(errs, fmt.Errorf("limit must be >= 0 (0: every message in the queue), got %d", c.Limit))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("publish timeout must be >= 0 (0 means the default), got %s", c.PublishTimeout))
	}
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("inbox: invalid replay config: %w", err)
	}
	return c, nil
}

// DeadLetterMessage is a dead letter as [ReplayConfig].Match and GroupBy see it.
type DeadLetterMessage struct {
	// ID and Type are the AMQP message-id and type properties.
	ID, Type string
	// Reason is why it was dead-lettered: its [HeaderDeadReason] ("permanent-error: …"), or
	// for a message the broker dead-lettered, [BrokerReasonPrefix] and the reason of its
	// latest x-death ("broker: delivery_limit"); "" when it has neither. A replayed copy
	// ([HeaderReplayed]) keeps the consumer's reason and none of the broker's headers, so one
	// that carries both died at the broker's hand after its replay: its Reason is the
	// broker's.
	Reason string
	// OriginalQueue is where a replay sends it: its [HeaderOriginalQueue], else the queue of
	// its latest x-death entry, else its x-first-death-queue; "" when it names none.
	OriginalQueue string
	// Headers are the AMQP headers as they are in the dead-letter queue, and Body the body.
	// Neither may be changed.
	Headers amqp.Table
	Body    []byte
}

// ReasonKind is the reason without its details: the Reason constant of the consumer's dead
// letter ("permanent-error"), or the broker's whole reason ("broker: delivery_limit").
func (m DeadLetterMessage) ReasonKind() string {
	if strings.HasPrefix(m.Reason, BrokerReasonPrefix) {
		return m.Reason
	}
	kind, _, _ := strings.Cut(m.Reason, ":")
	return kind
}

// ReplayReport is what [ReplayDeadLetters] did, or, in a dry run, would do.
type ReplayReport struct {
	// Queue is the dead-letter queue, DryRun the config's.
	Queue  string
	DryRun bool
	// Depth is how many messages were ready in Queue when the replay started.
	Depth int
	// Examined counts the messages looked at (at most Depth, and Limit), Matched those that
	// Match selected, Replayed those whose copy the broker confirmed in their queue and whose
	// dead letter was then removed (0 in a dry run).
	Examined, Matched, Replayed int
	// NoOriginalQueue counts the matched messages that name no queue to go back to; they are
	// left in place.
	NoOriginalQueue int
	// Failed counts the matched messages whose copy the broker did not take: it returned it
	// as unroutable (its queue does not exist: see Unroutable). They are left in place. A dry
	// run counts those whose queue does not exist, as the replay would.
	Failed int
	// Unroutable are the queues, in sorted order, to which the broker returned a copy.
	Unroutable []string
	// Left is Depth − Replayed: how many of the messages that were in the queue at the start
	// are still there, unless another client took some meanwhile.
	Left int
	// Groups count the examined messages by their type, reason kind, original queue and
	// label, in that order.
	Groups []ReplayGroup
}

// ReplayGroup counts the examined dead letters of one type, reason kind
// ([DeadLetterMessage].ReasonKind), original queue and label ([ReplayConfig].GroupBy; ""
// without one).
type ReplayGroup struct {
	Type, Reason, OriginalQueue, Label string
	// Examined, Matched and Replayed are the [ReplayReport] counts of this group.
	Examined, Matched, Replayed int
}

// ReplayDeadLetters moves the dead letters of cfg.Queue that cfg.Match accepts back to the
// queue each was dead-lettered from ([DeadLetterMessage].OriginalQueue), on conn, and reports
// what it did. The caller owns conn: ReplayDeadLetters opens two channels on it and closes
// them before it returns.
//
// It reads the queue's depth once (a passive declare) and examines at most that many
// messages (or cfg.Limit), taking them one by one with basic.get without acknowledging them,
// so a message dead-lettered again while the replay runs, which joins the tail, is not met
// again. It replays a matched message by publishing a copy to the default exchange with its
// queue as the routing key, with the mandatory flag, on a channel in confirm mode, and
// acknowledges the dead letter only after the broker confirmed the copy. Every dead letter
// it does not replay (not matched, naming no queue, returned or refused by the broker) stays
// unacknowledged until the end, when it hands them all back to the queue, in their order,
// closes the channel, and waits (a few seconds at most) until the queue shows them again, so
// that a replay that follows a dry run finds them all. Nothing is removed that was not
// replayed, nothing lost. In a dry run it publishes and acknowledges nothing.
//
// The copy keeps the body and the properties (message id, type, timestamp, correlation id,
// content type, …), is persistent, and keeps the headers, [HeaderDeadReason] and the original
// exchange and routing key among them, so that the consumer takes it as a replay with a fresh
// set of attempts and the handler sees the routing key the message was first published with
// (for a broker dead letter, taken from its x-death), and counts the replay in
// [HeaderReplayed]. It leaves out the retry count
// ([HeaderRetries]), x-delivery-count and the broker's x-death, x-first-death-* and
// x-last-death-* headers. It has no expiration, so that it cannot expire before the consumer
// sees it: an expiration moves to [HeaderOriginalExpiration], as on the consumer's dead
// letters, and so does a user-id property to [HeaderOriginalUserID], which the broker would
// refuse from another user.
//
// A message whose copy the broker returns as unroutable (its queue does not exist) is left in
// place and counted in [ReplayReport].Failed, and the replay goes on; the error names the
// queue. A nack, a confirm that does not come within PublishTimeout, a lost channel or ctx
// ending stops the replay with an error: the dead letter in hand stays, and so does every one
// after it (when the channel is lost, the broker hands back what it held itself). The report
// returned with an error counts what was done until then. ctx is checked before each message
// and bounds the wait for each confirm; a call to the broker under way (basic.get, the passive
// declare) is not interrupted.
//
// A copy may be in its queue while its dead letter is still in the dead-letter queue: after
// a crash, a lost connection or ctx ending between the broker's confirm and the
// acknowledgement, and after a confirm that came too late. Replaying that dead letter again
// publishes a second copy with the same message id, which the inbox takes as a duplicate of
// the first: the handler's effects happen once, provided the inbox row of the first is still
// retained.
//
// On a quorum dead-letter queue the broker counts a delivery for each message handed back,
// dry runs included: give the dead-letter queue no delivery limit (the README's Topology).
// Replaying is one message at a time, a confirm round trip each.
func ReplayDeadLetters(ctx context.Context, conn *amqp.Connection, cfg ReplayConfig) (ReplayReport, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return ReplayReport{Queue: cfg.Queue, DryRun: cfg.DryRun}, err
	}
	if conn == nil {
		return ReplayReport{Queue: cfg.Queue, DryRun: cfg.DryRun}, errors.New("inbox: replay dead letters: no connection")
	}
	r := &replayRun{cfg: cfg, log: cfg.Logger.With(slog.String("queue", cfg.Queue)), groups: map[ReplayGroup]*ReplayGroup{},
		unroutable: map[string]string{}, report: ReplayReport{Queue: cfg.Queue, DryRun: cfg.DryRun},
		conn: conn, exists: map[string]bool{}}
	err = r.run(ctx, conn)
	report := r.finish()
	if report.Failed > 0 {
		err = errors.Join(err, r.unroutableErr())
	}
	if err != nil {
		r.log.WarnContext(ctx, "dead-letter replay failed", slog.Int("replayed", report.Replayed), slog.Any("error", err))
		return report, fmt.Errorf("inbox: replay dead letters of %s: %w", cfg.Queue, err)
	}
	r.log.InfoContext(ctx, "dead letters replayed", slog.Bool("dry_run", cfg.DryRun), slog.Int("examined", report.Examined),
		slog.Int("matched", report.Matched), slog.Int("replayed", report.Replayed), slog.Int("left", report.Left))
	return report, nil
}

// replayRun is one run of ReplayDeadLetters.
type replayRun struct {
	cfg    ReplayConfig
	log    *slog.Logger
	report ReplayReport
	groups map[ReplayGroup]*ReplayGroup // by the group with its counts zero
	// unroutable holds the reply of the broker's latest return, by queue.
	unroutable map[string]string
	// conn is the caller's connection; exists caches, in a dry run, whether each original
	// queue exists.
	conn   *amqp.Connection
	exists map[string]bool
}

// run replays, counting into r.report.
func (r *replayRun) run(ctx context.Context, conn *amqp.Connection) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock, err := r.lock(conn)
	if err != nil {
		return err
	}
	defer unlock()
	get, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	// held is the delivery tag of the latest dead letter taken and not acknowledged: handBack
	// returns it and every earlier one to the queue.
	var held uint64
	defer func() { r.handBack(ctx, get, held) }()
	var pub *replayPublisher
	if !r.cfg.DryRun {
		if pub, err = openReplayPublisher(conn, r.cfg.PublishTimeout); err != nil {
			return err
		}
		defer func() { _ = pub.ch.Close() }()
	}
	// ctx is checked between the broker's calls, and bounds the wait for each confirm. The
	// calls themselves (basic.get, the passive declare) take no context: closing the channel
	// under them from another goroutine could send a frame on a channel the broker closed,
	// which closes the connection, the caller's.
	q, err := get.QueueDeclarePassive(r.cfg.Queue, false, false, false, false, nil)
	if err != nil {
		if amqpErr, ok := errors.AsType[*amqp.Error](err); ok && amqpErr.Code == amqp.NotFound {
			return fmt.Errorf("queue %q does not exist", r.cfg.Queue)
		}
		return fmt.Errorf("read the depth of queue %q: %w", r.cfg.Queue, err)
	}
	r.report.Depth = q.Messages
	n := q.Messages
	if r.cfg.Limit > 0 {
		n = min(n, r.cfg.Limit)
	}
	r.log.InfoContext(ctx, "replaying dead letters", slog.Int("messages", q.Messages), slog.Int("examining", n),
		slog.Bool("dry_run", r.cfg.DryRun))
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := get.Get(r.cfg.Queue, false)
		if err != nil {
			return fmt.Errorf("get a message from %s: %w", r.cfg.Queue, err)
		}
		if !ok {
			break // another client took the rest
		}
		acked, err := r.examine(ctx, d, pub)
		if !acked {
			held = d.DeliveryTag
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ReplayLockSuffix names the queue a replay of a dead-letter queue holds while it runs: the
// dead-letter queue's name and this suffix ("warehouse.orders.dead.replay-lock"), declared
// exclusive, so that a second replay of the same queue, dry runs included, fails at once
// instead of taking the copies the first sends back for dead letters of its own. The broker
// deletes it with the connection that declared it, also after a crash.
const ReplayLockSuffix = ".replay-lock"

// lock declares the replay's lock queue (ReplayLockSuffix) on a channel of its own, and
// returns what deletes it.
func (r *replayRun) lock(conn *amqp.Connection) (unlock func(), err error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open lock channel: %w", err)
	}
	name := r.cfg.Queue + ReplayLockSuffix
	if _, err := ch.QueueDeclare(name, false, true, true, false, nil); err != nil {
		_ = ch.Close()
		if amqpErr, ok := errors.AsType[*amqp.Error](err); ok && amqpErr.Code == amqp.ResourceLocked {
			return nil, fmt.Errorf("another replay of %s is running (it holds the exclusive queue %s); wait for it to end", r.cfg.Queue, name)
		}
		return nil, fmt.Errorf("declare the replay's lock queue %s: %w", name, err)
	}
	return func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.Close()
	}, nil
}

// queueExists says, in a dry run, whether queue exists, as the replay's publish would find
// out: a passive declare on a channel of its own, which a missing queue closes.
func (r *replayRun) queueExists(queue string) bool {
	if ok, seen := r.exists[queue]; seen {
		return ok
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return true // the replay would tell; the dry run does not guess
	}
	_, err = ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	amqpErr, isAMQP := errors.AsType[*amqp.Error](err)
	ok := !isAMQP || amqpErr.Code != amqp.NotFound
	if ok {
		_ = ch.Close()
	}
	r.exists[queue] = ok
	return ok
}

// handBackWait bounds how long handBack waits for the queue to show the dead letters it
// handed back.
const handBackWait = 5 * time.Second

// handBack returns the dead letters taken and not acknowledged, up to the delivery tag held,
// to the queue, and closes the channel. Then it waits, at most handBackWait, until the queue
// holds again at least as many messages as it did at the start, less those replayed, so that
// the next replay, or a replay after a dry run, finds them there: a classic queue has them
// back once it answers a call on the same channel, a quorum queue once its log has applied
// the reject. Closing the channel would return them as well, but without that wait; it is
// all that is left when the channel failed.
func (r *replayRun) handBack(ctx context.Context, get *amqp.Channel, held uint64) {
	defer func() { _ = get.Close() }()
	if held == 0 || get.IsClosed() {
		return
	}
	if err := get.Nack(held, true, true); err != nil {
		return
	}
	want := r.report.Depth - r.report.Replayed
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackWait)
	defer cancel()
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		q, err := get.QueueDeclarePassive(r.cfg.Queue, false, false, false, false, nil)
		if err != nil || q.Messages >= want {
			return
		}
		select {
		case <-ctx.Done():
			r.log.DebugContext(ctx, "the dead-letter queue does not show the dead letters handed back yet (another client takes them?)",
				slog.Int("messages", q.Messages), slog.Int("expected", want))
			return
		case <-time.After(delay):
		}
	}
}

// examine counts d and replays it when it matches, unless this is a dry run. It reports
// whether it acknowledged d, and returns an error when the replay must stop.
func (r *replayRun) examine(ctx context.Context, d amqp.Delivery, pub *replayPublisher) (acked bool, err error) {
	m := newDeadLetterMessage(d)
	key := ReplayGroup{Type: m.Type, Reason: m.ReasonKind(), OriginalQueue: m.OriginalQueue}
	if r.cfg.GroupBy != nil {
		key.Label = r.cfg.GroupBy(m)
	}
	g := r.groups[key]
	if g == nil {
		g = &key
		r.groups[key] = g
	}
	g.Examined++
	r.report.Examined++
	if r.cfg.Match != nil && !r.cfg.Match(m) {
		return false, nil
	}
	g.Matched++
	r.report.Matched++
	log := r.log.With(slog.String("message_id", m.ID), slog.String("message_type", m.Type), slog.String("original_queue", m.OriginalQueue))
	if m.OriginalQueue == "" {
		r.report.NoOriginalQueue++
		log.WarnContext(ctx, "dead letter names no queue to go back to; left in place", slog.String("reason", m.Reason))
		return false, nil
	}
	if r.cfg.DryRun {
		if !r.queueExists(m.OriginalQueue) {
			r.report.Failed++
			r.unroutable[m.OriginalQueue] = "404 NOT_FOUND (the queue does not exist)"
		}
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	returned, err := pub.publish(ctx, m.OriginalQueue, replayCopy(d))
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return false, fmt.Errorf("replay message %q to queue %s: %w; its dead letter stays", m.ID, m.OriginalQueue, err)
	}
	if returned != nil {
		r.report.Failed++
		r.unroutable[m.OriginalQueue] = fmt.Sprintf("%d %s", returned.ReplyCode, returned.ReplyText)
		log.WarnContext(ctx, "the broker returned the copy as unroutable (does the queue exist?); dead letter left in place",
			slog.Int("reply_code", int(returned.ReplyCode)), slog.String("reply_text", returned.ReplyText))
		return false, nil
	}
	if err := d.Ack(false); err != nil {
		return false, fmt.Errorf("acknowledge dead letter %q after the broker confirmed its copy in %s: %w; "+
			"it stays in the dead-letter queue, and the inbox takes a second replay of it as a duplicate", m.ID, m.OriginalQueue, err)
	}
	g.Replayed++
	r.report.Replayed++
	log.DebugContext(ctx, "dead letter replayed")
	return true, nil
}

// finish returns the report with its groups and the queues that returned copies, sorted.
func (r *replayRun) finish() ReplayReport {
	rep := r.report
	rep.Left = rep.Depth - rep.Replayed
	rep.Unroutable = slices.Sorted(maps.Keys(r.unroutable))
	for _, g := range r.groups {
		rep.Groups = append(rep.Groups, *g)
	}
	slices.SortFunc(rep.Groups, func(a, b ReplayGroup) int {
		return cmp.Or(strings.Compare(a.Type, b.Type), strings.Compare(a.Reason, b.Reason),
			strings.Compare(a.OriginalQueue, b.OriginalQueue), strings.Compare(a.Label, b.Label))
	})
	return rep
}

// unroutableErr says which queues returned copies.
func (r *replayRun) unroutableErr() error {
	var queues []string
	for _, q := range slices.Sorted(maps.Keys(r.unroutable)) {
		queues = append(queues, fmt.Sprintf("queue %q (%s)", q, r.unroutable[q]))
	}
	if r.cfg.DryRun {
		return fmt.Errorf("%d matched dead letters could not be replayed: their queue does not exist: %s",
			r.report.Failed, strings.Join(queues, ", "))
	}
	return fmt.Errorf("%d matched dead letters not replayed, left in place: the broker returned their copies as unroutable "+
		"(does the queue exist?): %s", r.report.Failed, strings.Join(queues, ", "))
}

// newDeadLetterMessage is the view of d that Match and GroupBy get.
func newDeadLetterMessage(d amqp.Delivery) DeadLetterMessage {
	m := DeadLetterMessage{ID: d.MessageId, Type: d.Type, Headers: d.Headers, Body: d.Body}
	death := latestDeath(d.Headers)
	var broker string
	if reason, ok := death["reason"].(string); ok && reason != "" {
		broker = BrokerReasonPrefix + reason // the latest death
	} else if reason, ok := d.Headers[headerFirstDeathRsn].(string); ok && reason != "" {
		broker = BrokerReasonPrefix + reason
	}
	consumer, hasConsumer := d.Headers[HeaderDeadReason].(string)
	_, replayed := d.Headers[HeaderReplayed]
	switch {
	case broker != "" && (!hasConsumer || replayed):
		// A replay strips the broker's headers and keeps the consumer's reason: on a
		// replayed copy, broker headers mean the broker killed it after the replay.
		m.Reason = broker
	case hasConsumer:
		m.Reason = consumer
	}
	if q, ok := d.Headers[HeaderOriginalQueue].(string); ok && q != "" {
		m.OriginalQueue = q
	} else if q, ok := death["queue"].(string); ok && q != "" {
		m.OriginalQueue = q
	} else if q, ok := d.Headers[headerFirstDeathQueue].(string); ok {
		m.OriginalQueue = q
	}
	return m
}

// latestDeath returns the first entry of the x-death header, the broker's latest
// dead-lettering of the message, or nil.
func latestDeath(h amqp.Table) amqp.Table {
	deaths, _ := h[headerXDeath].([]any)
	if len(deaths) == 0 {
		return nil
	}
	death, _ := deaths[0].(amqp.Table)
	return death
}

// replayCopy returns the publishing that replays d (see ReplayDeadLetters).
func replayCopy(d amqp.Delivery) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+2)
	for k, v := range d.Headers {
		switch {
		case k == HeaderRetries, k == headerDeliveryCount, k == headerXDeath,
			strings.HasPrefix(k, prefixFirstDeath), strings.HasPrefix(k, prefixLastDeath):
			continue
		}
		headers[k] = v
	}
	// A broker dead letter keeps where it was published in its x-death only.
	if _, ok := headers[HeaderOriginalRoutingKey]; !ok {
		death := latestDeath(d.Headers)
		keys, _ := death["routing-keys"].([]any)
		if len(keys) > 0 {
			if key, ok := keys[0].(string); ok {
				headers[HeaderOriginalRoutingKey] = key
				if ex, ok := death["exchange"].(string); ok {
					headers[HeaderOriginalExchange] = ex
				} else if ex, ok := d.Headers[headerFirstDeathExch].(string); ok {
					headers[HeaderOriginalExchange] = ex
				}
			}
		}
	}
	headers[HeaderReplayed] = int32(min(headerInt(d.Headers[HeaderReplayed])+1, 1<<20))
	if _, ok := headers[HeaderOriginalExpiration]; !ok && d.Expiration != "" {
		headers[HeaderOriginalExpiration] = d.Expiration
	}
	if _, ok := headers[HeaderOriginalUserID]; !ok && d.UserId != "" {
		headers[HeaderOriginalUserID] = d.UserId
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// replayPublisher publishes the copies of a replay on a channel in confirm mode, one at a
// time, so that the return of a copy precedes its confirm.
type replayPublisher struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	timeout time.Duration
}

func openReplayPublisher(conn *amqp.Connection, timeout time.Duration) (*replayPublisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return &replayPublisher{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)), timeout: timeout}, nil
}

// publish publishes msg to queue through the default exchange, with the mandatory flag, and
// waits for the broker's confirm. It returns the broker's return when the copy was
// unroutable, and an error when it was not confirmed: the channel is then not to be used
// again (a late confirm would be taken for the next copy's).
func (p *replayPublisher) publish(ctx context.Context, queue string, msg amqp.Publishing) (*amqp.Return, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	confirm, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	acked, err := confirm.WaitContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("wait for the broker's confirm: %w", err)
	}
	if !acked {
		if p.ch.IsClosed() {
			return nil, errors.New("the publish channel closed before the broker confirmed the copy")
		}
		return nil, errors.New("the broker refused the copy (nack)")
	}
	// The broker sends basic.return before the confirm of an unroutable mandatory message,
	// and the library hands it over before it completes the confirm.
	select {
	case ret, ok := <-p.returns:
		if ok {
			return &ret, nil
		}
	default:
	}
	return nil, nil
}

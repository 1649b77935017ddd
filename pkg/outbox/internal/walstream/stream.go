// Package walstream reads the outbox table's committed INSERTs from a logical replication
// slot (pgoutput, PostgreSQL's built-in output plugin), one transaction at a time and in
// commit order, as outbox.Message values: the reading half of a relay that tails the
// transaction log instead of polling the table. The server keeps the slot's WAL until
// [Stream.Confirm] says it is done with it, so a reader that stops, crashes or restarts
// starts again after the last confirmed commit: nothing is skipped, and what came after that
// commit is read again.
//
// It needs a server at wal_level=logical, a role with REPLICATION, and a publication of the
// outbox table (CREATE PUBLICATION … FOR TABLE … WITH (publish = 'insert')).
package walstream

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Row is an outbox row as outbox.Message holds it: the same fields, in the same order, so
// that outbox converts one into the other (this package cannot import it: outbox's WAL
// relay imports this package).
type Row struct {
	ID            uuid.UUID
	Exchange      string
	RoutingKey    string
	Type          string
	AggregateType string
	AggregateID   string
	Payload       json.RawMessage
	Headers       map[string]string
	CreatedAt     time.Time
	Attempts      int
}

// Commit is one committed transaction's outbox rows, in the order they were inserted, and the
// position to confirm once every one of them is published (or dead): the end of its commit.
type Commit struct {
	End pglogrepl.LSN
	// Xid is the transaction's id (32 bits, as the stream has it).
	Xid uint32
	// Time is the transaction's commit time, by the server's clock.
	Time     time.Time
	Messages []Row
	// Seqs are the rows' seq column.
	Seqs []int64
	// Unreadable holds, by index, the rows whose columns are not what the outbox writes
	// (headers that are not a JSON object of strings, written by hand, say): the reader
	// settles them as poison rather than stop the stream.
	Unreadable map[int]error
}

// Config says what to read.
type Config struct {
	// URL is the database's; the stream connects to it in replication mode.
	URL string
	// TLSConfig, when set, replaces the TLS configuration the URL's sslmode gives every
	// host of it (parseConfig).
	TLSConfig *tls.Config
	// Slot is the logical replication slot, created (pgoutput) if it does not exist.
	Slot string
	// Publication names the publication that holds the outbox table.
	Publication string
	// Schema and Table name the outbox table; an empty Schema matches the table in any.
	Schema, Table string
	// StatusInterval is how often the stream tells the server its position while it waits,
	// well inside the server's wal_sender_timeout. Default one second.
	StatusInterval time.Duration
	// SilenceTimeout is how long Next waits without a single message from the server before
	// it fails (ErrSilent). Every status asks the server for a reply, so a server that says
	// nothing for that long while the stream reads is gone or cut off by the network, where
	// nothing resets the connection and the kernel would retransmit for a quarter of an
	// hour. Default 10s ([DefaultSilenceTimeout]); at least three StatusIntervals.
	SilenceTimeout time.Duration
	// Start is where the stream starts when it is past the slot's confirmed position: commits
	// that end at or before it are not streamed again (a reader that knows more than the
	// slot does, having confirmed what the server had not yet heard of). 0: the slot's.
	Start pglogrepl.LSN
	// Created, when set, is called once Open has created the slot, before the stream starts,
	// with the name of a snapshot that sees exactly the transactions committed before the
	// slot's first streamed commit (SET TRANSACTION SNAPSHOT, in a REPEATABLE READ
	// transaction of another connection). If it fails, Open drops the slot again and fails:
	// the next Open creates it again and calls Created again.
	Created func(ctx context.Context, snapshot string) error
}

// DefaultSilenceTimeout is Config.SilenceTimeout's default; DefaultConnectTimeout bounds each
// connection attempt when the URL sets no connect_timeout.
const (
	DefaultSilenceTimeout = 10 * time.Second
	DefaultConnectTimeout = 10 * time.Second
)

// ErrSilent is wrapped by Next's error when the server sent nothing for SilenceTimeout.
var ErrSilent = errors.New("walstream: the server sent nothing, not even an answer to a status")

// Stream reads a slot. It is not safe for concurrent use.
type Stream struct {
	cfg        Config
	conn       *pgconn.PgConn
	relations  map[uint32]*pglogrepl.RelationMessage
	lastStatus time.Time
	// lastHeard is when the server's last message arrived.
	lastHeard time.Time
	// confirmed is what the stream reports to the server; Confirm and Advance raise it.
	confirmed atomic.Uint64
	// reported is the position the server was last told; lastEnd the end of the last commit
	// Next returned.
	reported, lastEnd pglogrepl.LSN
	// serverStarted is the server's start time (pg_postmaster_start_time), in microseconds
	// since the Unix epoch.
	serverStarted int64
	// failed is set once the connection or the server failed Next or Status (not their
	// context's end, nor the stream's own decoding): the server may be gone or silent, or
	// have ended the replication, and Close does not wait for its answer.
	failed bool
}

// serverStartedSQL reads the server's start time, which tells one server from another (a
// failover's new primary from the old one), in microseconds since the Unix epoch: a
// replication connection answers simple queries only, in text.
const serverStartedSQL = `SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint`

// PID is the process id of the stream's walsender on the server: pg_replication_slots'
// active_pid while the stream holds the slot.
func (s *Stream) PID() uint32 { return s.conn.PID() }

// ServerStarted is the start time of the server the stream reads (pg_postmaster_start_time),
// which tells one server from another.
func (s *Stream) ServerStarted() time.Time { return time.UnixMicro(s.serverStarted) }

// Open connects to the database in replication mode, creates the slot if it does not exist,
// and starts streaming the publication from the slot's confirmed position.
func Open(ctx context.Context, cfg Config) (*Stream, error) {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.SilenceTimeout <= 0 {
		cfg.SilenceTimeout = DefaultSilenceTimeout
	}
	cfg.SilenceTimeout = max(cfg.SilenceTimeout, 3*cfg.StatusInterval)
	pgcfg, err := parseConfig(cfg)
	if err != nil {
		return nil, err
	}
	// The columns come as text, written by the walsender with its session's settings:
	// timestamps in UTC and ISO, whatever the server's defaults.
	pgcfg.RuntimeParams["TimeZone"] = "UTC"
	pgcfg.RuntimeParams["DateStyle"] = "ISO, YMD"
	conn, err := pgconn.ConnectConfig(ctx, pgcfg)
	if err != nil {
		return nil, fmt.Errorf("walstream: connect for replication: %w", err)
	}
	s := &Stream{cfg: cfg, conn: conn, relations: map[uint32]*pglogrepl.RelationMessage{}}
	s.confirmed.Store(uint64(cfg.Start))
	if s.serverStarted, err = readServerStarted(ctx, conn); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	action := "NOEXPORT_SNAPSHOT"
	if cfg.Created != nil {
		action = "EXPORT_SNAPSHOT"
	}
	created, err := pglogrepl.CreateReplicationSlot(ctx, conn, cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{SnapshotAction: action})
	switch {
	case err == nil:
		if cfg.Created != nil {
			// The snapshot lives until the next command on this connection.
			if err := cfg.Created(ctx, created.SnapshotName); err != nil {
				// Also when ctx is what ended Created: a slot whose hand-over failed must go.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				derr := pglogrepl.DropReplicationSlot(dctx, conn, cfg.Slot, pglogrepl.DropReplicationSlotOptions{})
				_ = conn.Close(dctx)
				return nil, errors.Join(fmt.Errorf("walstream: slot %s created: %w", cfg.Slot, err), derr)
			}
		}
	case isCode(err, "42710"): // duplicate_object: it exists
	default:
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("walstream: create slot %s: %w", cfg.Slot, err)
	}
	// The server starts at the slot's confirmed_flush_lsn, or at Start if that is later.
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, cfg.Start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(cfg.Publication)},
	})
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("walstream: start streaming slot %s: %w", cfg.Slot, err)
	}
	return s, nil
}

// readServerStarted runs serverStartedSQL on conn.
func readServerStarted(ctx context.Context, conn *pgconn.PgConn) (int64, error) {
	res, err := conn.Exec(ctx, serverStartedSQL).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("walstream: read the server's start time: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errors.New("walstream: read the server's start time: not one value")
	}
	v, err := strconv.ParseInt(string(res[0].Rows[0][0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("walstream: read the server's start time: %w", err)
	}
	return v, nil
}

// parseConfig is the replication connection's configuration: cfg.URL's, in replication mode,
// with cfg.TLSConfig for every host when it is set. Each host gets a clone of it with the
// host as its ServerName unless one is set, and a URL's attempt without TLS (sslmode=prefer
// or allow tries one) is dropped: given a TLS configuration, the connection uses it.
func parseConfig(cfg Config) (*pgconn.Config, error) {
	pgcfg, err := pgconn.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("walstream: parse the database URL: %w", err)
	}
	pgcfg.RuntimeParams["replication"] = "database"
	if pgcfg.ConnectTimeout == 0 {
		// A host cut off by the network answers nothing, not even a refusal: without a bound
		// each attempt waits out the kernel's SYN retries (two minutes) before the next host
		// of the URL is tried.
		pgcfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.TLSConfig == nil {
		return pgcfg, nil
	}
	// The attempts, one or two per host (pgconn.ParseConfig): the first is the config's
	// own, the others its fallbacks. Of a host with an attempt with TLS and one without, the
	// one without goes; a host with none with TLS (sslmode=disable) gets TLS.
	all := append([]*pgconn.FallbackConfig{{Host: pgcfg.Host, Port: pgcfg.Port, TLSConfig: pgcfg.TLSConfig}}, pgcfg.Fallbacks...)
	kept := make([]*pgconn.FallbackConfig, 0, len(all))
	for _, a := range all {
		if network, _ := pgconn.NetworkAddress(a.Host, a.Port); network == "unix" {
			// A socket is local: pgconn never speaks TLS over one, nor do servers.
			kept = append(kept, a)
			continue
		}
		if a.TLSConfig == nil && slices.ContainsFunc(all, func(b *pgconn.FallbackConfig) bool {
			return b.TLSConfig != nil && b.Host == a.Host && b.Port == a.Port
		}) {
			continue
		}
		c := cfg.TLSConfig.Clone()
		if c.ServerName == "" {
			c.ServerName = a.Host
		}
		if pgcfg.SSLNegotiation == "direct" && len(c.NextProtos) == 0 {
			// What pgconn sets in the configs it builds: a server refuses direct TLS
			// without it.
			c.NextProtos = []string{"postgresql"}
		}
		kept = append(kept, &pgconn.FallbackConfig{Host: a.Host, Port: a.Port, TLSConfig: c})
	}
	pgcfg.Host, pgcfg.Port, pgcfg.TLSConfig = kept[0].Host, kept[0].Port, kept[0].TLSConfig
	pgcfg.Fallbacks = kept[1:]
	return pgcfg, nil
}

// Drop drops the slot named in cfg, through a replication connection of cfg.URL.
func Drop(ctx context.Context, cfg Config) error {
	pgcfg, err := parseConfig(cfg)
	if err != nil {
		return err
	}
	conn, err := pgconn.ConnectConfig(ctx, pgcfg)
	if err != nil {
		return fmt.Errorf("walstream: connect for replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // after the command
	if err := pglogrepl.DropReplicationSlot(ctx, conn, cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
		return fmt.Errorf("walstream: drop slot %s: %w", cfg.Slot, err)
	}
	return nil
}

// isCode reports whether err is a PostgreSQL error of the given SQLSTATE.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Close tells the server the confirmed position, if it has not heard it yet, ends the
// replication and closes the connection. The replication is ended as the protocol ends it
// (CopyDone, then what the server still sends is read until it is ready for a query), not
// only closed: a socket closed while the server's data waits unread in it is reset, and a
// reset can reach the server before it read the status sent just before, which it then
// never reads (a restart streamed again what had been confirmed). Once the server answered,
// it has read the status, and the slot is free at once.
//
// It takes at most ctx's time, and at most SilenceTimeout: past either, the connection is
// closed as it is. The server answers at once, unless it is sending a transaction of the
// publication: it sends the rest of that first, which for a transaction of hundreds of
// thousands of rows takes seconds. A stream that failed (a server gone, silent, or that
// ended the replication with an error) is told the position, if it can be, and closed at
// once: its answer may never come.
func (s *Stream) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.SilenceTimeout)
	defer cancel()
	if d, ok := ctx.Deadline(); ok && !s.conn.IsClosed() {
		// The writes below are not bounded by ctx otherwise (a server that stopped reading).
		_ = s.conn.Conn().SetWriteDeadline(d)
	}
	var err error
	switch {
	case s.conn.IsClosed():
		// A connection that failed is closing already, in pgconn's background: nothing more
		// can be sent on it.
	case s.failed:
		if s.Confirmed() > s.reported {
			if err = s.status(ctx); err != nil {
				err = fmt.Errorf("walstream: send status: %w", err)
			}
		}
	default:
		err = s.end(ctx)
	}
	return errors.Join(err, s.conn.Close(ctx))
}

// end sends the last status and ends the replication: it returns once the server answered
// the end, which it reads after the status.
func (s *Stream) end(ctx context.Context) error {
	if s.Confirmed() > s.reported {
		if err := s.status(ctx); err != nil {
			return fmt.Errorf("walstream: send status: %w", err)
		}
	}
	s.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := s.conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("walstream: end the replication: %w", err)
	}
	var refused error
	for {
		msg, err := s.conn.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("walstream: end the replication: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			refused = fmt.Errorf("walstream: end the replication: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.ReadyForQuery:
			return refused
		}
	}
}

// Confirm tells the server that everything up to lsn is done: the slot may drop the WAL
// before it, and a restart streams from there.
func (s *Stream) Confirm(ctx context.Context, lsn pglogrepl.LSN) error {
	s.Advance(lsn)
	return s.status(ctx)
}

// Advance raises the confirmed position to lsn, as Confirm does, but tells the server only
// with the stream's next status (in Next, at once if it is receiving, or in Close). Unlike
// every other method, it may be called from any goroutine.
func (s *Stream) Advance(lsn pglogrepl.LSN) {
	for {
		cur := s.confirmed.Load()
		if uint64(lsn) <= cur || s.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Confirmed is the confirmed position.
func (s *Stream) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(s.confirmed.Load()) }

// Status tells the server the confirmed position now.
func (s *Stream) Status(ctx context.Context) error {
	err := s.status(ctx)
	s.fail(ctx, err)
	return err
}

// fail records that the stream failed, when err is not ctx's end.
func (s *Stream) fail(ctx context.Context, err error) {
	if err != nil && ctx.Err() == nil {
		s.failed = true
	}
}

func (s *Stream) status(ctx context.Context) error {
	if s.conn.IsClosed() {
		return errors.New("walstream: send status: the connection is closed")
	}
	s.lastStatus = time.Now()
	lsn := s.Confirmed()
	// The reply (a keepalive) is how Next tells a quiet server from a silent one.
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ReplyRequested: true,
	}); err != nil {
		return err
	}
	s.reported = lsn
	return nil
}

// Next returns the next committed transaction that inserted outbox rows. Transactions that
// inserted none are skipped (pgoutput sends their BEGIN and COMMIT).
func (s *Stream) Next(ctx context.Context) (Commit, error) {
	// broke returns an error of the connection or the server: the stream has failed (see
	// Close). An error of the stream's own decoding leaves the server as it was.
	broke := func(err error) (Commit, error) {
		s.fail(ctx, err)
		return Commit{}, err
	}
	var cur *Commit
	// What the server said before this call is no answer to it: the caller may have been
	// away (publishing) for longer than SilenceTimeout.
	waiting := time.Now()
	for {
		if time.Since(s.lastStatus) > s.cfg.StatusInterval || s.Confirmed() > s.reported {
			if err := s.status(ctx); err != nil {
				return broke(fmt.Errorf("walstream: send status: %w", err))
			}
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.StatusInterval)
		raw, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				if silent := time.Since(later(waiting, s.lastHeard)); silent > s.cfg.SilenceTimeout {
					return broke(fmt.Errorf("%w for %s: gone, or cut off by the network", ErrSilent, silent.Round(time.Millisecond)))
				}
				continue
			}
			return broke(fmt.Errorf("walstream: receive: %w", err))
		}
		s.lastHeard = time.Now()
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return broke(fmt.Errorf("walstream: %w", pgconn.ErrorResponseToPgError(msg)))
		case *pgproto3.CopyData:
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return Commit{}, fmt.Errorf("walstream: keepalive: %w", err)
				}
				// Past the end of the last commit returned, and between transactions: every
				// commit up to the server's position is in hand, so once those are confirmed,
				// that position is too. Without this, a quiet outbox in a busy database would
				// keep all the WAL written since its last row.
				if cur == nil && s.Confirmed() >= s.lastEnd {
					s.Advance(ka.ServerWALEnd)
				}
				if ka.ReplyRequested {
					if err := s.status(ctx); err != nil {
						return broke(fmt.Errorf("walstream: send status: %w", err))
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return Commit{}, fmt.Errorf("walstream: xlog data: %w", err)
				}
				done, err := s.apply(xld.WALData, &cur)
				if err != nil {
					return Commit{}, err
				}
				if done != nil {
					s.lastEnd = done.End
					return *done, nil
				}
			}
		}
	}
}

// apply decodes one pgoutput message into cur; it returns the transaction at its COMMIT if
// it inserted outbox rows.
func (s *Stream) apply(data []byte, cur **Commit) (*Commit, error) {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("walstream: decode: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		s.relations[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		*cur = &Commit{Xid: m.Xid}
	case *pglogrepl.InsertMessage:
		rel, ok := s.relations[m.RelationID]
		if !ok {
			return nil, fmt.Errorf("walstream: insert into unknown relation %d", m.RelationID)
		}
		if *cur == nil || rel.RelationName != s.cfg.Table || (s.cfg.Schema != "" && rel.Namespace != s.cfg.Schema) {
			return nil, nil
		}
		msg, seq, err := decodeRow(rel, m.Tuple)
		if err != nil {
			if msg.ID == uuid.Nil {
				return nil, err // not even its id: not an outbox table after all
			}
			if (*cur).Unreadable == nil {
				(*cur).Unreadable = map[int]error{}
			}
			(*cur).Unreadable[len((*cur).Messages)] = err
		}
		(*cur).Messages = append((*cur).Messages, msg)
		(*cur).Seqs = append((*cur).Seqs, seq)
	case *pglogrepl.CommitMessage:
		c := *cur
		*cur = nil
		if c != nil && len(c.Messages) > 0 {
			c.End, c.Time = m.TransactionEndLSN, m.CommitTime
			return c, nil
		}
	}
	return nil, nil
}

// decodeRow reads an outbox row from its text columns. When a column does not decode, it
// returns the error with what it read of the others.
func decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (Row, int64, error) {
	var (
		m    Row
		seq  int64
		errs []error
	)
	for i, col := range tuple.Columns {
		if col.DataType != pglogrepl.TupleDataTypeText {
			continue // NULL, or unchanged TOAST (never in an INSERT)
		}
		v := string(col.Data)
		var err error
		switch rel.Columns[i].Name {
		case "id":
			m.ID, err = uuid.Parse(v)
		case "seq":
			seq, err = strconv.ParseInt(v, 10, 64)
		case "exchange":
			m.Exchange = v
		case "routing_key":
			m.RoutingKey = v
		case "type":
			m.Type = v
		case "aggregate_type":
			m.AggregateType = v
		case "aggregate_id":
			m.AggregateID = v
		case "payload":
			m.Payload = json.RawMessage(v)
		case "headers":
			if err = json.Unmarshal(col.Data, &m.Headers); err != nil {
				m.Headers = nil
				err = fmt.Errorf("headers are not a JSON object of strings: %w", err)
			}
		case "created_at":
			m.CreatedAt, err = time.Parse("2006-01-02 15:04:05.999999-07", v) // ISO, UTC: Open's settings
		case "attempts":
			m.Attempts, err = strconv.Atoi(v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", rel.Columns[i].Name, err))
		}
	}
	return m, seq, errors.Join(errs...)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Package walstream reads the outbox table's committed INSERTs from a logical replication
// slot (pgoutput, PostgreSQL's built-in output plugin), one transaction at a time and in
// commit order, as [outbox.Message] values: the reading half of a relay that tails the
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
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxshop/outboxshop/pkg/outbox"
)

// Commit is one committed transaction's outbox rows, in the order they were inserted, and the
// position to confirm once every one of them is published (or dead): the end of its commit.
type Commit struct {
	End      pglogrepl.LSN
	Messages []outbox.Message
	// Seqs are the rows' seq column, for marking them in the table.
	Seqs []int64
}

// Config says what to read.
type Config struct {
	// URL is the database's; the stream connects to it in replication mode.
	URL string
	// Slot is the logical replication slot, created (pgoutput) if it does not exist.
	Slot string
	// Publication names the publication that holds the outbox table.
	Publication string
	// Schema and Table name the outbox table; an empty Schema matches the table in any.
	Schema, Table string
	// StatusInterval is how often the stream tells the server its position while it waits,
	// well inside the server's wal_sender_timeout. Default one second.
	StatusInterval time.Duration
}

// Stream reads a slot. It is not safe for concurrent use.
type Stream struct {
	cfg        Config
	conn       *pgconn.PgConn
	relations  map[uint32]*pglogrepl.RelationMessage
	lastStatus time.Time
	confirmed  pglogrepl.LSN
}

// Open connects to the database in replication mode, creates the slot if it does not exist,
// and starts streaming the publication from the slot's confirmed position.
func Open(ctx context.Context, cfg Config) (*Stream, error) {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	pgcfg, err := pgconn.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("walstream: parse the database URL: %w", err)
	}
	pgcfg.RuntimeParams["replication"] = "database"
	// The columns come as text, written by the walsender with its session's settings:
	// timestamps in UTC and ISO, whatever the server's defaults.
	pgcfg.RuntimeParams["TimeZone"] = "UTC"
	pgcfg.RuntimeParams["DateStyle"] = "ISO, YMD"
	conn, err := pgconn.ConnectConfig(ctx, pgcfg)
	if err != nil {
		return nil, fmt.Errorf("walstream: connect for replication: %w", err)
	}
	s := &Stream{cfg: cfg, conn: conn, relations: map[uint32]*pglogrepl.RelationMessage{}}
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42710" { // duplicate_object: it exists
			_ = conn.Close(ctx)
			return nil, fmt.Errorf("walstream: create slot %s: %w", cfg.Slot, err)
		}
	}
	// From 0: the server starts at the slot's confirmed_flush_lsn.
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(cfg.Publication)},
	})
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("walstream: start streaming slot %s: %w", cfg.Slot, err)
	}
	return s, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Close ends the stream.
func (s *Stream) Close(ctx context.Context) error { return s.conn.Close(ctx) }

// Confirm tells the server that everything up to lsn is done: the slot may drop the WAL
// before it, and a restart streams from there.
func (s *Stream) Confirm(ctx context.Context, lsn pglogrepl.LSN) error {
	if lsn > s.confirmed {
		s.confirmed = lsn
	}
	return s.status(ctx)
}

func (s *Stream) status(ctx context.Context) error {
	s.lastStatus = time.Now()
	return pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, WALFlushPosition: s.confirmed, WALApplyPosition: s.confirmed,
	})
}

// Next returns the next committed transaction that inserted outbox rows. Transactions that
// inserted none are skipped (pgoutput sends their BEGIN and COMMIT).
func (s *Stream) Next(ctx context.Context) (Commit, error) {
	var cur *Commit
	for {
		if time.Since(s.lastStatus) > s.cfg.StatusInterval {
			if err := s.status(ctx); err != nil {
				return Commit{}, fmt.Errorf("walstream: send status: %w", err)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.StatusInterval)
		raw, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return Commit{}, fmt.Errorf("walstream: receive: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return Commit{}, fmt.Errorf("walstream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return Commit{}, fmt.Errorf("walstream: keepalive: %w", err)
				}
				if ka.ReplyRequested {
					if err := s.status(ctx); err != nil {
						return Commit{}, fmt.Errorf("walstream: send status: %w", err)
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
		*cur = &Commit{}
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
			return nil, err
		}
		(*cur).Messages = append((*cur).Messages, msg)
		(*cur).Seqs = append((*cur).Seqs, seq)
	case *pglogrepl.CommitMessage:
		c := *cur
		*cur = nil
		if c != nil && len(c.Messages) > 0 {
			c.End = m.TransactionEndLSN
			return c, nil
		}
	}
	return nil, nil
}

// decodeRow reads an outbox row from its text columns.
func decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (outbox.Message, int64, error) {
	var (
		m   outbox.Message
		seq int64
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
			err = json.Unmarshal(col.Data, &m.Headers)
		case "created_at":
			m.CreatedAt, err = time.Parse("2006-01-02 15:04:05.999999-07", v) // ISO, UTC: Open's settings
		case "attempts":
			m.Attempts, err = strconv.Atoi(v)
		}
		if err != nil {
			return outbox.Message{}, 0, fmt.Errorf("walstream: column %s: %w", rel.Columns[i].Name, err)
		}
	}
	return m, seq, nil
}

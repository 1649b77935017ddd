package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
	"github.com/outboxshop/outboxshop/pkg/inbox/internal/testinfra"
)

func TestClassifySQLState(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]inbox.Class{
		// The message's fault (or the handler's): counted.
		"22001": inbox.ClassFailed, // string_data_right_truncation
		"22021": inbox.ClassFailed, // character_not_in_repertoire (a NUL byte, invalid UTF-8)
		"22P02": inbox.ClassFailed, // invalid_text_representation
		"22003": inbox.ClassFailed, // numeric_value_out_of_range
		"23505": inbox.ClassFailed, // unique_violation
		"23503": inbox.ClassFailed, // foreign_key_violation
		"23514": inbox.ClassFailed, // check_violation
		"42601": inbox.ClassFailed, // syntax_error
		"42501": inbox.ClassFailed, // insufficient_privilege
		"42P01": inbox.ClassFailed, // undefined_table
		"P0001": inbox.ClassFailed, // raise_exception
		"XX000": inbox.ClassFailed, // internal_error
		"0A000": inbox.ClassFailed, // feature_not_supported
		"55000": inbox.ClassFailed, // object_not_in_prerequisite_state
		"25P02": inbox.ClassFailed, // in_failed_sql_transaction
		// The infrastructure's, or a lost race: transient.
		"08000": inbox.ClassTransient, // connection_exception
		"08003": inbox.ClassTransient, // connection_does_not_exist
		"08006": inbox.ClassTransient, // connection_failure
		"08P01": inbox.ClassTransient, // protocol_violation
		"40001": inbox.ClassTransient, // serialization_failure
		"40P01": inbox.ClassTransient, // deadlock_detected
		"40003": inbox.ClassTransient, // statement_completion_unknown
		"40002": inbox.ClassFailed,    // transaction_integrity_constraint_violation: the data
		"53000": inbox.ClassTransient, // insufficient_resources
		"53100": inbox.ClassTransient, // disk_full
		"53200": inbox.ClassTransient, // out_of_memory
		"53300": inbox.ClassTransient, // too_many_connections
		"55P03": inbox.ClassTransient, // lock_not_available
		"55006": inbox.ClassTransient, // object_in_use
		"57014": inbox.ClassTransient, // query_canceled (statement_timeout)
		"57P01": inbox.ClassTransient, // admin_shutdown
		"57P02": inbox.ClassTransient, // crash_shutdown
		"57P03": inbox.ClassTransient, // cannot_connect_now
		"58030": inbox.ClassTransient, // io_error
		"25006": inbox.ClassTransient, // read_only_sql_transaction (a standby)
		"25P03": inbox.ClassTransient, // idle_in_transaction_session_timeout
		// Not a SQLSTATE.
		"":       inbox.ClassFailed,
		"08":     inbox.ClassFailed,
		"400010": inbox.ClassFailed,
	} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, want, inbox.ClassifySQLState(code))
			// Through Classify, wrapped as a handler would return it.
			err := fmt.Errorf("reserve stock: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"})
			require.Equal(t, want, inbox.Classify(err))
			require.Equal(t, want == inbox.ClassTransient, inbox.IsTransient(err))
			require.False(t, inbox.IsPermanent(err))
		})
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	pgErr := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"} }
	base := errors.New("unknown sku")

	// A real connect error: nothing listens on the port of a listener just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, connectErr := pgconn.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
	require.Error(t, connectErr)

	// A reachable server that refuses the connection (here: no such database) is a connect
	// error as well, with the server's error inside: the operator fixes it, not the message.
	u, err := url.Parse(testinfra.PostgresURL(t))
	require.NoError(t, err)
	u.Path = "/no_such_database_" + strings.ReplaceAll(t.Name(), "/", "_")
	_, refusedErr := pgconn.Connect(ctx, u.String())
	var refusedPgErr *pgconn.PgError
	require.ErrorAs(t, refusedErr, &refusedPgErr)
	require.Equal(t, "3D000", refusedPgErr.Code)

	deadline, cancelDeadline := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelDeadline()

	for name, tc := range map[string]struct {
		err  error
		want inbox.Class
	}{
		"Nil":                      {nil, inbox.ClassFailed},
		"Plain":                    {errors.New("warehouse says no"), inbox.ClassFailed},
		"Permanent":                {inbox.Permanent(base), inbox.ClassPermanent},
		"WrappedPermanent":         {fmt.Errorf("reserve: %w", inbox.Permanent(base)), inbox.ClassPermanent},
		"Transient":                {inbox.Transient(base), inbox.ClassTransient},
		"WrappedTransient":         {fmt.Errorf("call stock service: %w", inbox.Transient(base)), inbox.ClassTransient},
		"PermanentOutermostWins":   {inbox.Permanent(inbox.Transient(base)), inbox.ClassPermanent},
		"TransientOutermostWins":   {inbox.Transient(inbox.Permanent(base)), inbox.ClassTransient},
		"MarkBeatsSQLState":        {inbox.Permanent(pgErr("40P01")), inbox.ClassPermanent},
		"TransientMarkOnDataError": {inbox.Transient(pgErr("23503")), inbox.ClassTransient},
		"ConnectError":             {connectErr, inbox.ClassTransient},
		"WrappedConnectError":      {fmt.Errorf("inbox: begin: %w", connectErr), inbox.ClassTransient},
		"ConnectErrorWithPgError":  {refusedErr, inbox.ClassTransient},
		"ClosedPool":               {fmt.Errorf("acquire: %w", puddle.ErrClosedPool), inbox.ClassTransient},
		"EOF":                      {fmt.Errorf("receive message failed: %w", io.EOF), inbox.ClassTransient},
		"UnexpectedEOF":            {io.ErrUnexpectedEOF, inbox.ClassTransient},
		"ConnClosed":               {pgconn.ErrConnClosed, inbox.ClassTransient},
		"DeadlineExceeded":         {context.DeadlineExceeded, inbox.ClassTransient},
		"DeadlineOfTheDBCall":      {fmt.Errorf("query: %w", deadline.Err()), inbox.ClassTransient},
		"Canceled":                 {fmt.Errorf("query: %w", context.Canceled), inbox.ClassFailed},
		"NetOpError":               {&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, inbox.ClassTransient},
		"DNSError":                 {&net.DNSError{Err: "no such host", Name: "db"}, inbox.ClassTransient},
		"ConnRefused":              {fmt.Errorf("dial: %w", syscall.ECONNREFUSED), inbox.ClassTransient},
		"BrokenPipe":               {syscall.EPIPE, inbox.ClassTransient},
		"MissingFileIsNotNetwork":  {&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, inbox.ClassFailed},
		"OSTimeout":                {os.ErrDeadlineExceeded, inbox.ClassTransient},
		"TxClosed":                 {pgx.ErrTxClosed, inbox.ClassFailed},
		"NoRows":                   {pgx.ErrNoRows, inbox.ClassFailed},
		"JoinedTakesFirstMark":     {errors.Join(base, inbox.Transient(base)), inbox.ClassTransient},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, inbox.Classify(tc.err), "%v", tc.err)
			require.Equal(t, tc.want == inbox.ClassTransient, inbox.IsTransient(tc.err))
			require.Equal(t, tc.want == inbox.ClassPermanent, inbox.IsPermanent(tc.err))
		})
	}

	t.Run("MarksKeepTheErrorChain", func(t *testing.T) {
		t.Parallel()
		err := fmt.Errorf("x: %w", inbox.Transient(pgErr("40001")))
		var got *pgconn.PgError
		require.ErrorAs(t, err, &got)
		require.Equal(t, "40001", got.Code)
		require.Equal(t, "x: ERROR: x (SQLSTATE 40001)", err.Error())
		require.NoError(t, inbox.Transient(nil))
		require.NoError(t, inbox.Permanent(nil))
		require.False(t, inbox.IsTransient(nil))
		require.False(t, inbox.IsPermanent(nil))
	})

	t.Run("String", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "failed", inbox.ClassFailed.String())
		require.Equal(t, "transient", inbox.ClassTransient.String())
		require.Equal(t, "permanent", inbox.ClassPermanent.String())
	})
}

func TestMessageValidate(t *testing.T) {
	t.Parallel()
	long := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a'
		}
		return string(b)
	}
	for name, tc := range map[string]struct {
		msg  inbox.Message
		want error // nil: valid
	}{
		"Valid":             {inbox.Message{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Type: "OrderCreated"}, nil},
		"EmptyType":         {inbox.Message{ID: "m-1"}, nil},
		"Unicode":           {inbox.Message{ID: "bestellung-ü-😀", Type: "Größe"}, nil},
		"IDAtLimit":         {inbox.Message{ID: long(inbox.MaxMessageIDBytes)}, nil},
		"TypeAtLimit":       {inbox.Message{ID: "m", Type: long(inbox.MaxMessageTypeBytes)}, nil},
		"ControlCharsStore": {inbox.Message{ID: "m\t1\n", Type: "a\x1b"}, nil},
		"EmptyID":           {inbox.Message{Type: "OrderCreated"}, inbox.ErrNoMessageID},
		"NULInID":           {inbox.Message{ID: "m\x001"}, inbox.ErrInvalidMessageID},
		"InvalidUTF8InID":   {inbox.Message{ID: "k\xff\xfe"}, inbox.ErrInvalidMessageID},
		"LoneSurrogateID":   {inbox.Message{ID: "m\xed\xa0\x80"}, inbox.ErrInvalidMessageID},
		"IDTooLong":         {inbox.Message{ID: long(inbox.MaxMessageIDBytes + 1)}, inbox.ErrInvalidMessageID},
		"NULInType":         {inbox.Message{ID: "m", Type: "Order\x00Created"}, inbox.ErrInvalidMessageType},
		"InvalidUTF8Type":   {inbox.Message{ID: "m", Type: "\xc3("}, inbox.ErrInvalidMessageType},
		"TypeTooLong":       {inbox.Message{ID: "m", Type: long(inbox.MaxMessageTypeBytes + 1)}, inbox.ErrInvalidMessageType},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.msg.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			require.True(t, inbox.IsPermanent(err), "no retry can store it")
			require.True(t, utf8.ValidString(err.Error()), "the error repeats the invalid value: %q", err)
		})
	}

	t.Run("Consumer", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, inbox.ValidateConsumer("billing"))
		require.ErrorIs(t, inbox.ValidateConsumer(""), inbox.ErrNoConsumer)
		require.ErrorIs(t, inbox.ValidateConsumer("bill\x00ing"), inbox.ErrInvalidConsumer)
		require.ErrorIs(t, inbox.ValidateConsumer("\xff"), inbox.ErrInvalidConsumer)
		require.ErrorIs(t, inbox.ValidateConsumer(long(inbox.MaxConsumerBytes+1)), inbox.ErrInvalidConsumer)
	})
}

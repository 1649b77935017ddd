package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// uuidArrayStatement is a statement of one uuid[] parameter, as the marks and Add bind it.
var uuidArrayStatement = &pgconn.StatementDescription{ParamOIDs: []uint32{pgtype.UUIDArrayOID}}

func newIDs(n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	return ids
}

// TestIDParameter: ids bound as pgUUID go to the server in binary, the form pgx picks for a
// uuid[] parameter, on the first try.
func TestIDParameter(t *testing.T) {
	ids := newIDs(3)
	arr := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		arr[i] = pgUUID(id)
	}
	var eqb pgx.ExtendedQueryBuilder
	require.NoError(t, eqb.Build(pgtype.NewMap(), uuidArrayStatement, []any{arr}))
	require.Equal(t, []int16{pgx.BinaryFormatCode}, eqb.ParamFormats)

	// The same ids read back from that binary form.
	var back []pgtype.UUID
	require.NoError(t, pgtype.NewMap().Scan(pgtype.UUIDArrayOID, pgx.BinaryFormatCode, eqb.ParamValues[0], &back))
	require.Len(t, back, len(ids))
	for i := range ids {
		require.Equal(t, ids[i], uuid.UUID(back[i].Bytes))
	}
}

// BenchmarkIDParameter binds a batch's 100 ids to a uuid[] parameter as the relay's marks do
// (pgUUID) and as strings, which pgx tries in binary, fails on and sends as text.
func BenchmarkIDParameter(b *testing.B) {
	ids := newIDs(100)
	m := pgtype.NewMap()
	b.Run("pgUUID", func(b *testing.B) {
		b.ReportAllocs()
		var eqb pgx.ExtendedQueryBuilder
		for b.Loop() {
			arr := make([]pgtype.UUID, 0, len(ids))
			for _, id := range ids {
				arr = append(arr, pgUUID(id))
			}
			if err := eqb.Build(m, uuidArrayStatement, []any{arr}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strings", func(b *testing.B) {
		b.ReportAllocs()
		var eqb pgx.ExtendedQueryBuilder
		for b.Loop() {
			strs := make([]string, 0, len(ids))
			for _, id := range ids {
				strs = append(strs, id.String())
			}
			if err := eqb.Build(m, uuidArrayStatement, []any{strs}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

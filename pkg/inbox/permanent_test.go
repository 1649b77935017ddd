package inbox_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// uncomparableError cannot be compared with ==: errors.Is must not panic on marks wrapping it.
type uncomparableError struct{ parts []string }

func (e uncomparableError) Error() string { return fmt.Sprint(e.parts) }

// TestPermanent pins the shape of the permanent mark, which pkg/outbox and pkg/inbox share
// (the same test runs in both): a pointer, no prefix on the message, and IsPermanent true
// when the outermost mark in the chain is Permanent.
func TestPermanent(t *testing.T) {
	t.Parallel()
	cause := errors.New("unknown schema version 7")
	require.NoError(t, inbox.Permanent(nil))
	require.False(t, inbox.IsPermanent(nil))
	require.False(t, inbox.IsPermanent(cause))

	p := inbox.Permanent(cause)
	require.True(t, inbox.IsPermanent(p))
	require.Equal(t, cause.Error(), p.Error(), "the mark adds no text")
	require.ErrorIs(t, p, cause)
	require.True(t, inbox.IsPermanent(fmt.Errorf("apply order 42: %w", p)), "wrapped")
	require.True(t, inbox.IsPermanent(errors.Join(errors.New("other"), p)), "joined")
	require.NotErrorIs(t, inbox.Permanent(cause), p, "two marks are two errors")

	odd := uncomparableError{parts: []string{"a", "b"}}
	require.NotPanics(t, func() { _ = errors.Is(inbox.Permanent(odd), inbox.Permanent(odd)) })
}

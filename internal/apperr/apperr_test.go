package apperr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/input"
)

func TestError(t *testing.T) {
	t.Parallel()
	cause := errors.New("connection refused")
	err := fmt.Errorf("load: %w", apperr.Wrap(apperr.CodeUnavailable, cause, "Try again."))
	require.Equal(t, apperr.CodeUnavailable, apperr.ErrorCode(err))
	require.Equal(t, "Try again.", apperr.ErrorMessage(err))
	require.ErrorIs(t, err, cause)
	require.Equal(t, "load: unavailable: Try again.: connection refused", err.Error())

	plain := errors.New("secret")
	require.Equal(t, apperr.CodeInternal, apperr.ErrorCode(plain))
	require.Equal(t, apperr.InternalMessage, apperr.ErrorMessage(plain))
	require.Nil(t, apperr.ErrorFields(plain))
	require.Equal(t, apperr.Code(""), apperr.ErrorCode(nil))
}

func TestFromInput(t *testing.T) {
	t.Parallel()
	for kind, code := range map[input.Kind]apperr.Code{
		input.Malformed:            apperr.CodeInvalid,
		input.Invalid:              apperr.CodeValidation,
		input.TooLarge:             apperr.CodeTooLarge,
		input.UnsupportedMediaType: apperr.CodeUnsupportedMediaType,
		input.BadHeader:            apperr.CodeBadHeader,
	} {
		err := apperr.FromInput(&input.Error{Kind: kind, Message: "No.", Fields: []input.FieldError{{Field: "f", Message: "m"}}})
		require.Equal(t, code, apperr.ErrorCode(err), kind.String())
		require.Equal(t, "No.", apperr.ErrorMessage(err))
		require.Equal(t, []apperr.FieldError{{Field: "f", Message: "m"}}, apperr.ErrorFields(err))
	}
	other := errors.New("other")
	require.Equal(t, other, apperr.FromInput(other))
}

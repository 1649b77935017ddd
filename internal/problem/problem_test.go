package problem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxshop/outboxshop/internal/apperr"
	"github.com/outboxshop/outboxshop/internal/problem"
)

func TestTable(t *testing.T) {
	t.Parallel()
	const codeOwn apperr.Code = "own"
	table := problem.Shared().With(problem.Table{
		codeOwn:               {Status: http.StatusTeapot, Type: problem.TypePrefix + "own", Title: "Own"},
		apperr.CodeValidation: {Status: http.StatusUnprocessableEntity, Type: problem.TypeValidation, Title: "Retitled"},
	})
	require.Equal(t, http.StatusTeapot, table.Status(codeOwn))
	require.Equal(t, "Retitled", table.Kind(apperr.CodeValidation).Title)
	require.Equal(t, "The request has invalid fields", problem.Shared().Kind(apperr.CodeValidation).Title, "With copies")
	require.Equal(t, http.StatusServiceUnavailable, table.Status(apperr.CodeUnavailable))
	require.Equal(t, problem.Internal, table.Kind("nobody's"))

	d := table.Details(&apperr.Error{Code: apperr.CodeValidation, Message: "See errors.",
		Fields: []apperr.FieldError{{Field: "f", Message: "m"}}})
	require.Equal(t, problem.Details{Type: problem.TypeValidation, Title: "Retitled", Status: 422, Detail: "See errors.",
		Errors: []problem.FieldError{{Field: "f", Message: "m"}}}, d)
	d = table.Details(errors.New("secret"))
	require.Equal(t, http.StatusInternalServerError, d.Status)
	require.Equal(t, apperr.InternalMessage, d.Detail)
}

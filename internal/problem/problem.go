// Package problem writes HTTP errors as RFC 9457 problem details (application/problem+json).
package problem

import (
	"encoding/json"
	"net/http"
)

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// Details is a problem document. Type defaults to "about:blank" and Title to the status text.
type Details struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists field-level problems of a request body, when there are any.
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Write answers with d.
func Write(w http.ResponseWriter, r *http.Request, d Details) {
	if d.Type == "" {
		d.Type = "about:blank"
	}
	if d.Title == "" {
		d.Title = http.StatusText(d.Status)
	}
	if d.Instance == "" && r != nil {
		d.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(d.Status)
	_ = json.NewEncoder(w).Encode(d)
}

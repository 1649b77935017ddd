package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/outboxshop/outboxshop/pkg/inbox"
)

// Reasons for dead-lettering, the first word of [HeaderDeadReason] and the reason passed to
// [Hooks].DeadLettered (a short, fixed set: fit for a metric label; [Reasons] lists them).
// Each names what a person must look at; none is used for a message that an outage or a
// lost race made fail.
const (
	// ReasonMissingMessageID: the message has no message-id property, so the inbox cannot
	// deduplicate it.
	ReasonMissingMessageID = "missing-message-id"
	// ReasonInvalidMessageID: the message-id cannot be stored by the inbox: it is not valid
	// UTF-8, contains a NUL byte, or is longer than inbox.MaxMessageIDBytes.
	ReasonInvalidMessageID = "invalid-message-id"
	// ReasonInvalidMessageType: the type property cannot be stored by the inbox, for the same
	// reasons (limit inbox.MaxMessageTypeBytes).
	ReasonInvalidMessageType = "invalid-message-type"
	// ReasonBodyTooLarge: the body is longer than [Config].MaxBodyBytes. It is not parsed.
	ReasonBodyTooLarge = "body-too-large"
	// ReasonUnsupportedContentType: the content type is not one of [Config].ContentTypes,
	// or it is a JSON type with a charset other than UTF-8.
	ReasonUnsupportedContentType = "unsupported-content-type"
	// ReasonUnknownType: the type property is not one of [Config].Types.
	ReasonUnknownType = "unknown-type"
	// ReasonMalformedJSON: the content type is application/json (or empty, or ends in +json)
	// and the body is not valid JSON, or not valid UTF-8.
	ReasonMalformedJSON = "malformed-json"
	// ReasonPermanent: the handler returned an error marked with inbox.Permanent (an
	// unknown schema version, a payload that breaks the contract), or the inbox could not
	// store the message's id or type in this database.
	ReasonPermanent = "permanent-error"
	// ReasonMaxDeliveries: the handler failed on each of [Config].MaxDeliveries attempts
	// with errors that inbox.Classify does not call transient (a constraint violation, a
	// data exception, an error of its own).
	ReasonMaxDeliveries = "max-deliveries"
)

// Reasons returns every dead-letter reason, in the order the consumer checks them.
func Reasons() []string {
	return []string{ReasonMissingMessageID, ReasonInvalidMessageID, ReasonInvalidMessageType, ReasonBodyTooLarge,
		ReasonUnsupportedContentType, ReasonUnknownType, ReasonMalformedJSON, ReasonPermanent, ReasonMaxDeliveries}
}

// maxReasonLen bounds the dead-reason header; error texts can be long.
const maxReasonLen = 4096

// Refusal returns why the consumer built from c dead-letters d before its handler runs (one
// of the Reason* constants, with details), or "" when it would run the handler on d. It
// applies the same defaults as [NewConsumer] (MaxBodyBytes) and needs nothing else of c:
// rabbitmqtest uses it to reach the consumer's outcome without a broker.
func (c Config) Refusal(d Delivery) (reason, detail string) {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	c.ContentTypes = mediaTypes(c.ContentTypes)
	return refusal(c, d)
}

// refusal is [Config.Refusal] for a cfg with its defaults. The checks run in the order of
// [Reasons]; the body is parsed only when it is small enough.
func refusal(cfg Config, d Delivery) (reason, detail string) {
	if d.ID == "" {
		return ReasonMissingMessageID, "the message has no message-id property, so the inbox cannot deduplicate it"
	}
	if err := (inbox.Message{ID: d.ID, Type: d.Type}).Validate(); err != nil {
		if errors.Is(err, inbox.ErrInvalidMessageType) {
			return ReasonInvalidMessageType, err.Error()
		}
		return ReasonInvalidMessageID, err.Error()
	}
	if len(d.Body) > cfg.MaxBodyBytes {
		return ReasonBodyTooLarge, fmt.Sprintf("the body has %d bytes, more than the %d accepted", len(d.Body), cfg.MaxBodyBytes)
	}
	mt := mediaType(d.ContentType)
	if len(cfg.ContentTypes) > 0 && !slices.Contains(cfg.ContentTypes, mt) {
		return ReasonUnsupportedContentType, fmt.Sprintf("content type %q is not one of %q", d.ContentType, cfg.ContentTypes)
	}
	jsonBody := isJSON(mt)
	if jsonBody {
		if cs := charset(d.ContentType); cs != "" && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			return ReasonUnsupportedContentType, fmt.Sprintf("content type %q: JSON must be UTF-8", d.ContentType)
		}
	}
	if len(cfg.Types) > 0 && !slices.Contains(cfg.Types, d.Type) {
		return ReasonUnknownType, fmt.Sprintf("type %q is not one of %q", d.Type, cfg.Types)
	}
	if jsonBody {
		if err := checkJSON(d.Body); err != nil {
			return ReasonMalformedJSON, err.Error()
		}
	}
	return "", ""
}

// isJSON reports whether a body of this content type must be JSON: application/json, any
// +json type, or no content type at all.
func isJSON(contentType string) bool {
	mt := mediaType(contentType)
	return mt == "" || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// mediaType returns the media type of a content type, lower case and without parameters;
// "" for an empty one.
func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt
}

// deadReasonText is the value of a dead letter's HeaderDeadReason: the reason, a colon and
// the details, cut to maxReasonLen bytes of valid UTF-8.
func deadReasonText(reason, detail string) string {
	text := reason + ": " + detail
	if len(text) > maxReasonLen {
		text = strings.ToValidUTF8(text[:maxReasonLen], "")
	}
	return text
}

// mediaTypes returns the media types of contentTypes, in a new slice (empty, not nil, for
// none).
func mediaTypes(contentTypes []string) []string {
	mts := make([]string, 0, len(contentTypes))
	for _, ct := range contentTypes {
		mts = append(mts, mediaType(ct))
	}
	return mts
}

// charset returns the charset parameter of a content type, or "".
func charset(contentType string) string {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return ""
	}
	return params["charset"]
}

// checkJSON returns why body is not valid JSON, or nil. JSON exchanged between systems is
// UTF-8 (RFC 8259): encoding/json would silently turn invalid bytes inside strings into
// U+FFFD, so they are refused here.
func checkJSON(body []byte) error {
	if json.Valid(body) {
		if !utf8.Valid(body) {
			return errors.New("body is not valid UTF-8")
		}
		return nil
	}
	var raw json.RawMessage
	err := json.Unmarshal(body, &raw)
	if err == nil {
		err = errors.New("invalid JSON")
	}
	return fmt.Errorf("body is not valid JSON: %w", err)
}

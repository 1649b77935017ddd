package inboxrabbitmq

import (
	"slices"
	"strings"

	"github.com/outboxshop/outboxshop/pkg/inbox/inboxrabbitmq/internal/decide"
)

// Reasons for dead-lettering, in [HeaderDeadReason] and [DeadLetter].Reason: a fixed set, fit
// for a metric label. Each names what a person must look at; none is used for a message that
// an outage or a lost race made fail.
const (
	// ReasonMissingMessageID: the message has no message-id property, so the inbox cannot
	// deduplicate it.
	ReasonMissingMessageID = "missing-message-id"
	// ReasonInvalidMessageID: the message-id cannot be stored by the inbox: it is not valid
	// UTF-8, contains a NUL byte, or is longer than inbox.MaxMessageIDBytes.
	ReasonInvalidMessageID = "invalid-message-id"
	// ReasonInvalidMessageType: the same for the type property (inbox.MaxMessageTypeBytes).
	ReasonInvalidMessageType = "invalid-message-type"
	// ReasonBodyTooLarge: the body is longer than [Config].MaxMessageBytes. It is not parsed.
	ReasonBodyTooLarge = "body-too-large"
	// ReasonUnsupportedContentType: the content type is not one of [Config].ContentTypes,
	// or it is a JSON type with a charset other than UTF-8.
	ReasonUnsupportedContentType = "unsupported-content-type"
	// ReasonUnknownType: the type property is not one of [Config].Types.
	ReasonUnknownType = "unknown-type"
	// ReasonMalformedJSON: the content type is JSON (application/json, +json, or none) and
	// the body is not valid JSON, or not valid UTF-8.
	ReasonMalformedJSON = "malformed-json"
	// ReasonPermanent: the handler returned an error marked with inbox.Permanent, or this
	// database could not store the message's id or type.
	ReasonPermanent = "permanent-error"
	// ReasonMaxDeliveries: the handler failed on each of [Config].MaxDeliveries attempts
	// with errors that are neither transient nor permanent.
	ReasonMaxDeliveries = "max-deliveries"
)

// reasons are the Reason constants in the order the consumer checks them, indexed by
// decide.Reason (package decide holds the checks inboxrabbitmqtest shares with the consumer).
var reasons = [decide.NumReasons]string{ReasonMissingMessageID, ReasonInvalidMessageID, ReasonInvalidMessageType,
	ReasonBodyTooLarge, ReasonUnsupportedContentType, ReasonUnknownType, ReasonMalformedJSON, ReasonPermanent,
	ReasonMaxDeliveries}

// Reasons returns every dead-letter reason, in the order the consumer checks them.
func Reasons() []string { return slices.Clone(reasons[:]) }

// maxReasonLen bounds the dead-reason header; error texts can be long.
const maxReasonLen = 4096

// refusal returns why the consumer dead-letters d before its handler runs (one of the Reason
// constants, with details), or "" when it runs the handler on d. cfg has its defaults.
func refusal(cfg Config, d Delivery) (reason, detail string) {
	r, detail := decide.Refusal(decide.Message{ID: d.ID, Type: d.Type, ContentType: d.ContentType, Body: d.Body},
		decide.Acceptance{MaxMessageBytes: cfg.MaxMessageBytes, ContentTypes: cfg.ContentTypes, Types: cfg.Types})
	if r == decide.NoReason {
		return "", ""
	}
	return reasons[r], detail
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

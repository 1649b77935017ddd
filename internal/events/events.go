// Package events holds what the events of docs/events.md share, whichever service writes
// them: the schema version, and the header every event body starts with.
package events

import "github.com/google/uuid"

// Version is the schema version of every event both services publish and understand.
const Version = 1

// Header is what every event body carries first: its schema version and the order the saga
// is about. An event struct embeds it, so that its fields stand at the top level of the JSON
// object ({"version": 1, "order_id": "…", …}).
type Header struct {
	Version int64     `json:"version"`
	OrderID uuid.UUID `json:"order_id"`
}

// NewHeader returns the header of an event about orderID, at [Version].
func NewHeader(orderID uuid.UUID) Header { return Header{Version: Version, OrderID: orderID} }
